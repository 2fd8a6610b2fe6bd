//! Sites, tenants, pools and pool hardware profiles: the inventory an
//! operator sets up before devices arrive. Reads are SQL over the tables;
//! every write is a hub inventory command (only the hub writes them), so
//! the hub checks each input and answers the typed refusal.
//!
//! A site's `inventory_only` is set at create and never again (seed 002:
//! "immutable after create"): an update naming it is refused.

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use fleet_proto::v1;
use serde::{Deserialize, Serialize};
use sqlx::{FromRow, Postgres, QueryBuilder};
use utoipa::ToSchema;
use v1::hub_command::Command as C;

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, J, P, Q};
use crate::hub::unreadable;
use crate::{page, App};

#[derive(Debug, Serialize, Deserialize, FromRow, ToSchema)]
pub struct Site {
    pub id: String,
    pub name: String,
    /// Every device created at the site is inventory-only; fixed at create.
    pub inventory_only: bool,
    pub placement_enabled: bool,
    /// The back-end VRF flips write this site's switches; otherwise every
    /// back-end switch is simulated (nothing written, no latch recorded).
    pub backend_vrf_flip_allowed: bool,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, Deserialize, FromRow, ToSchema)]
pub struct Tenant {
    pub id: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// What acceptance checks a joining device's inventory against.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    pub gpu_count: i32,
    #[serde(default)]
    pub gpu_model: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Pool {
    pub id: String,
    pub site_id: String,
    /// `metal-host`, `vps-host`, `provider`, `metal-dedicated` or `custom`.
    pub kind: String,
    pub owner_tenant_id: Option<String>,
    /// Absent: no acceptance check for devices that join it.
    pub hardware_profile: Option<HardwareProfile>,
    pub created_at: DateTime<Utc>,
}

#[derive(FromRow)]
struct PoolRow {
    id: String,
    site_id: String,
    kind: String,
    owner_tenant_id: Option<String>,
    gpu_count: Option<i32>,
    gpu_model: Option<String>,
    created_at: DateTime<Utc>,
}

impl From<PoolRow> for Pool {
    fn from(r: PoolRow) -> Pool {
        Pool {
            hardware_profile: r.gpu_count.map(|gpu_count| HardwareProfile {
                gpu_count,
                gpu_model: r.gpu_model.unwrap_or_default(),
            }),
            id: r.id,
            site_id: r.site_id,
            kind: r.kind,
            owner_tenant_id: r.owner_tenant_id,
            created_at: r.created_at,
        }
    }
}

crate::model::page!(SitePage, Site);
crate::model::page!(TenantPage, Tenant);
crate::model::page!(PoolPage, Pool);

fn created_at(t: Option<&fleet_proto::Timestamp>) -> ApiResult<DateTime<Utc>> {
    fleet_proto::datetime(t).ok_or_else(|| unreadable("an inventory row without created_at"))
}

fn site_of(s: v1::Site) -> ApiResult<Site> {
    Ok(Site {
        created_at: created_at(s.created_at.as_ref())?,
        id: s.id,
        name: s.name,
        inventory_only: s.inventory_only,
        placement_enabled: s.placement_enabled,
        backend_vrf_flip_allowed: s.backend_vrf_flip_allowed,
    })
}

fn tenant_of(t: v1::Tenant) -> ApiResult<Tenant> {
    Ok(Tenant {
        created_at: created_at(t.created_at.as_ref())?,
        id: t.id,
        name: t.name,
    })
}

fn pool_of(p: v1::Pool) -> ApiResult<Pool> {
    Ok(Pool {
        created_at: created_at(p.created_at.as_ref())?,
        hardware_profile: p.hardware_profile.map(|h| HardwareProfile {
            gpu_count: h.gpu_count,
            gpu_model: h.gpu_model,
        }),
        owner_tenant_id: (!p.owner_tenant_id.is_empty()).then_some(p.owner_tenant_id),
        id: p.id,
        site_id: p.site_id,
        kind: p.kind,
    })
}

fn profile(h: HardwareProfile) -> v1::PoolHardwareProfile {
    v1::PoolHardwareProfile {
        gpu_count: h.gpu_count,
        gpu_model: h.gpu_model,
    }
}

async fn command(app: &App, caller: &Caller, c: C) -> ApiResult<fleet_hub_client::Applied> {
    app.hub.command(&caller.token_id, 0, c).await
}

crate::page::page_query! {
    pub struct InventoryFilter {
        /// Pools only: those of this site.
        pub site: Option<String>,
    }
}

/// One keyset page by id of `select` (which ends in a WHERE clause).
async fn list_page<T>(
    app: &App,
    select: &str,
    f: &InventoryFilter,
    site: bool,
) -> ApiResult<(Vec<T>, Option<String>)>
where
    T: for<'r> FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin + HasId,
{
    let limit = page::limit(app, f.limit)?;
    let after: Option<String> = page::decode(f.cursor.as_deref())?;
    let mut qb = QueryBuilder::<Postgres>::new(select);
    if let (true, Some(s)) = (site, &f.site) {
        qb.push(" AND p.site_id = ").push_bind(s.clone());
    }
    if let Some(id) = after {
        qb.push(" AND id > ").push_bind(id);
    }
    qb.push(" ORDER BY id LIMIT ").push_bind(limit + 1);
    let rows: Vec<T> = qb.build_query_as().fetch_all(&app.pool).await?;
    Ok(page::finish(rows, limit, |r| r.id().to_string()))
}

trait HasId {
    fn id(&self) -> &str;
}
impl HasId for Site {
    fn id(&self) -> &str {
        &self.id
    }
}
impl HasId for Tenant {
    fn id(&self) -> &str {
        &self.id
    }
}
impl HasId for PoolRow {
    fn id(&self) -> &str {
        &self.id
    }
}

const SITES: &str =
    "SELECT id, name, inventory_only, placement_enabled, backend_vrf_flip_allowed, created_at FROM sites WHERE true";
const TENANTS: &str = "SELECT id, name, created_at FROM tenants WHERE true";
const POOLS: &str = "SELECT * FROM (SELECT p.id, p.site_id, p.kind, p.owner_tenant_id, h.gpu_count, h.gpu_model, p.created_at \
     FROM pools p LEFT JOIN pool_hardware_profiles h ON h.pool_id = p.id) p WHERE true";

fn reject_site_filter(f: &InventoryFilter) -> ApiResult<()> {
    match f.site {
        Some(_) => Err(ApiError::invalid("the site filter applies to pools only")),
        None => Ok(()),
    }
}

// ---- sites ----

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSiteBody {
    pub id: String,
    pub name: String,
    /// Fixed for the site's life: every device created at it is
    /// inventory-only.
    #[serde(default)]
    pub inventory_only: bool,
    #[serde(default = "yes")]
    pub placement_enabled: bool,
    /// The back-end VRF flips may write the site's switches (default
    /// false: they are simulated).
    #[serde(default)]
    pub backend_vrf_flip_allowed: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSiteBody {
    pub name: Option<String>,
    pub placement_enabled: Option<bool>,
    pub backend_vrf_flip_allowed: Option<bool>,
    /// Refused: immutable after create.
    #[schema(ignore)]
    pub inventory_only: Option<serde_json::Value>,
}

#[utoipa::path(get, operation_id = "list_sites", path = "/api/v1/sites/", params(InventoryFilter),
    responses((status = 200, body = SitePage), (status = 400, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn list_sites(
    State(app): State<App>,
    Q(f): Q<InventoryFilter>,
) -> ApiResult<Json<SitePage>> {
    reject_site_filter(&f)?;
    let (items, next_cursor) = list_page::<Site>(&app, SITES, &f, false).await?;
    Ok(Json(SitePage { items, next_cursor }))
}

#[utoipa::path(get, operation_id = "get_site", path = "/api/v1/sites/{id}/", params(("id" = String, Path)),
    responses((status = 200, body = Site), (status = 404, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn site(State(app): State<App>, P(id): P<String>) -> ApiResult<Json<Site>> {
    sqlx::query_as(&format!("{SITES} AND id = $1"))
        .bind(&id)
        .fetch_optional(&app.pool)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("site {id}")))
}

#[utoipa::path(post, operation_id = "create_site", path = "/api/v1/sites/", request_body = CreateSiteBody,
    responses((status = 201, body = Site), (status = 400, body = crate::error::ErrorBody),
        (status = 409, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn create_site(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    J(b): J<CreateSiteBody>,
) -> ApiResult<(StatusCode, Json<Site>)> {
    let c = C::CreateSite(v1::Site {
        id: b.id,
        name: b.name,
        inventory_only: b.inventory_only,
        placement_enabled: b.placement_enabled,
        backend_vrf_flip_allowed: b.backend_vrf_flip_allowed,
        ..Default::default()
    });
    let s = command(&app, &caller, c)
        .await?
        .site()
        .map_err(unreadable)?;
    Ok((StatusCode::CREATED, Json(site_of(s)?)))
}

#[utoipa::path(patch, operation_id = "update_site", path = "/api/v1/sites/{id}/", params(("id" = String, Path)),
    request_body = UpdateSiteBody,
    responses((status = 200, body = Site), (status = 400, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn update_site(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    J(b): J<UpdateSiteBody>,
) -> ApiResult<Json<Site>> {
    if b.inventory_only.is_some() {
        return Err(ApiError::invalid(
            "inventory_only is immutable after the site is created (seed 002); it cannot be updated",
        ));
    }
    let c = C::UpdateSite(v1::UpdateSite {
        id,
        name: b.name,
        placement_enabled: b.placement_enabled,
        backend_vrf_flip_allowed: b.backend_vrf_flip_allowed,
    });
    let s = command(&app, &caller, c)
        .await?
        .site()
        .map_err(unreadable)?;
    Ok(Json(site_of(s)?))
}

async fn delete(
    app: &App,
    caller: &Caller,
    kind: &str,
    id: String,
) -> ApiResult<fleet_hub_client::Applied> {
    command(
        app,
        caller,
        C::DeleteInventory(v1::DeleteInventory {
            kind: kind.into(),
            id,
        }),
    )
    .await
}

#[utoipa::path(delete, operation_id = "delete_site", path = "/api/v1/sites/{id}/", params(("id" = String, Path)),
    responses((status = 200, description = "The site as it was", body = Site), (status = 404, body = crate::error::ErrorBody),
        (status = 409, description = "Something still refers to the site", body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn delete_site(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
) -> ApiResult<Json<Site>> {
    let s = delete(&app, &caller, "site", id)
        .await?
        .site()
        .map_err(unreadable)?;
    Ok(Json(site_of(s)?))
}

// ---- tenants ----

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenantBody {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateTenantBody {
    pub name: String,
}

#[utoipa::path(get, operation_id = "list_tenants", path = "/api/v1/tenants/", params(InventoryFilter),
    responses((status = 200, body = TenantPage), (status = 400, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn list_tenants(
    State(app): State<App>,
    Q(f): Q<InventoryFilter>,
) -> ApiResult<Json<TenantPage>> {
    reject_site_filter(&f)?;
    let (items, next_cursor) = list_page::<Tenant>(&app, TENANTS, &f, false).await?;
    Ok(Json(TenantPage { items, next_cursor }))
}

#[utoipa::path(get, operation_id = "get_tenant", path = "/api/v1/tenants/{id}/", params(("id" = String, Path)),
    responses((status = 200, body = Tenant), (status = 404, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn tenant(State(app): State<App>, P(id): P<String>) -> ApiResult<Json<Tenant>> {
    sqlx::query_as(&format!("{TENANTS} AND id = $1"))
        .bind(&id)
        .fetch_optional(&app.pool)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("tenant {id}")))
}

#[utoipa::path(post, operation_id = "create_tenant", path = "/api/v1/tenants/", request_body = CreateTenantBody,
    responses((status = 201, body = Tenant), (status = 400, body = crate::error::ErrorBody),
        (status = 409, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn create_tenant(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    J(b): J<CreateTenantBody>,
) -> ApiResult<(StatusCode, Json<Tenant>)> {
    let c = C::CreateTenant(v1::Tenant {
        id: b.id,
        name: b.name,
        created_at: None,
    });
    let t = command(&app, &caller, c)
        .await?
        .tenant()
        .map_err(unreadable)?;
    Ok((StatusCode::CREATED, Json(tenant_of(t)?)))
}

#[utoipa::path(patch, operation_id = "update_tenant", path = "/api/v1/tenants/{id}/", params(("id" = String, Path)),
    request_body = UpdateTenantBody,
    responses((status = 200, body = Tenant), (status = 400, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn update_tenant(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    J(b): J<UpdateTenantBody>,
) -> ApiResult<Json<Tenant>> {
    let c = C::UpdateTenant(v1::Tenant {
        id,
        name: b.name,
        created_at: None,
    });
    let t = command(&app, &caller, c)
        .await?
        .tenant()
        .map_err(unreadable)?;
    Ok(Json(tenant_of(t)?))
}

#[utoipa::path(delete, operation_id = "delete_tenant", path = "/api/v1/tenants/{id}/", params(("id" = String, Path)),
    responses((status = 200, description = "The tenant as it was", body = Tenant), (status = 404, body = crate::error::ErrorBody),
        (status = 409, description = "Something still refers to the tenant", body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn delete_tenant(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
) -> ApiResult<Json<Tenant>> {
    let t = delete(&app, &caller, "tenant", id)
        .await?
        .tenant()
        .map_err(unreadable)?;
    Ok(Json(tenant_of(t)?))
}

// ---- pools ----

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePoolBody {
    pub id: String,
    pub site_id: String,
    /// `metal-host`, `vps-host`, `provider`, `metal-dedicated` or `custom`:
    /// decides the role of every device that joins the pool.
    pub kind: String,
    pub owner_tenant_id: Option<String>,
    pub hardware_profile: Option<HardwareProfile>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdatePoolBody {
    /// `""` clears the owner.
    pub owner_tenant_id: Option<String>,
    pub hardware_profile: Option<HardwareProfile>,
    /// Removes the hardware profile (no acceptance check any more).
    #[serde(default)]
    pub clear_hardware_profile: bool,
}

#[utoipa::path(get, operation_id = "list_pools", path = "/api/v1/pools/", params(InventoryFilter),
    responses((status = 200, body = PoolPage), (status = 400, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn list_pools(
    State(app): State<App>,
    Q(f): Q<InventoryFilter>,
) -> ApiResult<Json<PoolPage>> {
    let (rows, next_cursor) = list_page::<PoolRow>(&app, POOLS, &f, true).await?;
    Ok(Json(PoolPage {
        items: rows.into_iter().map(Pool::from).collect(),
        next_cursor,
    }))
}

#[utoipa::path(get, operation_id = "get_pool", path = "/api/v1/pools/{id}/", params(("id" = String, Path)),
    responses((status = 200, body = Pool), (status = 404, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn pool(State(app): State<App>, P(id): P<String>) -> ApiResult<Json<Pool>> {
    sqlx::query_as::<_, PoolRow>(&format!("{POOLS} AND id = $1"))
        .bind(&id)
        .fetch_optional(&app.pool)
        .await?
        .map(|r| Json(Pool::from(r)))
        .ok_or_else(|| ApiError::not_found(format!("pool {id}")))
}

#[utoipa::path(post, operation_id = "create_pool", path = "/api/v1/pools/", request_body = CreatePoolBody,
    responses((status = 201, body = Pool), (status = 400, body = crate::error::ErrorBody),
        (status = 404, description = "No such site or owner tenant", body = crate::error::ErrorBody),
        (status = 409, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn create_pool(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    J(b): J<CreatePoolBody>,
) -> ApiResult<(StatusCode, Json<Pool>)> {
    let c = C::CreatePool(v1::Pool {
        id: b.id,
        site_id: b.site_id,
        kind: b.kind,
        owner_tenant_id: b.owner_tenant_id.unwrap_or_default(),
        hardware_profile: b.hardware_profile.map(profile),
        created_at: None,
    });
    let p = command(&app, &caller, c)
        .await?
        .pool()
        .map_err(unreadable)?;
    Ok((StatusCode::CREATED, Json(pool_of(p)?)))
}

#[utoipa::path(patch, operation_id = "update_pool", path = "/api/v1/pools/{id}/", params(("id" = String, Path)),
    request_body = UpdatePoolBody,
    responses((status = 200, body = Pool), (status = 400, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn update_pool(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
    J(b): J<UpdatePoolBody>,
) -> ApiResult<Json<Pool>> {
    let c = C::UpdatePool(v1::UpdatePool {
        id,
        owner_tenant_id: b.owner_tenant_id,
        hardware_profile: b.hardware_profile.map(profile),
        clear_hardware_profile: b.clear_hardware_profile,
    });
    let p = command(&app, &caller, c)
        .await?
        .pool()
        .map_err(unreadable)?;
    Ok(Json(pool_of(p)?))
}

#[utoipa::path(delete, operation_id = "delete_pool", path = "/api/v1/pools/{id}/", params(("id" = String, Path)),
    responses((status = 200, description = "The pool as it was", body = Pool), (status = 404, body = crate::error::ErrorBody),
        (status = 409, description = "Something still refers to the pool", body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn delete_pool(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
) -> ApiResult<Json<Pool>> {
    let p = delete(&app, &caller, "pool", id)
        .await?
        .pool()
        .map_err(unreadable)?;
    Ok(Json(pool_of(p)?))
}
