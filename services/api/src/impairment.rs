//! Impairment events (seed 002): a cordon workflow, not a device axis.
//! Creating one records the event and each device as `pending`, then sets
//! each device's hold through the hub's `impairment_hold` command (the hub
//! quarantines and freezes the status); clearing removes the holds through
//! the hub, which re-derives. The Placement customer-ready trait removal and
//! restore belong to the workflow service, which does not exist yet: each
//! device row records that work as `pending`, visibly.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use fleet_proto::v1;
use serde::Deserialize;
use serde_json::json;
use sqlx::{Postgres, QueryBuilder};
use utoipa::{IntoParams, ToSchema};
use v1::hub_command::Command as C;

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, Code, J, P, Q};
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

async fn set_device(
    app: &App,
    event: &str,
    device: &str,
    status: &str,
    error: Option<&ApiError>,
) -> ApiResult<()> {
    sqlx::query(
        "UPDATE impairment_event_devices SET status = $3, error_code = $4, error_message = $5, \
         updated_at = now() WHERE event_id = $1 AND device_id = $2",
    )
    .bind(event)
    .bind(device)
    .bind(status)
    .bind(error.map(|e| e.code.as_str_name()))
    .bind(error.map(|e| e.message.clone()))
    .execute(&app.pool)
    .await?;
    Ok(())
}

async fn set_event(app: &App, event: &str, status: &str) -> ApiResult<()> {
    sqlx::query(
        "UPDATE impairment_events SET status = $2, updated_at = now(), \
         cleared_at = CASE WHEN $2 = 'cleared' THEN now() ELSE cleared_at END WHERE id = $1",
    )
    .bind(event)
    .bind(status)
    .execute(&app.pool)
    .await?;
    Ok(())
}

async fn hold(app: &App, caller: &Caller, event: &str, device: &str, set: bool) -> ApiResult<()> {
    let c = C::ImpairmentHold(v1::ImpairmentHold {
        device_id: device.to_string(),
        event_id: event.to_string(),
        set,
    });
    app.hub.command(&caller.token_id, 0, c).await.map(|_| ())
}

#[utoipa::path(post, operation_id = "create_impairment_event", path = "/api/v1/operations/impairment-events/",
    request_body = ImpairmentCreateBody,
    responses((status = 201, body = ImpairmentEventDetail), (status = 400, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)),
    tag = "operations")]
pub async fn create(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    J(b): J<ImpairmentCreateBody>,
) -> ApiResult<(StatusCode, Json<ImpairmentEventDetail>)> {
    let reason = b.reason.trim().to_string();
    if reason.is_empty() {
        return Err(ApiError::invalid("reason is required"));
    }
    let ids: BTreeSet<String> = b.device_ids.iter().map(|d| d.trim().to_string()).collect();
    if ids.is_empty() || ids.len() > 1000 || ids.contains("") {
        return Err(ApiError::invalid(
            "device_ids must name 1 to 1000 devices, none empty",
        ));
    }
    let ids: Vec<String> = ids.into_iter().collect();
    let found: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT id, operational_status, impairment_hold FROM devices \
         WHERE id = ANY($1) AND deleted_at IS NULL ORDER BY id",
    )
    .bind(&ids)
    .fetch_all(&app.pool)
    .await?;
    if found.len() != ids.len() {
        let missing: Vec<&String> = ids
            .iter()
            .filter(|i| !found.iter().any(|(f, _, _)| f == *i))
            .collect();
        return Err(ApiError::not_found(format!("{} device(s)", missing.len()))
            .with_details(json!({ "missing": missing })));
    }
    let held: Vec<(&String, &String)> = found
        .iter()
        .filter_map(|(id, _, h)| h.as_ref().map(|h| (id, h)))
        .collect();
    if !held.is_empty() {
        return Err(ApiError::new(
            Code::InvalidState,
            "some devices already carry an impairment hold",
        )
        .with_details(json!({ "held": held.iter().map(|(d, e)| json!({"device_id": d, "event_id": e})).collect::<Vec<_>>() })));
    }

    let event_id = format!("imp_{}", ulid::Ulid::new());
    let mut tx = app.pool.begin().await?;
    sqlx::query(
        "INSERT INTO impairment_events (id, status, reason, ticket_url, created_by) \
         VALUES ($1, 'accepted', $2, $3, $4)",
    )
    .bind(&event_id)
    .bind(&reason)
    .bind(b.ticket_url.filter(|t| !t.trim().is_empty()))
    .bind(&caller.token_id)
    .execute(&mut *tx)
    .await?;
    let statuses: Vec<String> = found.iter().map(|(_, s, _)| s.clone()).collect();
    sqlx::query(
        "INSERT INTO impairment_event_devices (event_id, device_id, status, pre_hold_operational_status, \
         placement_action, placement_status) \
         SELECT $1, d, 'pending', s, 'remove_customer_ready_trait', 'pending' FROM unnest($2::text[], $3::text[]) AS t(d, s)",
    )
    .bind(&event_id)
    .bind(&ids)
    .bind(&statuses)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;

    let mut cordoned = 0usize;
    let mut hub_down: Option<ApiError> = None;
    for id in &ids {
        if let Some(e) = &hub_down {
            let not_tried = ApiError::new(e.code, "not attempted: the hub was unavailable");
            set_device(&app, &event_id, id, "failed", Some(&not_tried)).await?;
            continue;
        }
        match hold(&app, &caller, &event_id, id, true).await {
            Ok(()) => {
                cordoned += 1;
                set_device(&app, &event_id, id, "cordoned", None).await?;
            }
            Err(e) => {
                set_device(&app, &event_id, id, "failed", Some(&e)).await?;
                if e.code == Code::Unavailable {
                    hub_down = Some(e);
                }
            }
        }
    }
    let status = if cordoned == ids.len() {
        "cordoned"
    } else if cordoned == 0 {
        "failed"
    } else {
        "partially_failed"
    };
    set_event(&app, &event_id, status).await?;
    if let Some(e) = hub_down {
        return Err(e.with_details(json!({"event_id": event_id, "status": status})));
    }
    Ok((
        StatusCode::CREATED,
        Json(read_detail(&app, &event_id).await?),
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
        if !EVENT_STATUSES.contains(&s.as_str()) {
            return Err(ApiError::invalid(format!(
                "unknown impairment event status {s:?}"
            )));
        }
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
    responses((status = 200, body = ImpairmentEventDetail), (status = 404, body = crate::error::ErrorBody),
        (status = 409, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)),
    tag = "operations")]
pub async fn clear(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    P(id): P<String>,
) -> ApiResult<Json<ImpairmentEventDetail>> {
    let current = read_detail(&app, &id).await?;
    match current.event.status.as_str() {
        "cleared" => {
            return Err(ApiError::new(
                Code::InvalidState,
                format!("impairment event {id} is already cleared"),
            ))
        }
        "accepted" => {
            return Err(ApiError::new(
                Code::InvalidState,
                format!("impairment event {id} is still being applied"),
            ))
        }
        _ => {}
    }
    set_event(&app, &id, "release_pending").await?;
    let mut failed = 0usize;
    let mut hub_down: Option<ApiError> = None;
    for d in current.devices.iter().filter(|d| d.status != "cleared") {
        if hub_down.is_some() {
            failed += 1;
            continue;
        }
        let restore = matches!(
            d.pre_hold_operational_status.as_str(),
            "available" | "in_use"
        );
        let outcome = hold(&app, &caller, &id, &d.device_id, false).await;
        let (status, note) = match &outcome {
            Ok(()) => ("cleared", None),
            // The device holds no hold of this event (it never got it, or
            // it is gone): nothing is left to remove.
            Err(e) if matches!(e.code, Code::InvalidState | Code::NotFound) => {
                ("cleared", Some(e.clone()))
            }
            Err(e) => {
                failed += 1;
                if e.code == Code::Unavailable {
                    hub_down = Some(e.clone());
                }
                ("release_failed", Some(e.clone()))
            }
        };
        set_device(&app, &id, &d.device_id, status, note.as_ref()).await?;
        if status == "cleared" {
            sqlx::query(
                "UPDATE impairment_event_devices SET placement_action = $3, placement_status = $4 \
                 WHERE event_id = $1 AND device_id = $2",
            )
            .bind(&id)
            .bind(&d.device_id)
            .bind(restore.then_some("restore_customer_ready_trait"))
            .bind(restore.then_some("pending"))
            .execute(&app.pool)
            .await?;
        }
    }
    let status = if failed == 0 {
        "cleared"
    } else {
        "release_failed"
    };
    set_event(&app, &id, status).await?;
    if let Some(e) = hub_down {
        return Err(e.with_details(json!({"event_id": id, "status": status})));
    }
    Ok(Json(read_detail(&app, &id).await?))
}
