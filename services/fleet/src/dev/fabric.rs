//! The simulated fabric, in the contracts connector-fabric reads (README
//! "Fabric contracts"): NetBox cables (`GET /api/dcim/interfaces/`, on the
//! simulated NetBox), each leaf's NVUE (`GET /<switch>/nvue_v1/interface`,
//! HTTP basic) and each site's NMX-M (`GET /<site>/nmx/v1/partitions`,
//! `/gpus`, `/compute-nodes`, HTTP basic).
//!
//! Every rack has a front-end leaf `fe-<rack>` and a back-end leaf
//! `be-<rack>`; device `k` of the rack is cabled to `swp<k+1>` of both
//! (`eth0` front-end, `ens1f0` back-end), and `swp49` of each leaf goes to
//! the site's spine (`exclude_peers = ["spine-*"]`). An idle front-end
//! port is a routed port in VRF `isolate`; a handed-over device's port is a
//! bridge access port whose SVI is in its customer VRF `cust-<n>`. Back-end
//! ports are routed, in `tenant-be` or `maint`. Each device has 8 GPUs;
//! NMX-M has them in the `default` or the `repair` partition.

use std::collections::BTreeSet;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use serde_json::{json, Map, Value};

use crate::dev::engine::{
    switch_port, SimDevice, CUSTOMER_VRF_PREFIX, DEFAULT_PARTITION_ID, GPUS_PER_DEVICE, RACK_SIZE,
    REPAIR_PARTITION, REPAIR_PARTITION_ID,
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
    let s = app.scenario.lock().unwrap_or_else(|e| e.into_inner());
    let mut all = Vec::new();
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
    let results: Vec<Value> = all
        .iter()
        .enumerate()
        .skip(offset)
        .take(limit)
        .map(|(k, (sw, port, dev, dport))| cabled(2 * k + 1, sw, port, dev, dport))
        .collect();
    let next = (offset + limit < all.len()).then(|| {
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
        json!({"count": all.len(), "next": next, "previous": null, "results": results}),
    )
}

// ---- NVUE: GET /<switch>/nvue_v1/interface?rev=operational ----

pub(crate) fn nvue_router(app: App) -> Router {
    Router::new()
        .route("/{switch}/nvue_v1/interface", get(nvue_interfaces))
        .with_state(app)
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
    let s = app.scenario.lock().unwrap_or_else(|e| e.into_inner());
    let Some((rack, frontend)) = leaf(&switch) else {
        return body(
            StatusCode::NOT_FOUND,
            json!({"status": 404, "title": "Not Found"}),
        );
    };
    let Some(members) = s.racks.get(rack) else {
        return body(
            StatusCode::NOT_FOUND,
            json!({"status": 404, "title": "Not Found"}),
        );
    };
    if s.switch_out(rack, frontend) {
        return body(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": 503, "title": "Service Unavailable", "detail": "simulated outage: nvued is not running"}),
        );
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
        .route("/{site}/nmx/v1/gpus", get(nmx_gpus))
        .route("/{site}/nmx/v1/compute-nodes", get(nmx_nodes))
        .with_state(app)
}

fn gpu_id(d: &SimDevice, k: u8) -> String {
    format!("GPU-{}-{k}", d.uuid)
}

fn nmx_down() -> Response {
    body(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"error": "simulated outage: NMX-M is down"}),
    )
}

async fn nmx_partitions(
    State(app): State<App>,
    Path(site): Path<String>,
    h: HeaderMap,
) -> Response {
    if header(&h, "authorization") != basic(NMX_USER, NMX_PASSWORD) {
        return unauthorized();
    }
    if app
        .scenario
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .nmx_out(&site)
    {
        return nmx_down();
    }
    body(
        StatusCode::OK,
        json!([
            {"PartitionID": DEFAULT_PARTITION_ID, "Name": "default", "Type": "GPUUIDBased", "Health": "HEALTHY"},
            {"PartitionID": REPAIR_PARTITION_ID, "Name": REPAIR_PARTITION, "Type": "GPUUIDBased", "Health": "HEALTHY"}
        ]),
    )
}

async fn nmx_gpus(State(app): State<App>, Path(site): Path<String>, h: HeaderMap) -> Response {
    if header(&h, "authorization") != basic(NMX_USER, NMX_PASSWORD) {
        return unauthorized();
    }
    let s = app.scenario.lock().unwrap_or_else(|e| e.into_inner());
    if s.nmx_out(&site) {
        return nmx_down();
    }
    let gpus: Vec<Value> = s
        .devices
        .iter()
        .filter(|d| d.site == site)
        .flat_map(|d| {
            (0..GPUS_PER_DEVICE).map(move |k| {
                let p = if k < d.gpus_in_repair {
                    REPAIR_PARTITION_ID
                } else {
                    DEFAULT_PARTITION_ID
                };
                json!({"ID": gpu_id(d, k), "PartitionID": p, "Health": "HEALTHY"})
            })
        })
        .collect();
    body(StatusCode::OK, Value::Array(gpus))
}

async fn nmx_nodes(State(app): State<App>, Path(site): Path<String>, h: HeaderMap) -> Response {
    if header(&h, "authorization") != basic(NMX_USER, NMX_PASSWORD) {
        return unauthorized();
    }
    let s = app.scenario.lock().unwrap_or_else(|e| e.into_inner());
    if s.nmx_out(&site) {
        return nmx_down();
    }
    let nodes: Vec<Value> = s
        .devices
        .iter()
        .filter(|d| d.site == site)
        .map(|d| {
            json!({"ID": d.index, "Name": d.name,
                   "GpuIDList": (0..GPUS_PER_DEVICE).map(|k| gpu_id(d, k)).collect::<Vec<_>>()})
        })
        .collect();
    body(StatusCode::OK, Value::Array(nodes))
}
