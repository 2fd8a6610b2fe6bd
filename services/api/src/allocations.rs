//! GPU allocations and pool capacity. Booking, releasing and capacity go to
//! the placer over NATS (`crate::placer`): it holds the capacity view it
//! books against, so the API never answers numbers the placer would not.
//! Reading an allocation and listing them are plain reads of the placer's
//! tables, like every other read.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::{Postgres, QueryBuilder};
use utoipa::IntoParams;

use crate::error::{ApiError, ApiResult, J, P, Q};
use crate::model::*;
use crate::page::Keyset;
use crate::{db, placer, App};
use fleet_placer_client::model::{allocation_status_schema, ALLOCATION_STATUSES};
use fleet_placer_client::{AllocateRequest, Allocation, Atom, Capacity};

/// Books GPUs through the placer.
#[utoipa::path(post, operation_id = "create_allocation", path = "/api/v1/allocations/",
    request_body = AllocateRequest,
    responses((status = 201, description = "booked (or the first answer to the same request_id)", body = Allocation),
        (status = 400, body = crate::error::ErrorBody),
        (status = 404, description = "no such pool or tenant (NOT_FOUND)", body = crate::error::ErrorBody),
        (status = 409, description = "no room (INSUFFICIENT_CAPACITY)", body = crate::error::ErrorBody),
        (status = 503, description = "the placer did not answer (UNAVAILABLE)", body = crate::error::ErrorBody)),
    tag = "allocations")]
pub async fn create(
    State(app): State<App>,
    J(b): J<AllocateRequest>,
) -> ApiResult<(StatusCode, Json<Allocation>)> {
    let a = app
        .placer
        .allocate(&b)
        .await
        .map_err(|e| placer::error("allocate", e))?;
    Ok((StatusCode::CREATED, Json(a)))
}

#[utoipa::path(get, operation_id = "get_allocation", path = "/api/v1/allocations/{id}/", params(("id" = String, Path)),
    responses((status = 200, body = Allocation), (status = 404, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)),
    tag = "allocations")]
pub async fn detail(State(app): State<App>, P(id): P<String>) -> ApiResult<Json<Allocation>> {
    let sql = format!("{ALLOCATION_SELECT} AND a.id = $1");
    let row: AllocationRow = db::one(&app, &sql, &id, "allocation").await?;
    Ok(Json(row.into()))
}

/// An allocation with its atoms: a plain read (reads keep working while
/// the placer is away); `WHERE true` so filters append.
const ALLOCATION_SELECT: &str =
    "SELECT a.id, a.tenant_id, a.pool_id, a.gpus, a.same_device, a.nvlink_domain, a.status, \
     a.impaired_reason, a.created_at, a.impaired_at, a.released_at, a.request_id, \
     COALESCE(x.devices, '{}') AS atom_devices, COALESCE(x.atoms, '{}') AS atom_indexes \
     FROM allocations a LEFT JOIN LATERAL ( \
       SELECT array_agg(t.device_id ORDER BY t.device_id, t.atom) AS devices, \
              array_agg(t.atom ORDER BY t.device_id, t.atom) AS atoms \
       FROM allocation_atoms t WHERE t.allocation_id = a.id) x ON true WHERE true";

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReleaseParams {
    /// When set, another tenant's allocation is `NOT_FOUND`.
    pub tenant_id: Option<String>,
}

/// Releases the allocation's GPUs through the placer; releasing twice
/// answers the released allocation.
#[utoipa::path(post, path = "/api/v1/allocations/{id}/release",
    params(("id" = String, Path), ReleaseParams),
    responses((status = 200, body = Allocation), (status = 400, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody),
        (status = 503, description = "the placer did not answer (UNAVAILABLE)", body = crate::error::ErrorBody)),
    tag = "allocations")]
pub async fn release(
    State(app): State<App>,
    P(id): P<String>,
    Q(q): Q<ReleaseParams>,
) -> ApiResult<Json<Allocation>> {
    let a = app
        .placer
        .release(&id, q.tenant_id.as_deref())
        .await
        .map_err(|e| placer::error("release", e))?;
    Ok(Json(a.into()))
}

crate::page::page_query! {
    pub struct AllocationFilter {
        pub pool: Option<String>,
        pub tenant: Option<String>,
        #[param(schema_with = allocation_status_schema)]
        pub status: Option<String>,
    }
}

#[derive(sqlx::FromRow)]
struct AllocationRow {
    id: String,
    tenant_id: String,
    pool_id: String,
    gpus: i32,
    same_device: bool,
    nvlink_domain: Option<String>,
    status: String,
    impaired_reason: Option<String>,
    created_at: DateTime<Utc>,
    impaired_at: Option<DateTime<Utc>>,
    released_at: Option<DateTime<Utc>>,
    request_id: Option<String>,
    atom_devices: Vec<String>,
    atom_indexes: Vec<i32>,
}

impl From<AllocationRow> for Allocation {
    fn from(r: AllocationRow) -> Self {
        Allocation {
            atoms: r
                .atom_devices
                .into_iter()
                .zip(r.atom_indexes)
                .map(|(device_id, atom)| Atom {
                    device_id,
                    atom: atom.max(0) as u32,
                })
                .collect(),
            id: r.id,
            tenant_id: r.tenant_id,
            pool_id: r.pool_id,
            gpus: r.gpus.max(0) as u32,
            same_device: r.same_device,
            nvlink_domain: r.nvlink_domain,
            status: r.status,
            impaired_reason: r.impaired_reason,
            created_at: r.created_at,
            impaired_at: r.impaired_at,
            released_at: r.released_at,
            request_id: r.request_id,
        }
    }
}

/// Allocations, newest first (keyset on the id, a ULID).
#[utoipa::path(get, operation_id = "list_allocations", path = "/api/v1/allocations/", params(AllocationFilter),
    responses((status = 200, body = AllocationPage), (status = 400, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)),
    tag = "allocations")]
pub async fn list(
    State(app): State<App>,
    Q(f): Q<AllocationFilter>,
) -> ApiResult<Json<AllocationPage>> {
    let page = f.page(&app)?;
    let mut qb = QueryBuilder::<Postgres>::new(ALLOCATION_SELECT);
    if let Some(p) = &f.pool {
        qb.push(" AND a.pool_id = ").push_bind(p.clone());
    }
    if let Some(t) = &f.tenant {
        qb.push(" AND a.tenant_id = ").push_bind(t.clone());
    }
    if let Some(s) = &f.status {
        if !ALLOCATION_STATUSES.contains(&s.as_str()) {
            return Err(ApiError::invalid(format!(
                "unknown allocation status {s:?}; one of {}",
                ALLOCATION_STATUSES.join(", ")
            )));
        }
        qb.push(" AND a.status = ").push_bind(s.clone());
    }
    let newest_first = Keyset::descending(&["a.id"]);
    let (rows, next_cursor) = page
        .fetch(&app, qb, newest_first, |a: &AllocationRow| (a.id.clone(),))
        .await?;
    Ok(Json(AllocationPage {
        items: rows.into_iter().map(Into::into).collect(),
        next_cursor,
    }))
}

/// GPUs of a pool per capacity bucket, from the placer's capacity view.
#[utoipa::path(get, path = "/api/v1/pools/{id}/capacity", params(("id" = String, Path)),
    responses((status = 200, body = Capacity), (status = 404, body = crate::error::ErrorBody),
        (status = 503, description = "the placer did not answer (UNAVAILABLE)", body = crate::error::ErrorBody)),
    tag = "allocations")]
pub async fn capacity(State(app): State<App>, P(id): P<String>) -> ApiResult<Json<Capacity>> {
    let c = app
        .placer
        .capacity(&id)
        .await
        .map_err(|e| placer::error("capacity", e))?;
    Ok(Json(c.into()))
}
