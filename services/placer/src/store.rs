//! The placer's queries. It reads devices (through the schedulable
//! predicate of `fleet_domain::predicates`) and writes only its own tables:
//! `allocations`, `allocation_atoms`, `placer_outbox`.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use fleet_domain::predicates::{self, SchedulingFacts, SCHEDULABLE_BUCKET_SQL, SCHEDULABLE_SQL};
use fleet_domain::*;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Postgres, Row, Transaction};

use crate::error::PlacerError;
use crate::model::{Allocation, Atom};
use crate::view::DeviceRow;

pub type Tx<'a> = Transaction<'a, Postgres>;

fn view_sql(filter: &str) -> String {
    format!(
        "SELECT d.id, d.pool_id, d.version, d.rack, d.labels->>'nvlink_domain' AS nvlink_domain, \
         COALESCE(d.gpu_count, hp.gpu_count, 0) AS gpus, {SCHEDULABLE_BUCKET_SQL} AS bucket, \
         COALESCE(b.booked, 0) AS booked \
         FROM devices d LEFT JOIN pools p ON p.id = d.pool_id \
         LEFT JOIN pool_hardware_profiles hp ON hp.pool_id = d.pool_id \
         LEFT JOIN (SELECT device_id, count(*) AS booked FROM allocation_atoms \
                    WHERE released_at IS NULL GROUP BY device_id) b ON b.device_id = d.id \
         WHERE d.deleted_at IS NULL AND d.pool_id IS NOT NULL {filter}"
    )
}

fn device_row(r: &PgRow) -> Result<DeviceRow, PlacerError> {
    let bucket: String = r.try_get("bucket")?;
    let gpus: i32 = r.try_get("gpus")?;
    let booked: i64 = r.try_get("booked")?;
    Ok(DeviceRow {
        id: r.try_get("id")?,
        pool_id: r.try_get("pool_id")?,
        version: r.try_get("version")?,
        rack: r.try_get("rack")?,
        nvlink_domain: r.try_get("nvlink_domain")?,
        gpus: gpus.max(0) as u32,
        bucket: CapacityBucket::parse(&bucket)
            .map_err(|e| PlacerError::unavailable(format!("bucket: {e}")))?,
        booked: booked.max(0) as u32,
    })
}

/// Every pooled, live device (or one pool's).
pub async fn load_rows(
    pool: &PgPool,
    pool_id: Option<&str>,
) -> Result<Vec<DeviceRow>, PlacerError> {
    let rows = match pool_id {
        Some(p) => {
            sqlx::query(&view_sql("AND d.pool_id = $1"))
                .bind(p)
                .fetch_all(pool)
                .await?
        }
        None => sqlx::query(&view_sql("")).fetch_all(pool).await?,
    };
    rows.iter().map(device_row).collect()
}

/// One device, `None` when it is deleted or in no pool.
pub async fn load_row(pool: &PgPool, device_id: &str) -> Result<Option<DeviceRow>, PlacerError> {
    let row = sqlx::query(&view_sql("AND d.id = $1"))
        .bind(device_id)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(device_row).transpose()
}

/// A pool's owner and whether the tenant exists, in one round trip;
/// `None` when the pool does not exist.
pub async fn pool_and_tenant(
    pool: &PgPool,
    pool_id: &str,
    tenant_id: &str,
) -> Result<Option<(Option<String>, bool)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT owner_tenant_id, EXISTS (SELECT 1 FROM tenants WHERE id = $2) FROM pools WHERE id = $1",
    )
    .bind(pool_id)
    .bind(tenant_id)
    .fetch_optional(pool)
    .await
}

/// The owner of a pool: `None` when the pool does not exist.
pub async fn pool_owner(
    pool: &PgPool,
    pool_id: &str,
) -> Result<Option<Option<String>>, sqlx::Error> {
    sqlx::query_scalar("SELECT owner_tenant_id FROM pools WHERE id = $1")
        .bind(pool_id)
        .fetch_optional(pool)
        .await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// `FOR UPDATE SKIP LOCKED`: a device another transaction holds is
    /// passed over.
    Skip,
    /// `FOR UPDATE`: wait for it (callers lock in device-id order).
    Wait,
}

/// A device locked for booking, re-checked under the lock.
#[derive(Debug, Clone)]
pub struct Locked {
    pub id: String,
    pub version: i64,
    pub gpus: u32,
    pub nvlink_domain: Option<String>,
    /// The Rust predicate over the locked row.
    pub bucket: CapacityBucket,
    pub booked: BTreeSet<u32>,
}

fn facts_bucket(r: &PgRow) -> Result<CapacityBucket, PlacerError> {
    let corrupt = |e: DomainError| PlacerError::unavailable(format!("device row: {e}"));
    let owner: Option<String> = r.try_get("owner_tenant_id")?;
    let pool_owner: Option<String> = r.try_get("pool_owner_tenant_id")?;
    let reasons: Vec<String> = r.try_get("no_schedule_reasons")?;
    let facts = SchedulingFacts {
        role: Role::parse(r.try_get::<&str, _>("role")?).map_err(corrupt)?,
        trust: Trust::parse(r.try_get::<&str, _>("trust")?).map_err(corrupt)?,
        owner_tenant_id: owner.as_deref(),
        pool_owner_tenant_id: pool_owner.as_deref(),
        maintenance: r.try_get("maintenance")?,
        cordoned: r.try_get("cordoned")?,
        provision_state: ProvisionState::parse(r.try_get::<&str, _>("provision_state")?)
            .map_err(corrupt)?,
        observed_generation: r.try_get("observed_generation")?,
        connectivity: Connectivity::parse(r.try_get::<&str, _>("connectivity")?)
            .map_err(corrupt)?,
        no_schedule_reasons: &reasons,
    };
    Ok(predicates::schedulable(&facts))
}

/// Locks one device of `pool_id` if it passes the schedulable predicate in
/// SQL (`None` otherwise, or when another transaction holds it in `Skip`
/// mode), and reads its booked atoms under the lock.
pub async fn lock_device(
    tx: &mut Tx<'_>,
    device_id: &str,
    pool_id: &str,
    mode: LockMode,
) -> Result<Option<Locked>, PlacerError> {
    // The row lock is taken through `lock_devices` (migrations 0007, 0019): the
    // placer's role may read devices but not write them, and FOR UPDATE
    // needs write privilege. The read below runs after the lock is held, so
    // it sees the hub's last committed write and the hub's next one waits.
    let locked: Option<String> =
        sqlx::query_scalar("SELECT id FROM lock_devices(ARRAY[$1]::text[], $2) AS id")
            .bind(device_id)
            .bind(mode == LockMode::Skip)
            .fetch_optional(&mut **tx)
            .await?;
    if locked.is_none() {
        return Ok(None);
    }
    let sql = format!(
        "SELECT d.id, d.version, d.role, d.trust, d.owner_tenant_id, p.owner_tenant_id AS pool_owner_tenant_id, \
         d.maintenance, d.cordoned, d.provision_state, d.observed_generation, d.connectivity, \
         d.no_schedule_reasons, COALESCE(d.gpu_count, hp.gpu_count, 0) AS gpus, \
         d.labels->>'nvlink_domain' AS nvlink_domain \
         FROM devices d LEFT JOIN pools p ON p.id = d.pool_id \
         LEFT JOIN pool_hardware_profiles hp ON hp.pool_id = d.pool_id \
         WHERE d.id = $1 AND d.pool_id = $2 AND d.deleted_at IS NULL AND {SCHEDULABLE_SQL}"
    );
    let Some(r) = sqlx::query(&sql)
        .bind(device_id)
        .bind(pool_id)
        .fetch_optional(&mut **tx)
        .await?
    else {
        return Ok(None);
    };
    let bucket = facts_bucket(&r)?;
    let gpus: i32 = r.try_get("gpus")?;
    let booked: Vec<i32> = sqlx::query_scalar(
        "SELECT atom FROM allocation_atoms WHERE device_id = $1 AND released_at IS NULL",
    )
    .bind(device_id)
    .fetch_all(&mut **tx)
    .await?;
    Ok(Some(Locked {
        id: r.try_get("id")?,
        version: r.try_get("version")?,
        gpus: gpus.max(0) as u32,
        nvlink_domain: r.try_get("nvlink_domain")?,
        bucket,
        booked: booked.into_iter().map(|a| a.max(0) as u32).collect(),
    }))
}

/// What one booking writes.
pub struct NewAllocation<'a> {
    pub id: &'a str,
    pub tenant_id: &'a str,
    pub pool_id: &'a str,
    pub gpus: u32,
    pub same_device: bool,
    pub nvlink_domain: Option<&'a str>,
    pub request_id: Option<&'a str>,
    /// (device, atom, device version under the lock)
    pub atoms: Vec<(String, u32, i64)>,
}

/// Inserts the allocation and its atoms in one statement; returns its
/// `created_at`.
pub async fn insert_allocation(
    tx: &mut Tx<'_>,
    a: &NewAllocation<'_>,
) -> Result<DateTime<Utc>, sqlx::Error> {
    let devices: Vec<&str> = a.atoms.iter().map(|(d, _, _)| d.as_str()).collect();
    let atoms: Vec<i32> = a.atoms.iter().map(|(_, x, _)| *x as i32).collect();
    let versions: Vec<i64> = a.atoms.iter().map(|(_, _, v)| *v).collect();
    sqlx::query_scalar(
        "WITH a AS (INSERT INTO allocations (id, tenant_id, pool_id, gpus, same_device, nvlink_domain, request_id) \
                    VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id, created_at), \
              x AS (INSERT INTO allocation_atoms (allocation_id, device_id, atom, device_version) \
                    SELECT a.id, u.d, u.x, u.v FROM a, UNNEST($8::text[], $9::int[], $10::bigint[]) AS u(d, x, v)) \
         SELECT created_at FROM a",
    )
    .bind(a.id)
    .bind(a.tenant_id)
    .bind(a.pool_id)
    .bind(a.gpus as i32)
    .bind(a.same_device)
    .bind(a.nvlink_domain)
    .bind(a.request_id)
    .bind(&devices)
    .bind(&atoms)
    .bind(&versions)
    .fetch_one(&mut **tx)
    .await
}

fn allocation_from(r: &PgRow, atoms: Vec<Atom>) -> Result<Allocation, sqlx::Error> {
    let gpus: i32 = r.try_get("gpus")?;
    Ok(Allocation {
        id: r.try_get("id")?,
        tenant_id: r.try_get("tenant_id")?,
        pool_id: r.try_get("pool_id")?,
        gpus: gpus.max(0) as u32,
        same_device: r.try_get("same_device")?,
        nvlink_domain: r.try_get("nvlink_domain")?,
        status: r.try_get("status")?,
        atoms,
        impaired_reason: r.try_get("impaired_reason")?,
        created_at: r.try_get("created_at")?,
        impaired_at: r.try_get("impaired_at")?,
        released_at: r.try_get("released_at")?,
        request_id: r.try_get("request_id")?,
    })
}

const ALLOCATION_COLUMNS: &str =
    "id, tenant_id, pool_id, gpus, same_device, nvlink_domain, status, \
    impaired_reason, created_at, impaired_at, released_at, request_id";

pub async fn get_allocation<'e, E>(db: E, id: &str) -> Result<Option<Allocation>, sqlx::Error>
where
    E: sqlx::PgExecutor<'e> + Copy,
{
    let Some(r) = sqlx::query(&format!(
        "SELECT {ALLOCATION_COLUMNS} FROM allocations WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await?
    else {
        return Ok(None);
    };
    let atoms: Vec<(String, i32)> = sqlx::query_as(
        "SELECT device_id, atom FROM allocation_atoms WHERE allocation_id = $1 ORDER BY device_id, atom",
    )
    .bind(id)
    .fetch_all(db)
    .await?;
    let atoms = atoms
        .into_iter()
        .map(|(device_id, atom)| Atom {
            device_id,
            atom: atom.max(0) as u32,
        })
        .collect();
    allocation_from(&r, atoms).map(Some)
}

pub async fn find_by_request(
    pool: &PgPool,
    tenant_id: &str,
    request_id: &str,
) -> Result<Option<Allocation>, sqlx::Error> {
    let id: Option<String> =
        sqlx::query_scalar("SELECT id FROM allocations WHERE tenant_id = $1 AND request_id = $2")
            .bind(tenant_id)
            .bind(request_id)
            .fetch_optional(pool)
            .await?;
    match id {
        Some(id) => get_allocation(pool, &id).await,
        None => Ok(None),
    }
}

/// Releases an allocation (idempotent); returns the devices whose atoms
/// were freed, with how many, and `false` when there is no such
/// allocation (of that tenant).
pub async fn release(
    pool: &PgPool,
    id: &str,
    tenant_id: Option<&str>,
) -> Result<Option<Vec<(String, i64)>>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let found: Option<String> = sqlx::query_scalar(
        "SELECT status FROM allocations WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2) FOR UPDATE",
    )
    .bind(id)
    .bind(tenant_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(status) = found else {
        return Ok(None);
    };
    if status == "released" {
        return Ok(Some(vec![]));
    }
    sqlx::query("UPDATE allocations SET status = 'released', released_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let freed: Vec<(String, i64)> = sqlx::query_as(
        "WITH r AS (UPDATE allocation_atoms SET released_at = now() \
                    WHERE allocation_id = $1 AND released_at IS NULL RETURNING device_id) \
         SELECT device_id, count(*) FROM r GROUP BY device_id",
    )
    .bind(id)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some(freed))
}

/// An allocation marked impaired.
#[derive(Debug, Clone)]
pub struct Impaired {
    pub allocation_id: String,
    pub tenant_id: String,
    pub pool_id: String,
}

/// Marks the active allocations holding atoms on `device_id` that existed
/// when the device went bad (`at`) as impaired, with `reason`.
pub async fn impair(
    tx: &mut Tx<'_>,
    device_id: &str,
    reason: &str,
    at: DateTime<Utc>,
) -> Result<Vec<Impaired>, sqlx::Error> {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "UPDATE allocations al SET status = 'impaired', impaired_reason = $2, impaired_at = now() \
         WHERE al.status = 'active' AND al.created_at <= $3 AND EXISTS ( \
           SELECT 1 FROM allocation_atoms a WHERE a.allocation_id = al.id AND a.device_id = $1 \
           AND a.released_at IS NULL) \
         RETURNING al.id, al.tenant_id, al.pool_id",
    )
    .bind(device_id)
    .bind(reason)
    .bind(at)
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(allocation_id, tenant_id, pool_id)| Impaired {
            allocation_id,
            tenant_id,
            pool_id,
        })
        .collect())
}
