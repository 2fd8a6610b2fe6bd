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
use fleet_workflow_client::WorkflowError;
use serde::Deserialize;
use sqlx::{Postgres, QueryBuilder};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::call::Call;
use crate::error::{ApiError, ApiResult, J, P, Q};
use crate::jobs::{error, ConfirmBody, StormGuard, StormTrip};
use crate::model::*;
use crate::page::Keyset;
use crate::{db, App};

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

/// The storm guard's hold on an event, when it held it.
async fn storm_guard(app: &App, id: &str) -> ApiResult<Option<StormGuard>> {
    type Row = (bool, Option<String>, Option<DateTime<Utc>>, Option<String>);
    let Some((awaiting, by, at, reason)): Option<Row> = sqlx::query_as(
        "SELECT awaiting_confirmation, confirmed_by, confirmed_at, confirm_reason \
         FROM impairment_events WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&app.pool)
    .await?
    else {
        return Ok(None);
    };
    if !awaiting && at.is_none() {
        return Ok(None);
    }
    let trips: Vec<StormTrip> = sqlx::query_as(
        "SELECT scope_kind, scope_id, in_service, taking, in_window, device_limit AS \"limit\" \
         FROM storm_trips WHERE kind = 'impairment' AND id = $1 ORDER BY scope_kind, scope_id",
    )
    .bind(id)
    .fetch_all(&app.pool)
    .await?;
    Ok(Some(StormGuard {
        awaiting_confirmation: awaiting,
        trips,
        confirmed_by: by,
        confirmed_at: at,
        confirm_reason: reason,
    }))
}

async fn read_detail(app: &App, id: &str) -> ApiResult<ImpairmentEventDetail> {
    let sql = format!("SELECT {EVENT_COLUMNS} FROM impairment_events e WHERE e.id = $1");
    let event: ImpairmentEvent = db::one(app, &sql, id, "impairment event").await?;
    let devices: Vec<ImpairmentEventDevice> = sqlx::query_as(
        "SELECT device_id, status, pre_hold_operational_status, placement_action, placement_status, \
         error_code, error_message, updated_at FROM impairment_event_devices WHERE event_id = $1 \
         ORDER BY device_id",
    )
    .bind(id)
    .fetch_all(&app.pool)
    .await?;
    let storm_guard = storm_guard(app, id).await?;
    Ok(ImpairmentEventDetail {
        event,
        devices,
        storm_guard,
    })
}

/// The event the workflow service accepted, as now recorded; or its
/// refusal as the API's error (`verb` names the call).
async fn accepted(
    app: &App,
    verb: &str,
    answer: Result<v1::ImpairmentAccepted, WorkflowError>,
) -> ApiResult<ImpairmentEventDetail> {
    let accepted = answer.map_err(|e| error(verb, e))?;
    read_detail(app, &accepted.event_id).await
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
    let answer = app.workflow.create_impairment(&r).await;
    let event = accepted(&app, "create_impairment", answer).await?;
    Ok((StatusCode::CREATED, Json(event)))
}

crate::page::page_query! {
    pub struct ImpairmentFilter {
        #[param(schema_with = event_status_schema)]
        pub status: Option<String>,
    }
}

#[utoipa::path(get, operation_id = "list_impairment_events", path = "/api/v1/operations/impairment-events/", params(ImpairmentFilter),
    responses((status = 200, body = ImpairmentPage), (status = 400, body = crate::error::ErrorBody)),
    tag = "operations")]
pub async fn list(
    State(app): State<App>,
    Q(f): Q<ImpairmentFilter>,
) -> ApiResult<Json<ImpairmentPage>> {
    let page = f.page(&app)?;
    let mut qb = QueryBuilder::<Postgres>::new(format!(
        "SELECT {EVENT_COLUMNS} FROM impairment_events e WHERE true"
    ));
    if let Some(s) = &f.status {
        fleet_domain::impairment::EventStatus::parse(s)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        qb.push(" AND e.status = ").push_bind(s.clone());
    }
    let newest_first = Keyset::descending(&["e.created_at", "e.id"]);
    let (items, next_cursor) = page
        .fetch(&app, qb, newest_first, |e: &ImpairmentEvent| {
            (e.created_at, e.id.clone())
        })
        .await?;
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
pub async fn clear(Call { app, caller, id }: Call) -> ApiResult<Json<ImpairmentEventDetail>> {
    let answer = app.workflow.clear_impairment(&id, &caller.token_id).await;
    accepted(&app, "clear_impairment", answer).await.map(Json)
}

#[utoipa::path(post, operation_id = "confirm_impairment_event", path = "/api/v1/operations/impairment-events/{id}/confirm", params(("id" = String, Path)),
    request_body = ConfirmBody,
    responses((status = 200, description = "Confirmed: its cordon is queued (confirming again answers the same)", body = ImpairmentEventDetail),
        (status = 400, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody),
        (status = 409, description = "Not held by the storm guard", body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)),
    tag = "operations")]
pub async fn confirm(
    Call { app, caller, id }: Call,
    J(b): J<ConfirmBody>,
) -> ApiResult<Json<ImpairmentEventDetail>> {
    let answer = app
        .workflow
        .confirm_impairment(&b.request(id, &caller))
        .await;
    accepted(&app, "confirm_impairment", answer).await.map(Json)
}
