//! The simulated fabric, in the contracts connector-fabric reads and the
//! workflow service writes (`fleet_fabric`): NetBox cables (`GET
//! /api/dcim/interfaces/`, on the simulated NetBox, switch-side or
//! device-side), each leaf's NVUE (`GET /<switch>/nvue_v1/interface`, and
//! its revision cycle: `POST .../revision`, `PATCH .../interface?rev=`,
//! `PATCH`/`GET .../revision/<rev>`; HTTP basic) and each site's NMX-M
//! (`GET /<site>/nmx/v1/partitions`, `/gpus`, `/compute-nodes`, `PUT
//! .../partitions/<id>`, `GET .../operations/<op>`; HTTP basic). A revision
//! applies on the scenario's devices, a partition update moves their GPUs:
//! the ground truth follows the writes.
//!
//! Every rack has a front-end leaf `fe-<rack>` and a back-end leaf
//! `be-<rack>`; device `k` of the rack is cabled to `swp<k+1>` of both
//! (`eth0` front-end, `ens1f0` back-end), and `swp49` of each leaf goes to
//! the site's spine (`exclude_peers = ["spine-*"]`). An idle front-end
//! port is a routed port in VRF `isolate`; a handed-over device's port is a
//! bridge access port whose SVI is in its customer VRF `cust-<n>`. Back-end
//! ports are routed, in `tenant-be` or `maint`. Each device has 8 GPUs;
//! NMX-M has them in the `default` or the `repair` partition.

// A refusal is the HTTP response the handler answers with: the gates
// return it as their error, whatever its size.
#![allow(clippy::result_large_err)]

use std::collections::BTreeSet;
use std::sync::MutexGuard;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Map, Value};

use crate::dev::engine::{
    backend_switch, frontend_switch, switch_port, Scenario, SimDevice, CUSTOMER_VRF_PREFIX,
    DEFAULT_PARTITION_ID, GPUS_PER_DEVICE, RACK_SIZE, REPAIR_PARTITION, REPAIR_PARTITION_ID,
};
use crate::dev::servers::{basic, body, header, netbox_auth, App};

pub const NVUE_USER: &str = "fleet-ro";
pub const NVUE_PASSWORD: &str = "sim-nvue-password";
pub const NMX_USER: &str = "fleet";
pub const NMX_PASSWORD: &str = "sim-nmx-password";
pub const FRONTEND_PORT: &str = "eth0";
pub const BACKEND_PORT: &str = "ens1f0";
const UPLINK: &str = "swp49";

pub fn spine_of(site: &str) -> String {
    format!("spine-{site}")
}

fn unauthorized() -> Response {
    body(
        StatusCode::UNAUTHORIZED,
        json!({"status": 401, "title": "Unauthorized", "detail": "authentication required"}),
    )
}

/// The rack and plane a leaf name stands for: `(rack, frontend)`.
fn leaf(name: &str) -> Option<(&str, bool)> {
    if let Some(r) = name.strip_prefix("fe-") {
        Some((r, true))
    } else {
        name.strip_prefix("be-").map(|r| (r, false))
    }
}

fn endpoint(id: usize, device: &str, port: &str) -> Value {
    json!([{"id": id, "display": port, "name": port,
            "device": {"id": id, "display": device, "name": device}, "_occupied": true}])
}

fn cabled(id: usize, switch: &str, port: &str, device: &str, device_port: &str) -> Value {
    json!({
        "id": id,
        "display": port,
        "device": {"id": id, "display": switch, "name": switch},
        "name": port,
        "type": {"value": "100gbase-x-qsfp28", "label": "QSFP28 (100GE)"},
        "enabled": true,
        "cable": {"id": id, "display": format!("#{id}")},
        "cable_end": "A",
        "link_peers": endpoint(id + 1, device, device_port),
        "link_peers_type": "dcim.interface",
        "connected_endpoints": endpoint(id + 1, device, device_port),
        "connected_endpoints_type": "dcim.interface",
        "connected_endpoints_reachable": true
    })
}

/// `GET /api/dcim/interfaces/?site=<slug>&cabled=true&device=<sw>...&limit=&offset=`.
pub(crate) async fn netbox_interfaces(
    State(app): State<App>,
    Query(q): Query<Vec<(String, String)>>,
    h: HeaderMap,
) -> Response {
    if let Some(refused) = netbox_auth(&h) {
        return refused;
    }
    let one = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let site = one("site").unwrap_or("").to_string();
    let limit: usize = one("limit")
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
        .clamp(1, 1000);
    let offset: usize = one("offset").and_then(|v| v.parse().ok()).unwrap_or(0);
    let switches: BTreeSet<&str> = q
        .iter()
        .filter(|(n, _)| n == "device")
        .map(|(_, v)| v.as_str())
        .collect();
    let s = app.lock();
    let mut all = Vec::new();
    // Device-side: a device's own cabled interfaces, far ends on its leaves.
    let mut device_side = vec![];
    for name in switches.iter().filter(|n| leaf(n).is_none()) {
        if let Some(d) = s.by_name(name) {
            if site.is_empty() || d.site == site {
                for (dport, sw) in [
                    (FRONTEND_PORT, frontend_switch(&d.rack)),
                    (BACKEND_PORT, backend_switch(&d.rack)),
                ] {
                    device_side.push((d.name.clone(), dport.to_string(), sw, switch_port(d)));
                }
            }
        }
    }
    for sw in &switches {
        let Some((rack, frontend)) = leaf(sw) else {
            continue;
        };
        let Some(members) = s.racks.get(rack) else {
            continue;
        };
        for &i in members {
            let d = &s.devices[i];
            if !site.is_empty() && d.site != site {
                continue;
            }
            let dport = if frontend {
                FRONTEND_PORT
            } else {
                BACKEND_PORT
            };
            all.push((*sw, switch_port(d), d.name.clone(), dport.to_string()));
        }
        if let Some(&first) = members.first() {
            let d = &s.devices[first];
            let spine_port = format!("swp{}", first / RACK_SIZE + 1);
            all.push((*sw, UPLINK.to_string(), spine_of(&d.site), spine_port));
        }
    }
    // Interface ids: the position in this (stable) listing.
    let listed = all.len() + device_side.len();
    let results: Vec<Value> = all
        .iter()
        .map(|(sw, port, dev, dport)| (sw.to_string(), port, dev, dport))
        .chain(
            device_side
                .iter()
                .map(|(dev, dport, sw, port)| (dev.clone(), dport, sw, port)),
        )
        .enumerate()
        .skip(offset)
        .take(limit)
        .map(|(k, (owner, port, far, far_port))| cabled(2 * k + 1, &owner, port, far, far_port))
        .collect();
    let next = (offset + limit < listed).then(|| {
        let mut u = format!(
            "{}/api/dcim/interfaces/?site={site}&cabled=true&limit={limit}&offset={}",
            app.base,
            offset + limit
        );
        for sw in &switches {
            u.push_str(&format!("&device={sw}"));
        }
        u
    });
    body(
        StatusCode::OK,
        json!({"count": listed, "next": next, "previous": null, "results": results}),
    )
}

// ---- NVUE: GET /<switch>/nvue_v1/interface?rev=operational ----

pub(crate) fn nvue_router(app: App) -> Router {
    Router::new()
        .route(
            "/{switch}/nvue_v1/interface",
            get(nvue_interfaces).patch(nvue_stage),
        )
        .route("/{switch}/nvue_v1/revision", post(nvue_create_revision))
        .route(
            "/{switch}/nvue_v1/revision/{rev}",
            get(nvue_revision).patch(nvue_apply),
        )
        .with_state(app)
}

fn nvue_down() -> Response {
    body(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"status": 503, "title": "Service Unavailable", "detail": "simulated outage: nvued is not running"}),
    )
}

/// The scenario, locked, for a caller with the leaf's credentials while the
/// leaf is answering.
fn nvue_scenario<'a>(
    app: &'a App,
    switch: &str,
    h: &HeaderMap,
) -> Result<MutexGuard<'a, Scenario>, Response> {
    if header(h, "authorization") != basic(NVUE_USER, NVUE_PASSWORD) {
        return Err(unauthorized());
    }
    let s = app.lock();
    match leaf(switch) {
        Some((rack, frontend)) if s.switch_out(rack, frontend) => Err(nvue_down()),
        _ => Ok(s),
    }
}

fn no_such(what: &str) -> Response {
    body(
        StatusCode::NOT_FOUND,
        json!({"status": 404, "title": "Not Found", "detail": format!("no such {what}")}),
    )
}

/// `POST /<switch>/nvue_v1/revision`: a new pending revision.
async fn nvue_create_revision(
    State(app): State<App>,
    Path(switch): Path<String>,
    h: HeaderMap,
) -> Result<Response, Response> {
    let mut s = nvue_scenario(&app, &switch, &h)?;
    if leaf(&switch).is_none() {
        return Err(no_such("switch"));
    }
    let id = format!("changeset/fleet/{}", s.revisions.len() + 1);
    s.revisions
        .insert(id.clone(), (switch, Vec::new(), "pending"));
    Ok(body(
        StatusCode::OK,
        json!({ id: {"state": "pending", "transition": {"issue": {}, "progress": ""}} }),
    ))
}

/// `PATCH /<switch>/nvue_v1/interface?rev=<rev>`: stage port VRFs
/// (`{"<port>": {"ip": {"vrf": "<vrf>"}}}`).
async fn nvue_stage(
    State(app): State<App>,
    Path(switch): Path<String>,
    Query(q): Query<RevQuery>,
    h: HeaderMap,
    axum::Json(changes): axum::Json<Map<String, Value>>,
) -> Result<Response, Response> {
    let mut s = nvue_scenario(&app, &switch, &h)?;
    let Some(rev) = q.rev.and_then(|r| s.revisions.get_mut(&r)) else {
        return Err(no_such("revision"));
    };
    if rev.0 != switch || rev.2 != "pending" {
        return Err(body(
            StatusCode::BAD_REQUEST,
            json!({"status": 400, "title": "Bad Request", "detail": "the revision is not pending on this switch"}),
        ));
    }
    for (port, v) in changes {
        let Some(vrf) = v.pointer("/ip/vrf").and_then(Value::as_str) else {
            return Err(body(
                StatusCode::BAD_REQUEST,
                json!({"status": 400, "title": "Bad Request", "detail": format!("{port}: only ip.vrf is simulated")}),
            ));
        };
        rev.1.push((port, vrf.to_string()));
    }
    Ok(body(StatusCode::OK, json!({})))
}

/// `PATCH /<switch>/nvue_v1/revision/<rev>` with `{"state": "apply"}`:
/// applied at once on the scenario (`apply_fail` when the scenario refuses
/// a change).
async fn nvue_apply(
    State(app): State<App>,
    Path((switch, rev)): Path<(String, String)>,
    h: HeaderMap,
    axum::Json(req): axum::Json<Value>,
) -> Result<Response, Response> {
    let mut s = nvue_scenario(&app, &switch, &h)?;
    if req.get("state").and_then(Value::as_str) != Some("apply") {
        return Err(body(
            StatusCode::BAD_REQUEST,
            json!({"status": 400, "title": "Bad Request", "detail": "only state apply is simulated"}),
        ));
    }
    let Some((sw, changes, state)) = s.revisions.get(&rev).cloned() else {
        return Err(no_such("revision"));
    };
    if sw != switch {
        return Err(no_such("revision"));
    }
    if state == "pending" {
        let applied = s.apply_vrfs(&switch, &changes);
        if let Err(e) = &applied {
            tracing::warn!(switch = %switch, revision = %rev, error = %e, "simulated NVUE: apply failed");
        }
        if let Some(r) = s.revisions.get_mut(&rev) {
            r.2 = if applied.is_ok() {
                "applied"
            } else {
                "apply_fail"
            };
        }
    }
    let state = s.revisions.get(&rev).map(|r| r.2).unwrap_or("pending");
    Ok(body(StatusCode::OK, json!({"state": state})))
}

/// `GET /<switch>/nvue_v1/revision/<rev>`.
async fn nvue_revision(
    State(app): State<App>,
    Path((switch, rev)): Path<(String, String)>,
    h: HeaderMap,
) -> Result<Response, Response> {
    let s = nvue_scenario(&app, &switch, &h)?;
    match s.revisions.get(&rev) {
        Some((sw, _, state)) if *sw == switch => Ok(body(
            StatusCode::OK,
            json!({"state": state, "transition": {"issue": {}, "progress": ""}}),
        )),
        _ => Err(no_such("revision")),
    }
}

#[derive(serde::Deserialize)]
struct RevQuery {
    rev: Option<String>,
}

/// A front-end port: routed in `isolate`, or a bridge access port whose
/// SVI carries the customer VRF.
fn frontend_port(d: &SimDevice, out: &mut Map<String, Value>) -> Value {
    if d.frontend_vrf.starts_with(CUSTOMER_VRF_PREFIX) {
        let vid = 100 + d.index % RACK_SIZE;
        out.insert(
            format!("vlan{vid}"),
            json!({"type": "svi", "vlan": vid, "ip": {"vrf": d.frontend_vrf}}),
        );
        json!({"type": "swp", "link": {"state": "up", "mtu": 9216},
               "bridge": {"domain": {"br_default": {"access": vid}}}})
    } else {
        json!({"type": "swp", "link": {"state": "up", "mtu": 9216},
               "ip": {"vrf": d.frontend_vrf}})
    }
}

async fn nvue_interfaces(
    State(app): State<App>,
    Path(switch): Path<String>,
    Query(q): Query<RevQuery>,
    h: HeaderMap,
) -> Response {
    if header(&h, "authorization") != basic(NVUE_USER, NVUE_PASSWORD) {
        return unauthorized();
    }
    if !matches!(q.rev.as_deref(), None | Some("operational" | "applied")) {
        return body(
            StatusCode::NOT_FOUND,
            json!({"status": 404, "title": "Not Found", "detail": "no such revision"}),
        );
    }
    let s = app.lock();
    let Some(((rack, frontend), members)) =
        leaf(&switch).and_then(|l| Some((l, s.racks.get(l.0)?)))
    else {
        return body(
            StatusCode::NOT_FOUND,
            json!({"status": 404, "title": "Not Found"}),
        );
    };
    if s.switch_out(rack, frontend) {
        return nvue_down();
    }
    let mut out = Map::new();
    out.insert(
        "eth0".into(),
        json!({"type": "eth", "link": {"state": "up"}, "ip": {"vrf": "mgmt"}}),
    );
    out.insert(
        "lo".into(),
        json!({"type": "loopback", "ip": {"address": {"10.0.0.1/32": {}}}}),
    );
    out.insert(
        UPLINK.into(),
        json!({"type": "swp", "link": {"state": "up", "mtu": 9216}}),
    );
    for &i in members {
        let d = &s.devices[i];
        let name = switch_port(d);
        let port = if frontend {
            frontend_port(d, &mut out)
        } else {
            json!({"type": "swp", "link": {"state": "up", "mtu": 9216},
                   "ip": {"vrf": d.backend_vrf}})
        };
        out.insert(name, port);
    }
    body(StatusCode::OK, Value::Object(out))
}

// ---- NMX-M: GET /<site>/nmx/v1/{partitions,gpus,compute-nodes} ----

pub(crate) fn nmx_router(app: App) -> Router {
    Router::new()
        .route("/{site}/nmx/v1/partitions", get(nmx_partitions))
        .route(
            "/{site}/nmx/v1/partitions/{id}",
            axum::routing::put(nmx_update_partition),
        )
        .route("/{site}/nmx/v1/operations/{op}", get(nmx_operation))
        .route("/{site}/nmx/v1/gpus", get(nmx_gpus))
        .route("/{site}/nmx/v1/compute-nodes", get(nmx_nodes))
        .with_state(app)
}

/// `PUT /<site>/nmx/v1/partitions/<id>` with `{"members": {"ids": [...]}}`
/// (the whole member list): applied at once, its operation completed.
async fn nmx_update_partition(
    State(app): State<App>,
    Path((site, id)): Path<(String, u32)>,
    h: HeaderMap,
    axum::Json(req): axum::Json<Value>,
) -> Result<Response, Response> {
    let mut s = nmx_scenario(&app, &site, &h)?;
    if id != REPAIR_PARTITION_ID && id != DEFAULT_PARTITION_ID {
        return Err(body(
            StatusCode::NOT_FOUND,
            json!({"error": "no such partition"}),
        ));
    }
    let Some(ids) = req.pointer("/members/ids").and_then(Value::as_array) else {
        return Err(body(
            StatusCode::BAD_REQUEST,
            json!({"error": "members.ids (GPU ids) is required"}),
        ));
    };
    let members: BTreeSet<String> = ids
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    s.set_partition(&site, id, &members);
    let op = format!("op-{}", s.nmx_operations);
    let mut r = body(StatusCode::ACCEPTED, json!({"operationId": op}));
    if let Ok(v) = format!("/nmx/v1/operations/{op}").parse() {
        r.headers_mut().insert("location", v);
    }
    Ok(r)
}

/// `GET /<site>/nmx/v1/operations/<op>`: every operation completed.
async fn nmx_operation(
    State(app): State<App>,
    Path((site, op)): Path<(String, String)>,
    h: HeaderMap,
) -> Result<Response, Response> {
    let s = nmx_scenario(&app, &site, &h)?;
    let known = op
        .strip_prefix("op-")
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| n >= 1 && n <= s.nmx_operations);
    if !known {
        return Err(body(
            StatusCode::NOT_FOUND,
            json!({"error": "no such operation"}),
        ));
    }
    Ok(body(
        StatusCode::OK,
        json!({"id": op, "status": "completed"}),
    ))
}

fn gpu_id(d: &SimDevice, k: u8) -> String {
    format!("GPU-{}-{k}", d.uuid)
}

/// The scenario, locked, for a caller with NMX-M's credentials while the
/// site's NMX-M is answering.
fn nmx_scenario<'a>(
    app: &'a App,
    site: &str,
    h: &HeaderMap,
) -> Result<MutexGuard<'a, Scenario>, Response> {
    if header(h, "authorization") != basic(NMX_USER, NMX_PASSWORD) {
        return Err(unauthorized());
    }
    let s = app.lock();
    if s.nmx_out(site) {
        return Err(body(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": "simulated outage: NMX-M is down"}),
        ));
    }
    Ok(s)
}

async fn nmx_partitions(
    State(app): State<App>,
    Path(site): Path<String>,
    h: HeaderMap,
) -> Result<Response, Response> {
    drop(nmx_scenario(&app, &site, &h)?);
    Ok(body(
        StatusCode::OK,
        json!([
            {"PartitionID": DEFAULT_PARTITION_ID, "Name": "default", "Type": "GPUUIDBased", "Health": "HEALTHY"},
            {"PartitionID": REPAIR_PARTITION_ID, "Name": REPAIR_PARTITION, "Type": "GPUUIDBased", "Health": "HEALTHY"}
        ]),
    ))
}

async fn nmx_gpus(
    State(app): State<App>,
    Path(site): Path<String>,
    h: HeaderMap,
) -> Result<Response, Response> {
    let s = nmx_scenario(&app, &site, &h)?;
    let gpus: Vec<Value> = s
        .devices
        .iter()
        .filter(|d| d.site == site)
        .flat_map(|d| {
            (0..GPUS_PER_DEVICE).map(move |k| {
                let p = if k < d.gpus_in_repair {
                    Some(REPAIR_PARTITION_ID)
                } else if d.gpus_released {
                    None
                } else {
                    Some(DEFAULT_PARTITION_ID)
                };
                json!({"ID": gpu_id(d, k), "PartitionID": p, "Health": "HEALTHY"})
            })
        })
        .collect();
    Ok(body(StatusCode::OK, Value::Array(gpus)))
}

async fn nmx_nodes(
    State(app): State<App>,
    Path(site): Path<String>,
    h: HeaderMap,
) -> Result<Response, Response> {
    let s = nmx_scenario(&app, &site, &h)?;
    let nodes: Vec<Value> = s
        .devices
        .iter()
        .filter(|d| d.site == site)
        .map(|d| {
            json!({"ID": d.index, "Name": d.name,
                   "GpuIDList": (0..GPUS_PER_DEVICE).map(|k| gpu_id(d, k)).collect::<Vec<_>>()})
        })
        .collect();
    Ok(body(StatusCode::OK, Value::Array(nodes)))
}
