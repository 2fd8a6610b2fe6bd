//! Sites, tenants, pools and pool hardware profiles: the rows the hub's
//! inventory commands write (`crate::inventory`).

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};

type Tx<'a> = Transaction<'a, Postgres>;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SiteRow {
    pub id: String,
    pub name: String,
    pub inventory_only: bool,
    pub placement_enabled: bool,
    pub backend_vrf_flip_allowed: bool,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TenantRow {
    pub id: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PoolRow {
    pub id: String,
    pub site_id: String,
    pub kind: String,
    pub owner_tenant_id: Option<String>,
    pub gpu_count: Option<i32>,
    pub gpu_model: Option<String>,
    pub created_at: DateTime<Utc>,
}

const SITE_COLUMNS: &str =
    "id, name, inventory_only, placement_enabled, backend_vrf_flip_allowed, created_at";

/// `None`: a site with that id exists.
pub async fn insert_site(
    tx: &mut Tx<'_>,
    id: &str,
    name: &str,
    inventory_only: bool,
    placement_enabled: bool,
    backend_vrf_flip_allowed: bool,
) -> Result<Option<SiteRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO sites (id, name, inventory_only, placement_enabled, backend_vrf_flip_allowed) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING RETURNING {SITE_COLUMNS}"
    ))
    .bind(id)
    .bind(name)
    .bind(inventory_only)
    .bind(placement_enabled)
    .bind(backend_vrf_flip_allowed)
    .fetch_optional(&mut **tx)
    .await
}

/// `None`: no such site. `inventory_only` is never written here.
pub async fn update_site(
    tx: &mut Tx<'_>,
    id: &str,
    name: Option<&str>,
    placement_enabled: Option<bool>,
    backend_vrf_flip_allowed: Option<bool>,
) -> Result<Option<SiteRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE sites SET name = COALESCE($2, name), placement_enabled = COALESCE($3, placement_enabled), \
         backend_vrf_flip_allowed = COALESCE($4, backend_vrf_flip_allowed) \
         WHERE id = $1 RETURNING {SITE_COLUMNS}"
    ))
    .bind(id)
    .bind(name)
    .bind(placement_enabled)
    .bind(backend_vrf_flip_allowed)
    .fetch_optional(&mut **tx)
    .await
}

pub async fn insert_tenant(
    tx: &mut Tx<'_>,
    id: &str,
    name: &str,
) -> Result<Option<TenantRow>, sqlx::Error> {
    sqlx::query_as(
        "INSERT INTO tenants (id, name) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING \
         RETURNING id, name, created_at",
    )
    .bind(id)
    .bind(name)
    .fetch_optional(&mut **tx)
    .await
}

pub async fn update_tenant(
    tx: &mut Tx<'_>,
    id: &str,
    name: &str,
) -> Result<Option<TenantRow>, sqlx::Error> {
    sqlx::query_as("UPDATE tenants SET name = $2 WHERE id = $1 RETURNING id, name, created_at")
        .bind(id)
        .bind(name)
        .fetch_optional(&mut **tx)
        .await
}

const POOL: &str =
    "SELECT p.id, p.site_id, p.kind, p.owner_tenant_id, h.gpu_count, h.gpu_model, p.created_at \
     FROM pools p LEFT JOIN pool_hardware_profiles h ON h.pool_id = p.id WHERE p.id = $1";

pub async fn pool(tx: &mut Tx<'_>, id: &str) -> Result<Option<PoolRow>, sqlx::Error> {
    sqlx::query_as(POOL)
        .bind(id)
        .fetch_optional(&mut **tx)
        .await
}

/// `None`: a pool with that id exists. A missing site or tenant is a
/// foreign-key violation the caller names.
pub async fn insert_pool(
    tx: &mut Tx<'_>,
    id: &str,
    site_id: &str,
    kind: &str,
    owner_tenant_id: Option<&str>,
) -> Result<Option<()>, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO pools (id, site_id, kind, owner_tenant_id) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(id)
    .bind(site_id)
    .bind(kind)
    .bind(owner_tenant_id)
    .execute(&mut **tx)
    .await?;
    Ok((done.rows_affected() == 1).then_some(()))
}

pub async fn set_pool_owner(
    tx: &mut Tx<'_>,
    id: &str,
    owner_tenant_id: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE pools SET owner_tenant_id = $2 WHERE id = $1")
        .bind(id)
        .bind(owner_tenant_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Sets (or, with `None`, removes) a pool's hardware profile.
pub async fn set_profile(
    tx: &mut Tx<'_>,
    pool_id: &str,
    profile: Option<(i32, &str)>,
) -> Result<(), sqlx::Error> {
    match profile {
        Some((gpu_count, gpu_model)) => {
            sqlx::query(
                "INSERT INTO pool_hardware_profiles (pool_id, gpu_count, gpu_model) VALUES ($1, $2, $3) \
                 ON CONFLICT (pool_id) DO UPDATE SET gpu_count = $2, gpu_model = $3, updated_at = now()",
            )
            .bind(pool_id)
            .bind(gpu_count)
            .bind(gpu_model)
            .execute(&mut **tx)
            .await?;
        }
        None => {
            sqlx::query("DELETE FROM pool_hardware_profiles WHERE pool_id = $1")
                .bind(pool_id)
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}

pub async fn site(tx: &mut Tx<'_>, id: &str) -> Result<Option<SiteRow>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {SITE_COLUMNS} FROM sites WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut **tx)
        .await
}

pub async fn tenant(tx: &mut Tx<'_>, id: &str) -> Result<Option<TenantRow>, sqlx::Error> {
    sqlx::query_as("SELECT id, name, created_at FROM tenants WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut **tx)
        .await
}

/// Deletes one row of `table` (sites, tenants or pools; a pool's hardware
/// profile goes with it). A row something still references is a
/// foreign-key violation (23503) the caller names.
pub async fn delete(tx: &mut Tx<'_>, table: Table, id: &str) -> Result<bool, sqlx::Error> {
    if table == Table::Pools {
        set_profile(tx, id, None).await?;
    }
    let sql = match table {
        Table::Sites => "DELETE FROM sites WHERE id = $1",
        Table::Tenants => "DELETE FROM tenants WHERE id = $1",
        Table::Pools => "DELETE FROM pools WHERE id = $1",
    };
    let done = sqlx::query(sql).bind(id).execute(&mut **tx).await?;
    Ok(done.rows_affected() == 1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Sites,
    Tenants,
    Pools,
}
