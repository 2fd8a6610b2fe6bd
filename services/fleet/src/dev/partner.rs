//! The simulated Borneo partner custody API, as connector-borneo reads it
//! (README "Borneo custody API"): an OAuth2 client-credentials token
//! endpoint (`POST /oauth2/token`, client authenticated with HTTP basic)
//! and `GET /v1/partners/<partner>/machines?page_size=&page_token=` with
//! the bearer token, one partner per site (`partner-<site>`). It lists the
//! machines the scenario has handed over (or that came back), with their
//! custody state; a `PARTNER_OWNED` machine carries a credential.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use crate::dev::engine::Custody;
use crate::dev::servers::{basic, body, header, App};

pub const CLIENT_ID: &str = "fleet-custody";
pub const CLIENT_SECRET: &str = "sim-borneo-client-secret";
const ACCESS_TOKEN: &str = "ya29.sim-borneo-access-token";

/// The Borneo partner id of a fleet site.
pub fn partner_of(site: &str) -> String {
    format!("partner-{site}")
}

pub(crate) fn router(app: App) -> Router {
    Router::new()
        .route("/oauth2/token", post(token))
        .route("/v1/partners/{partner}/machines", get(machines))
        .with_state(app)
}

async fn token(h: HeaderMap, form: String) -> Response {
    if header(&h, "authorization") != basic(CLIENT_ID, CLIENT_SECRET) {
        return body(
            StatusCode::UNAUTHORIZED,
            json!({"error": "invalid_client", "error_description": "client authentication failed"}),
        );
    }
    if !form
        .split('&')
        .any(|kv| kv == "grant_type=client_credentials")
    {
        return body(
            StatusCode::BAD_REQUEST,
            json!({"error": "unsupported_grant_type"}),
        );
    }
    body(
        StatusCode::OK,
        json!({"access_token": ACCESS_TOKEN, "token_type": "Bearer", "expires_in": 3599}),
    )
}

#[derive(serde::Deserialize)]
struct PageQuery {
    page_size: Option<usize>,
    page_token: Option<String>,
}

async fn machines(
    State(app): State<App>,
    Path(partner): Path<String>,
    Query(q): Query<PageQuery>,
    h: HeaderMap,
) -> Response {
    if header(&h, "authorization") != format!("Bearer {ACCESS_TOKEN}") {
        return body(
            StatusCode::UNAUTHORIZED,
            json!({"error": {"code": 401, "status": "UNAUTHENTICATED", "message": "invalid access token"}}),
        );
    }
    let size = q.page_size.unwrap_or(100).clamp(1, 1000);
    let start: usize = match q.page_token.as_deref().filter(|t| !t.is_empty()) {
        None => 0,
        Some(t) => match t.strip_prefix("o").and_then(|n| n.parse().ok()) {
            Some(n) => n,
            None => {
                return body(
                    StatusCode::BAD_REQUEST,
                    json!({"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "bad page_token"}}),
                )
            }
        },
    };
    let mut s = app.lock();
    let listed: Vec<usize> = s
        .devices
        .iter()
        .filter(|d| d.custody.is_some() && partner_of(&d.site) == partner)
        .map(|d| d.index)
        .collect();
    if !s.sites.iter().any(|site| partner_of(site) == partner) {
        return body(
            StatusCode::NOT_FOUND,
            json!({"error": {"code": 404, "status": "NOT_FOUND", "message": "no such partner"}}),
        );
    }
    let page: Vec<usize> = listed.iter().skip(start).take(size).copied().collect();
    let mut served = Vec::new();
    let machines: Vec<Value> = page
        .iter()
        .filter_map(|&i| {
            let d = &s.devices[i];
            let c = d.custody?;
            if c == Custody::GoogleOwned {
                served.push(i);
            }
            let mut m = json!({
                "serial": d.serial,
                "state": c.wire(),
                "state_changed_at": "2026-11-29T16:00:00Z",
            });
            if c == Custody::PartnerOwned {
                m["credential"] = json!({
                    "id": format!("cred-{}-{}", d.serial, d.credential_rotation),
                    "username": "root",
                    "password": format!("sim-{}-{}", d.uuid, d.credential_rotation),
                });
            }
            Some(m)
        })
        .collect();
    s.custody_served(&served);
    let next = if start + size < listed.len() {
        format!("o{}", start + size)
    } else {
        String::new()
    };
    body(
        StatusCode::OK,
        json!({"machines": machines, "next_page_token": next}),
    )
}
