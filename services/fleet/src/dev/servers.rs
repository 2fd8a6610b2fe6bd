//! The simulated external systems: NetBox (devices and cabled
//! interfaces), Keystone + Ironic + Placement, slurmrestd, Prometheus, and
//! (in [`crate::dev::partner`] and [`crate::dev::fabric`]) the Borneo custody API,
//! the switches' NVUE and NMX-M, each an axum server on 127.0.0.1 port 0
//! serving the real JSON shapes from the scenario engine's state, so the
//! real connectors run unchanged against them. Every site is a path prefix
//! (`/<site>/...`), every switch too (`/<switch>/nvue_v1/...`).

// A refusal is the HTTP response the handler answers with: the gates
// return it as their error, whatever its size.
#![allow(clippy::result_large_err)]

use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::dev::engine::{Scenario, SimDevice, CUSTOMER_READY_TRAIT};
use crate::dev::ironic;
use crate::dev::nova;

pub const NETBOX_TOKEN: &str = "0123456789abcdef0123456789abcdef0123dead";
pub const OPENSTACK_USER: &str = "fleet";
pub const OPENSTACK_PASSWORD: &str = "sim-password";
pub const OPENSTACK_PROJECT: &str = "service";
pub(crate) const KEYSTONE_TOKEN: &str = "gAAAAAsim-keystone-token";

pub type Shared = Arc<Mutex<Scenario>>;

#[derive(Clone)]
pub(crate) struct App {
    pub(crate) scenario: Shared,
    pub(crate) base: String,
}

impl App {
    /// The scenario, locked (a panic elsewhere does not poison it for the
    /// simulated systems).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Scenario> {
        self.scenario.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(crate) fn body(status: StatusCode, v: Value) -> Response {
    (status, axum::Json(v)).into_response()
}

pub(crate) fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// The addresses of the simulated systems.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub netbox: String,
    pub openstack: String,
    pub slurm: String,
    pub prometheus: String,
    /// Borneo: the custody API and its OAuth2 token endpoint.
    pub borneo: String,
    /// Every switch's NVUE, under `/<switch>/`.
    pub nvue: String,
    /// NMX-M of every site, under `/<site>/`.
    pub nmx: String,
}

impl Endpoints {
    pub fn all(&self) -> [&String; 7] {
        [
            &self.netbox,
            &self.openstack,
            &self.slurm,
            &self.prometheus,
            &self.borneo,
            &self.nvue,
            &self.nmx,
        ]
    }
}

/// Starts the servers; they stop when their tasks are aborted.
pub async fn start(scenario: Shared) -> anyhow::Result<(Endpoints, Vec<JoinHandle<()>>)> {
    let mut tasks = Vec::new();
    let mut serve = |router: fn(App) -> Router, listener: TcpListener, base: String| {
        let app = App {
            scenario: scenario.clone(),
            base,
        };
        let r = router(app);
        tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, r).await {
                tracing::error!(error = %e, "simulated system stopped");
            }
        }));
    };
    let mut urls = Vec::new();
    for router in [
        netbox as fn(App) -> Router,
        openstack,
        slurm,
        prometheus,
        crate::dev::partner::router,
        crate::dev::fabric::nvue_router,
        crate::dev::fabric::nmx_router,
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        urls.push(base.clone());
        serve(router, listener, base);
    }
    Ok((
        Endpoints {
            netbox: urls[0].clone(),
            openstack: urls[1].clone(),
            slurm: urls[2].clone(),
            prometheus: urls[3].clone(),
            borneo: urls[4].clone(),
            nvue: urls[5].clone(),
            nmx: urls[6].clone(),
        },
        tasks,
    ))
}

// ---- NetBox 4: GET /api/dcim/devices/?site=<slug>&limit=&offset= ----

fn netbox(app: App) -> Router {
    Router::new()
        .route("/api/dcim/devices/", get(netbox_devices))
        .route(
            "/api/dcim/interfaces/",
            get(crate::dev::fabric::netbox_interfaces),
        )
        .with_state(app)
}

#[derive(serde::Deserialize)]
struct NetboxQuery {
    site: Option<String>,
    limit: Option<usize>,
    offset: Option<usize>,
}

/// NetBox's answer to a request without the simulated token.
pub(crate) fn netbox_auth(h: &HeaderMap) -> Option<Response> {
    (header(h, "authorization") != format!("Token {NETBOX_TOKEN}"))
        .then(|| body(StatusCode::FORBIDDEN, json!({"detail": "Invalid v1 token"})))
}

/// `Basic <base64(user:password)>`.
pub(crate) fn basic(user: &str, password: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let input = format!("{user}:{password}").into_bytes();
    let mut out = String::from("Basic ");
    for c in input.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= c.len() {
                out.push(T[(n >> shift & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

async fn netbox_devices(
    State(app): State<App>,
    Query(q): Query<NetboxQuery>,
    h: HeaderMap,
) -> Response {
    if let Some(refused) = netbox_auth(&h) {
        return refused;
    }
    let limit = q.limit.unwrap_or(50).clamp(1, 1000);
    let offset = q.offset.unwrap_or(0);
    let s = app.lock();
    let site = q.site.unwrap_or_default();
    let all: Vec<_> = s
        .devices
        .iter()
        .filter(|d| site.is_empty() || d.site == site)
        .collect();
    let results: Vec<Value> = all
        .iter()
        .skip(offset)
        .take(limit)
        .map(|d| {
            json!({
                "id": d.netbox_id,
                "url": format!("{}/api/dcim/devices/{}/", app.base, d.netbox_id),
                "display": d.name, "name": d.name,
                "role": {"id": 1, "name": "GPU Server", "slug": "gpu-server"},
                "serial": d.serial, "asset_tag": null,
                "site": {"id": 1, "name": d.site.to_uppercase(), "slug": d.site},
                "rack": {"id": 1, "name": d.rack},
                "status": {"value": "active", "label": "Active"},
                "tags": [{"id": 5, "name": "Provisioned", "slug": "provisioned", "color": "4caf50"}],
                "custom_fields": {}, "primary_ip4": null, "oob_ip": null,
                "last_updated": "2026-11-29T16:00:09.854406Z"
            })
        })
        .collect();
    let next = (offset + limit < all.len()).then(|| {
        format!(
            "{}/api/dcim/devices/?limit={limit}&offset={}&site={site}",
            app.base,
            offset + limit
        )
    });
    body(
        StatusCode::OK,
        json!({"count": all.len(), "next": next, "previous": null, "results": results}),
    )
}

// ---- Keystone v3, Ironic, Nova, Placement, per site under /<site>/ ----

fn openstack(app: App) -> Router {
    Router::new()
        .route("/{site}/identity/v3/auth/tokens", post(keystone_tokens))
        .route("/{site}/ironic/v1/nodes", get(ironic_nodes))
        .route(
            "/{site}/ironic/v1/nodes/{ident}",
            get(ironic::node).patch(ironic::patch),
        )
        .route(
            "/{site}/ironic/v1/nodes/{ident}/states/provision",
            put(ironic::provision),
        )
        .route(
            "/{site}/ironic/v1/nodes/{ident}/states/power",
            put(ironic::power),
        )
        .route(
            "/{site}/ironic/v1/nodes/{ident}/traits",
            get(ironic::traits),
        )
        .route(
            "/{site}/ironic/v1/nodes/{ident}/traits/{name}",
            put(ironic::add_trait).delete(ironic::remove_trait),
        )
        .route("/{site}/compute/v2.1/servers", post(nova::create))
        .route("/{site}/compute/v2.1/servers/detail", get(nova::detail))
        .route(
            "/{site}/compute/v2.1/servers/{id}",
            get(nova::show).delete(nova::delete),
        )
        .route("/{site}/placement/resource_providers", get(placement_rps))
        .route(
            "/{site}/placement/resource_providers/{uuid}/traits",
            get(placement_traits).put(placement_put_traits),
        )
        .with_state(app)
}

async fn keystone_tokens(
    State(app): State<App>,
    Path(site): Path<String>,
    axum::Json(req): axum::Json<Value>,
) -> Response {
    let user = &req["auth"]["identity"]["password"]["user"];
    if user["name"] != OPENSTACK_USER
        || user["password"] != OPENSTACK_PASSWORD
        || req["auth"]["scope"]["project"]["name"] != OPENSTACK_PROJECT
    {
        return body(
            StatusCode::UNAUTHORIZED,
            json!({"error": {"code": 401, "title": "Unauthorized", "message": "The request you have made requires authentication."}}),
        );
    }
    let base = format!("{}/{site}", app.base);
    let expires = chrono::Utc::now() + chrono::Duration::hours(2);
    let ep = |url: String| json!([{"interface": "public", "region": "RegionOne", "region_id": "RegionOne", "url": url}]);
    let token = json!({"token": {
        "methods": ["password"],
        "expires_at": expires.to_rfc3339(),
        "project": {"id": "p-service", "name": OPENSTACK_PROJECT, "domain": {"id": "default", "name": "Default"}},
        "catalog": [
            {"type": "identity", "name": "keystone", "endpoints": ep(format!("{base}/identity/v3"))},
            {"type": "baremetal", "name": "ironic", "endpoints": ep(format!("{base}/ironic"))},
            {"type": "placement", "name": "placement", "endpoints": ep(format!("{base}/placement"))},
            {"type": "compute", "name": "nova", "endpoints": ep(format!("{base}/compute/v2.1"))}
        ]
    }});
    (
        StatusCode::CREATED,
        [("X-Subject-Token", KEYSTONE_TOKEN)],
        axum::Json(token),
    )
        .into_response()
}

pub(crate) fn ironic_error(status: StatusCode, fault: &str) -> Response {
    // Ironic double-encodes its errors.
    let inner = json!({"faultcode": "Client", "faultstring": fault, "debuginfo": null});
    body(status, json!({"error_message": inner.to_string()}))
}

#[derive(serde::Deserialize)]
struct NodesQuery {
    detail: Option<String>,
    limit: Option<usize>,
    marker: Option<String>,
}

async fn ironic_nodes(
    State(app): State<App>,
    Path(site): Path<String>,
    Query(q): Query<NodesQuery>,
    h: HeaderMap,
) -> Response {
    if header(&h, "x-auth-token") != KEYSTONE_TOKEN {
        return ironic_error(StatusCode::UNAUTHORIZED, "Authentication required");
    }
    if q.detail.as_deref().map(str::to_ascii_lowercase).as_deref() != Some("true") {
        return ironic_error(StatusCode::BAD_REQUEST, "expected detail=true");
    }
    let s = app.lock();
    if s.outages.ironic {
        return ironic_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "simulated outage: ironic-api is down",
        );
    }
    let nodes: Vec<_> = s.devices.iter().filter(|d| d.site == site).collect();
    let limit = q.limit.unwrap_or(1000).clamp(1, 1000);
    let start = match &q.marker {
        None => 0,
        Some(m) => match nodes.iter().position(|d| d.uuid == *m) {
            Some(i) => i + 1,
            None => {
                return ironic_error(
                    StatusCode::BAD_REQUEST,
                    &format!("Marker {m} could not be found."),
                )
            }
        },
    };
    let page: Vec<Value> = nodes
        .iter()
        .skip(start)
        .take(limit)
        .map(|d| ironic::node_json(d))
        .collect();
    let mut out = json!({ "nodes": page });
    if start + limit < nodes.len() {
        if let Some(last) = nodes.get(start + limit - 1) {
            out["next"] = format!(
                "{}/{site}/ironic/v1/nodes?detail=True&limit={limit}&marker={}",
                app.base, last.uuid
            )
            .into();
        }
    }
    body(StatusCode::OK, out)
}

#[derive(serde::Deserialize)]
struct RpQuery {
    required: Option<String>,
}

async fn placement_rps(
    State(app): State<App>,
    Path(site): Path<String>,
    Query(q): Query<RpQuery>,
    h: HeaderMap,
) -> Result<Response, Response> {
    placement_auth(&h)?;
    let required = q.required.unwrap_or_default();
    let s = app.lock();
    let rps: Vec<Value> = s
        .devices
        .iter()
        .filter(|d| d.site == site && (required.is_empty() || (required == CUSTOMER_READY_TRAIT && d.customer_ready)))
        .map(|d| json!({"uuid": d.uuid, "name": d.uuid, "generation": 2, "root_provider_uuid": d.uuid, "parent_provider_uuid": null}))
        .collect();
    Ok(body(StatusCode::OK, json!({ "resource_providers": rps })))
}

/// The traits every simulated provider carries besides customer-ready.
const HARDWARE_TRAIT: &str = "CUSTOM_GPU_H100";

fn placement_error(status: StatusCode, detail: &str) -> Response {
    body(
        status,
        json!({"errors": [{"status": status.as_u16(), "title": status.canonical_reason(), "detail": detail}]}),
    )
}

/// The token check every Placement call makes.
fn placement_auth(h: &HeaderMap) -> Result<(), Response> {
    if header(h, "x-auth-token") != KEYSTONE_TOKEN {
        return Err(placement_error(StatusCode::UNAUTHORIZED, "unauthorized"));
    }
    Ok(())
}

/// The resource provider `uuid` at `site`: a node of the scenario.
fn provider<'a>(
    s: &'a mut Scenario,
    site: &str,
    uuid: &str,
) -> Result<&'a mut SimDevice, Response> {
    s.by_uuid_mut(uuid)
        .filter(|d| d.site == site)
        .ok_or_else(|| {
            placement_error(
                StatusCode::NOT_FOUND,
                &format!("No resource provider with uuid {uuid} found"),
            )
        })
}

fn traits_of(d: &SimDevice) -> Value {
    let mut t = vec![HARDWARE_TRAIT];
    if d.customer_ready {
        t.insert(0, CUSTOMER_READY_TRAIT);
    }
    json!({"traits": t, "resource_provider_generation": d.placement_generation})
}

/// `GET /resource_providers/{uuid}/traits` (placement 1.6+).
async fn placement_traits(
    State(app): State<App>,
    Path((site, uuid)): Path<(String, String)>,
    h: HeaderMap,
) -> Result<Response, Response> {
    placement_auth(&h)?;
    let mut s = app.lock();
    Ok(body(
        StatusCode::OK,
        traits_of(provider(&mut s, &site, &uuid)?),
    ))
}

/// `PUT /resource_providers/{uuid}/traits`: the whole list under the
/// generation it was read at (409 when it moved on). The customer-ready
/// trait is what the scenario keeps; the others are fixed.
async fn placement_put_traits(
    State(app): State<App>,
    Path((site, uuid)): Path<(String, String)>,
    h: HeaderMap,
    axum::Json(req): axum::Json<Value>,
) -> Result<Response, Response> {
    placement_auth(&h)?;
    let (Some(traits), Some(generation)) = (
        req["traits"].as_array(),
        req["resource_provider_generation"].as_i64(),
    ) else {
        return Err(placement_error(
            StatusCode::BAD_REQUEST,
            "traits and resource_provider_generation are required",
        ));
    };
    let ready = traits.iter().any(|t| t == CUSTOMER_READY_TRAIT);
    let mut s = app.lock();
    let d = provider(&mut s, &site, &uuid)?;
    if d.placement_generation != generation {
        return Err(placement_error(
            StatusCode::CONFLICT,
            "resource provider generation conflict",
        ));
    }
    d.customer_ready = ready;
    d.placement_generation += 1;
    Ok(body(StatusCode::OK, traits_of(d)))
}

// ---- slurmrestd v0.0.38, per site under /<site>/ ----

fn slurm(app: App) -> Router {
    let r = Router::new()
        .route("/{site}/openapi/v3", get(slurm_openapi))
        .route("/{site}/slurm/{v}/ping", get(slurm_ping))
        .route("/{site}/slurm/{v}/nodes", get(slurm_nodes));
    crate::dev::burn_in::routes(r).with_state(app)
}

pub(crate) fn slurm_meta() -> Value {
    json!({"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
        "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"}})
}

pub(crate) fn slurm_not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "Unable find requested URL. Please view /openapi/v3 for API reference.",
    )
        .into_response()
}

async fn slurm_openapi() -> Response {
    body(
        StatusCode::OK,
        json!({"openapi": "3.0.2", "paths": {"/slurm/v0.0.38/nodes": {}, "/slurm/v0.0.38/ping": {},
            "/slurm/v0.0.38/job/submit": {}, "/slurm/v0.0.38/job/{job_id}": {}, "/slurm/v0.0.38/jobs": {}}}),
    )
}

async fn slurm_ping(Path((_site, v)): Path<(String, String)>) -> Response {
    if v != "v0.0.38" {
        return slurm_not_found();
    }
    body(
        StatusCode::OK,
        json!({"meta": slurm_meta(), "errors": [], "pings": [{"hostname": "slurmctld", "ping": "UP", "status": 0, "mode": "primary"}]}),
    )
}

async fn slurm_nodes(State(app): State<App>, Path((site, v)): Path<(String, String)>) -> Response {
    if v != "v0.0.38" {
        return slurm_not_found();
    }
    let s = app.lock();
    if s.outages.slurm {
        return body(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"errors": [{"error": "simulated outage: Unable to contact slurm controller (connect failure)", "error_number": 1007}]}),
        );
    }
    let nodes: Vec<Value> = s
        .devices
        .iter()
        .filter(|d| d.site == site)
        .filter_map(|d| {
            let (state, flags) = d.slurm?.wire();
            Some(json!({
                "name": d.name, "hostname": d.name, "address": d.name,
                "state": state, "state_flags": flags,
                "reason": if flags.is_empty() && state == "idle" { "" } else { "sim: validation" },
                "partitions": ["maintenance"], "gres": "gpu:h100:8",
                "cpus": 64, "real_memory": 512000
            }))
        })
        .collect();
    body(
        StatusCode::OK,
        json!({"meta": slurm_meta(), "errors": [], "warnings": [], "nodes": nodes}),
    )
}

// ---- Prometheus / Mimir: GET /<site>/api/v1/query?query=<metric> ----

fn prometheus(app: App) -> Router {
    Router::new()
        .route("/{site}/api/v1/query", get(prometheus_query))
        .with_state(app)
}

#[derive(serde::Deserialize)]
struct PromQuery {
    query: Option<String>,
}

/// The health series of every host, in the connector's encoding (0 Ok,
/// 1 Warning, 2 Critical): `chassis_health` is the device's reading and
/// the thermal component explains a bad one; the other components are Ok;
/// no FPGA series (these hosts have none).
async fn prometheus_query(
    State(app): State<App>,
    Path(site): Path<String>,
    Query(q): Query<PromQuery>,
) -> Response {
    let Some(metric) = q.query.filter(|m| !m.trim().is_empty()) else {
        return body(
            StatusCode::BAD_REQUEST,
            json!({"status": "error", "errorType": "bad_data", "error": "query is required"}),
        );
    };
    let now = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
    let s = app.lock();
    let value = |d: &SimDevice| -> Option<u8> {
        match metric.as_str() {
            "chassis_health" | "redfish_thermal_health" => Some(d.health),
            "nvidia_fpga_health" => None,
            _ => Some(0),
        }
    };
    let result: Vec<Value> = s
        .devices
        .iter()
        .filter(|d| d.site == site)
        .filter_map(|d| {
            let v = value(d)?;
            Some(
                json!({"metric": {"__name__": metric, "host": d.name, "job": "redfish"},
                        "value": [now, v.to_string()]}),
            )
        })
        .collect();
    body(
        StatusCode::OK,
        json!({"status": "success", "data": {"resultType": "vector", "result": result}}),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn basic_authorization_is_base64() {
        assert_eq!(
            super::basic("Aladdin", "open sesame"),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(super::basic("a", "b"), "Basic YTpi");
        assert_eq!(super::basic("ab", "c"), "Basic YWI6Yw==");
    }
}
