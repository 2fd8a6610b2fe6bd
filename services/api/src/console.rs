//! The web console (`/ui/`): static assets compiled into the binary (no
//! JavaScript build step), reading the API with the operator's own token,
//! so it has exactly the token's scopes. Its live feed is
//! `GET /api/v1/events/status/`: STATUS events as server-sent events.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use fleet_proto::{v1, Message};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, Q};
use crate::App;

const INDEX: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/style.css");

/// The console's paths: open (they hold no data; every read behind them
/// carries the operator's token).
pub const UI_PATHS: &[&str] = &["/ui/", "/ui/app.js", "/ui/style.css"];

/// One feed lasts at most this long; the console reconnects at once (and
/// re-reads what it shows), as an `EventSource` would.
const WINDOW: Duration = Duration::from_secs(15);

pub fn router() -> Router<App> {
    let page = |body: &'static str, kind: &'static str| {
        get(move || async move {
            (
                [
                    (header::CONTENT_TYPE, kind),
                    (header::CACHE_CONTROL, "no-cache"),
                ],
                body,
            )
                .into_response()
        })
    };
    Router::new()
        .route(
            "/ui",
            get(|| async { axum::response::Redirect::permanent("/ui/") }),
        )
        .route("/ui/", page(INDEX, "text/html; charset=utf-8"))
        .route("/ui/app.js", page(APP_JS, "text/javascript; charset=utf-8"))
        .route("/ui/style.css", page(STYLE, "text/css; charset=utf-8"))
}

/// What the caller's token may do.
#[derive(Debug, Serialize, ToSchema)]
pub struct WhoAmI {
    pub token_id: String,
    /// Its scopes (`device:read`, `jobs:write`, ...).
    pub scopes: Vec<String>,
}

/// The caller's token and scopes (the console shows actions by them).
#[utoipa::path(get, path = "/api/v1/whoami/",
    responses((status = 200, body = WhoAmI), (status = 401, body = crate::error::ErrorBody)),
    tag = "tokens")]
pub async fn whoami(Extension(caller): Extension<Caller>) -> Json<WhoAmI> {
    Json(WhoAmI {
        token_id: caller.token_id,
        scopes: caller
            .scopes
            .iter()
            .map(|s| s.as_str().to_string())
            .collect(),
    })
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsFilter {
    /// Only this site's devices.
    pub site: Option<String>,
}

/// One status change as the feed sends it (the `data` of a `status` event).
#[derive(Debug, Serialize, ToSchema)]
pub struct StatusEvent {
    pub device_id: String,
    pub site: String,
    pub axis: String,
    pub from: String,
    pub to: String,
    pub version: i64,
}

/// STATUS as server-sent events (`event: status`, `data:` a
/// [`StatusEvent`]), live from the moment of the request, for up to 15 s a
/// connection (then the stream ends and the client reconnects).
#[utoipa::path(get, path = "/api/v1/events/status/", params(EventsFilter),
    responses((status = 200, content_type = "text/event-stream", body = String),
        (status = 400, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)),
    tag = "sites")]
pub async fn status(
    State(app): State<App>,
    Q(f): Q<EventsFilter>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let site = f.site.filter(|s| !s.is_empty());
    if let Some(s) = &site {
        if !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
        {
            return Err(ApiError::invalid(format!("{s:?} is not a site id")));
        }
    }
    let subject = app.subjects.status_all();
    let sub = app.nats.subscribe(subject).await.map_err(|e| {
        tracing::warn!(error = %e, "events: STATUS subscription failed");
        ApiError::unavailable("the live feed is unavailable")
    })?;
    let events = sub
        .filter_map(move |m| {
            let site = site.clone();
            async move {
                let c = v1::StatusChanged::decode(m.payload.as_ref()).ok()?;
                if site.as_deref().is_some_and(|s| s != c.site) {
                    return None;
                }
                let e = StatusEvent {
                    device_id: c.device_id,
                    site: c.site,
                    axis: c.axis,
                    from: c.from_value,
                    to: c.to,
                    version: c.version,
                };
                Event::default().event("status").json_data(&e).ok().map(Ok)
            }
        })
        .take_until(tokio::time::sleep(WINDOW));
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(5))))
}
