//! Impairment events (seed 002): a cordon workflow, not a device axis.
//! The workflow service owns them (`fleet_workflow_client`): creating one
//! records the event `accepted` with every device `pending` and queues each
//! device's cordon (the hub's hold, which quarantines and freezes the
//! status, then the customer-ready trait removed in Placement); clearing
//! queues each device's release (the trait restored for a pre-hold
//! `available` or `in_use` host, then the hold removed and the status
//! re-derived). Both answer at once with the event as recorded; its
//! devices move on as the work runs, so a caller follows the event with
//! `GET`. The API only reads the event tables.

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use fleet_proto::v1;
use serde::Deserialize;
use sqlx::{Postgres, QueryBuilder};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, J, P, Q};
use crate::jobs::error;
use crate::model::*;
use crate::{page, App};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImpairmentCreateBody {
    pub device_ids: Vec<String>,
    pub reason: String,
    pub ticket_url: Option<String>,
}

const EVENT_COLUMNS: &str = "e.id, e.status, e.reason, e.ticket_url, e.created_by, e.created_at, \
    e.updated_at, e.cleared_at, \
    (SELECT count(*) FROM impairment_event_devices x WHERE x.event_id = e.id) AS device_count";

async fn read_detail(app: &App, id: &str) -> ApiResult<ImpairmentEventDetail> {
    let event: ImpairmentEvent = sqlx::query_as(&format!(
        "SELECT {EVENT_COLUMNS} FROM impairment_events e WHERE e.id = $1"
    ))
    .bind(id)
    .fetch_optional(&app.pool)
    .await?
    .ok_or_else(|| ApiError::not_found(format!("impairment event {id}")))?;
    let devices: Vec<ImpairmentEventDevice> = sqlx::query_as(
        "SELECT device_id, status, pre_hold_operational_status, placement_action, placement_status, \
         error_code, error_message, updated_at FROM impairment_event_devices WHERE event_id = $1 \
         ORDER BY device_id",
    )
    .bind(id)
    .fetch_all(&app.pool)
    .await?;
    Ok(ImpairmentEventDetail { event, devices })
}

#[utoipa::path(post, operation_id = "create_impairment_event", path = "/api/v1/operations/impairment-events/",
    request_body = ImpairmentCreateBody,
    responses((status = 201, description = "The event as recorded: `accepted`, every device `pending`; follow it with GET", body = ImpairmentEventDetail),
        (status = 400, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)),
    tag = "operations")]
pub async fn create(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    J(b): J<ImpairmentCreateBody>,
) -> ApiResult<(StatusCode, Json<ImpairmentEventDetail>)> {
    let r = v1::CreateImpairmentRequest {
        device_ids: b.device_ids,
        reason: b.reason,
        ticket_url: b.ticket_url.unwrap_or_default(),
        created_by: caller.token_id.clone(),
    };
    let accepted = app
        .workflow
        .create_impairment(&r)
        .await
        .map_err(|e| error("create_impairment", e))?;
    Ok((
        StatusCode::CREATED,
        Json(read_detail(&app, &accepted.event_id).await?),
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ImpairmentFilter {
    #[param(schema_with = event_status_schema)]
    pub status: Option<String>,
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

#[utoipa::path(get, operation_id = "list_impairment_events", path = "/api/v1/operations/impairment-events/", params(ImpairmentFilter),
    responses((status = 200, body = ImpairmentPage), (status = 400, body = crate::error::ErrorBody)),
    tag = "operations")]
pub async fn list(
    State(app): State<App>,
    Q(f): Q<ImpairmentFilter>,
) -> ApiResult<Json<ImpairmentPage>> {
    let limit = page::limit(&app, f.limit)?;
    let after: Option<(DateTime<Utc>, String)> = page::decode(f.cursor.as_deref())?;
    let mut qb = QueryBuilder::<Postgres>::new(format!(
        "SELECT {EVENT_COLUMNS} FROM impairment_events e WHERE true"
    ));
    if let Some(s) = &f.status {
        fleet_domain::impairment::EventStatus::parse(s)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        qb.push(" AND e.status = ").push_bind(s.clone());
    }
    if let Some((at, id)) = after {
        qb.push(" AND (e.created_at, e.id) < (")
            .push_bind(at)
            .push(", ")
            .push_bind(id)
            .push(")");
    }
    qb.push(" ORDER BY e.created_at DESC, e.id DESC LIMIT ")
        .push_bind(limit + 1);
    let rows: Vec<ImpairmentEvent> = qb.build_query_as().fetch_all(&app.pool).await?;
    let (items, next_cursor) = page::finish(rows, limit, |e| (e.created_at, e.id.clone()));
    Ok(Json(ImpairmentPage { items, next_cursor }))
}

#[utoipa::path(get, operation_id = "get_impairment_event", path = "/api/v1/operations/impairment-events/{id}/", params(("id" = String, Path)),
    responses((status = 200, body = ImpairmentEventDetail), (status = 404, body = crate::error::ErrorBody)),
    tag = "operations")]
pub async fn detail(
    State(app): State<App>,
    P(id): P<String>,
) -> ApiResult<Json<ImpairmentEventDetail>> {
    Ok(Json(read_detail(&app, &id).await?))
}

#[utoipa::path(post, path = "/api/v1/operations/impairment-events/{id}/clear", params(("id" = String, Path)),
    responses((status = 200, description = "The event as recorded: `release_pending`, with the devices still to release; follow it with GET", body = ImpairmentEventDetail),
        (status = 404, body = crate::error::ErrorBody),
        (status = 409, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)),
    tag = "operations")]
pub async fn clear(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
) -> ApiResult<Json<ImpairmentEventDetail>> {
    let accepted = app
        .workflow
        .clear_impairment(&id, &caller.token_id)
        .await
        .map_err(|e| error("clear_impairment", e))?;
    Ok(Json(read_detail(&app, &accepted.event_id).await?))
}
