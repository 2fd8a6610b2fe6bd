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
use fleet_hub_client::Applied;
use fleet_proto::v1;
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, Postgres, QueryBuilder};
use utoipa::ToSchema;
use v1::hub_command::Command as C;

use crate::auth::Caller;
use crate::call::Call;
use crate::devices::created;
use crate::error::{ApiError, ApiResult, J, P, Q};
use crate::hub::unreadable;
use crate::page::Keyset;
use crate::{db, App};

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

/// An inventory record: read from its table, and answered by the hub's
/// inventory commands.
trait Record: From<Self::Row> {
    /// Its kind in `DeleteInventory`, and in `NOT_FOUND` messages.
    const KIND: &'static str;
    /// Its rows; ends in a WHERE clause, so filters append.
    const SELECT: &'static str;
    type Row: for<'r> FromRow<'r, PgRow> + Send + Unpin;
    fn id(row: &Self::Row) -> &str;
    /// The record a command left.
    fn of(applied: Applied) -> ApiResult<Self>;
}

impl Record for Site {
    const KIND: &'static str = "site";
    const SELECT: &'static str = "SELECT id, name, inventory_only, placement_enabled, \
        backend_vrf_flip_allowed, created_at FROM sites WHERE true";
    type Row = Site;
    fn id(row: &Site) -> &str {
        &row.id
    }
    fn of(applied: Applied) -> ApiResult<Site> {
        let s = applied.site().map_err(unreadable)?;
        Ok(Site {
            created_at: created_at(s.created_at.as_ref())?,
            id: s.id,
            name: s.name,
            inventory_only: s.inventory_only,
            placement_enabled: s.placement_enabled,
            backend_vrf_flip_allowed: s.backend_vrf_flip_allowed,
        })
    }
}

impl Record for Tenant {
    const KIND: &'static str = "tenant";
    const SELECT: &'static str = "SELECT id, name, created_at FROM tenants WHERE true";
    type Row = Tenant;
    fn id(row: &Tenant) -> &str {
        &row.id
    }
    fn of(applied: Applied) -> ApiResult<Tenant> {
        let t = applied.tenant().map_err(unreadable)?;
        Ok(Tenant {
            created_at: created_at(t.created_at.as_ref())?,
            id: t.id,
            name: t.name,
        })
    }
}

impl Record for Pool {
    const KIND: &'static str = "pool";
    const SELECT: &'static str = "SELECT * FROM (SELECT p.id, p.site_id, p.kind, \
        p.owner_tenant_id, h.gpu_count, h.gpu_model, p.created_at \
        FROM pools p LEFT JOIN pool_hardware_profiles h ON h.pool_id = p.id) p WHERE true";
    type Row = PoolRow;
    fn id(row: &PoolRow) -> &str {
        &row.id
    }
    fn of(applied: Applied) -> ApiResult<Pool> {
        let p = applied.pool().map_err(unreadable)?;
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
}

fn profile(h: HardwareProfile) -> v1::PoolHardwareProfile {
    v1::PoolHardwareProfile {
        gpu_count: h.gpu_count,
        gpu_model: h.gpu_model,
    }
}

/// An inventory command; the answer is the record it left.
async fn command<T: Record>(app: &App, caller: &Caller, c: C) -> ApiResult<T> {
    T::of(app.hub.command(&caller.token_id, 0, c).await?)
}

/// Deletes the record the call names; the answer is the record as it was.
async fn delete<T: Record>(call: Call) -> ApiResult<Json<T>> {
    let (kind, id) = (T::KIND.into(), call.id);
    let c = C::DeleteInventory(v1::DeleteInventory { kind, id });
    command(&call.app, &call.caller, c).await.map(Json)
}

/// The record with `id`, or `NOT_FOUND`.
async fn get<T: Record>(app: &App, id: &str) -> ApiResult<Json<T>> {
    let sql = format!("{} AND id = $1", T::SELECT);
    let row: T::Row = db::one(app, &sql, id, T::KIND).await?;
    Ok(Json(row.into()))
}

crate::page::page_query! {
    pub struct InventoryFilter {
        /// Pools only: those of this site.
        pub site: Option<String>,
    }
}

/// One keyset page by id; `site` keeps the pools of that site.
async fn list<T: Record>(
    app: &App,
    f: &InventoryFilter,
    site: Option<&str>,
) -> ApiResult<(Vec<T>, Option<String>)> {
    let page = f.page(app)?;
    let mut qb = QueryBuilder::<Postgres>::new(T::SELECT);
    if let Some(s) = site {
        qb.push(" AND p.site_id = ").push_bind(s.to_string());
    }
    let (rows, next) = page
        .fetch(app, qb, Keyset::ascending(&["id"]), |r: &T::Row| {
            T::id(r).to_string()
        })
        .await?;
    Ok((rows.into_iter().map(T::from).collect(), next))
}

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
    let (items, next_cursor) = list(&app, &f, None).await?;
    Ok(Json(SitePage { items, next_cursor }))
}

#[utoipa::path(get, operation_id = "get_site", path = "/api/v1/sites/{id}/", params(("id" = String, Path)),
    responses((status = 200, body = Site), (status = 404, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn site(State(app): State<App>, P(id): P<String>) -> ApiResult<Json<Site>> {
    get(&app, &id).await
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
    Ok(created(command(&app, &caller, c).await?))
}

#[utoipa::path(patch, operation_id = "update_site", path = "/api/v1/sites/{id}/", params(("id" = String, Path)),
    request_body = UpdateSiteBody,
    responses((status = 200, body = Site), (status = 400, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn update_site(call: Call, J(b): J<UpdateSiteBody>) -> ApiResult<Json<Site>> {
    if b.inventory_only.is_some() {
        return Err(ApiError::invalid(
            "inventory_only is immutable after the site is created (seed 002); it cannot be updated",
        ));
    }
    let c = C::UpdateSite(v1::UpdateSite {
        id: call.id,
        name: b.name,
        placement_enabled: b.placement_enabled,
        backend_vrf_flip_allowed: b.backend_vrf_flip_allowed,
    });
    command(&call.app, &call.caller, c).await.map(Json)
}

#[utoipa::path(delete, operation_id = "delete_site", path = "/api/v1/sites/{id}/", params(("id" = String, Path)),
    responses((status = 200, description = "The site as it was", body = Site), (status = 404, body = crate::error::ErrorBody),
        (status = 409, description = "Something still refers to the site", body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn delete_site(call: Call) -> ApiResult<Json<Site>> {
    delete(call).await
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
    let (items, next_cursor) = list(&app, &f, None).await?;
    Ok(Json(TenantPage { items, next_cursor }))
}

#[utoipa::path(get, operation_id = "get_tenant", path = "/api/v1/tenants/{id}/", params(("id" = String, Path)),
    responses((status = 200, body = Tenant), (status = 404, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn tenant(State(app): State<App>, P(id): P<String>) -> ApiResult<Json<Tenant>> {
    get(&app, &id).await
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
    Ok(created(command(&app, &caller, c).await?))
}

#[utoipa::path(patch, operation_id = "update_tenant", path = "/api/v1/tenants/{id}/", params(("id" = String, Path)),
    request_body = UpdateTenantBody,
    responses((status = 200, body = Tenant), (status = 400, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn update_tenant(call: Call, J(b): J<UpdateTenantBody>) -> ApiResult<Json<Tenant>> {
    let c = C::UpdateTenant(v1::Tenant {
        id: call.id,
        name: b.name,
        created_at: None,
    });
    command(&call.app, &call.caller, c).await.map(Json)
}

#[utoipa::path(delete, operation_id = "delete_tenant", path = "/api/v1/tenants/{id}/", params(("id" = String, Path)),
    responses((status = 200, description = "The tenant as it was", body = Tenant), (status = 404, body = crate::error::ErrorBody),
        (status = 409, description = "Something still refers to the tenant", body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn delete_tenant(call: Call) -> ApiResult<Json<Tenant>> {
    delete(call).await
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
    let (items, next_cursor) = list(&app, &f, f.site.as_deref()).await?;
    Ok(Json(PoolPage { items, next_cursor }))
}

#[utoipa::path(get, operation_id = "get_pool", path = "/api/v1/pools/{id}/", params(("id" = String, Path)),
    responses((status = 200, body = Pool), (status = 404, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn pool(State(app): State<App>, P(id): P<String>) -> ApiResult<Json<Pool>> {
    get(&app, &id).await
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
    Ok(created(command(&app, &caller, c).await?))
}

#[utoipa::path(patch, operation_id = "update_pool", path = "/api/v1/pools/{id}/", params(("id" = String, Path)),
    request_body = UpdatePoolBody,
    responses((status = 200, body = Pool), (status = 400, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn update_pool(call: Call, J(b): J<UpdatePoolBody>) -> ApiResult<Json<Pool>> {
    let c = C::UpdatePool(v1::UpdatePool {
        id: call.id,
        owner_tenant_id: b.owner_tenant_id,
        hardware_profile: b.hardware_profile.map(profile),
        clear_hardware_profile: b.clear_hardware_profile,
    });
    command(&call.app, &call.caller, c).await.map(Json)
}

#[utoipa::path(delete, operation_id = "delete_pool", path = "/api/v1/pools/{id}/", params(("id" = String, Path)),
    responses((status = 200, description = "The pool as it was", body = Pool), (status = 404, body = crate::error::ErrorBody),
        (status = 409, description = "Something still refers to the pool", body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "inventory")]
pub async fn delete_pool(call: Call) -> ApiResult<Json<Pool>> {
    delete(call).await
}
