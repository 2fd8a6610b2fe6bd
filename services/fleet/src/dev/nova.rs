//! The simulated Nova of a site with Nova and Placement, as the workflow
//! service's Nova arm drives it (Image Node creates a server on a node,
//! Unimage Node deletes the bound one, Move to Test Cluster's
//! `force_reclaim` deletes a customer's). Its servers are the scenario's
//! bound nodes: a node's `instance_uuid` is its server's id, named as the
//! device, `ACTIVE`. A create or delete lands at once, as the simulated
//! Ironic's transitions do: the create binds and deploys the node
//! (`instance_info` with the image and flavour), the delete tears it down to
//! `available`, unbound. What Nova refuses is refused with its status and
//! fault body, and every accepted write marks the device `operated`.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::dev::engine::SimDevice;
use crate::dev::servers::{body, header, App, KEYSTONE_TOKEN};

fn fault(status: StatusCode, kind: &str, message: &str) -> Response {
    body(
        status,
        json!({ kind: {"code": status.as_u16(), "message": message} }),
    )
}

fn server_json(d: &SimDevice) -> Value {
    json!({
        "id": d.instance_uuid, "name": d.name, "status": "ACTIVE",
        "OS-EXT-STS:task_state": null,
        "OS-EXT-SRV-ATTR:hypervisor_hostname": d.uuid,
    })
}

/// Runs `f` on the node bound to server `id` at `site` under the scenario
/// lock, after the token check; 404 `itemNotFound` for a server Nova does
/// not have.
fn with_server(
    app: &App,
    h: &HeaderMap,
    site: &str,
    id: &str,
    f: impl FnOnce(&mut SimDevice) -> Response,
) -> Response {
    if let Some(r) = refused(h) {
        return r;
    }
    let mut scenario = app.lock();
    match scenario
        .devices
        .iter_mut()
        .find(|d| d.site == site && d.instance_uuid.as_deref() == Some(id))
    {
        Some(d) => f(d),
        None => fault(
            StatusCode::NOT_FOUND,
            "itemNotFound",
            &format!("Instance {id} could not be found."),
        ),
    }
}

/// The token check every Nova call makes.
fn refused(h: &HeaderMap) -> Option<Response> {
    (header(h, "x-auth-token") != KEYSTONE_TOKEN).then(|| {
        fault(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "The request you have made requires authentication.",
        )
    })
}

/// `POST /servers` (compute 2.74: `hypervisor_hostname` names the node):
/// 202 with the new server's id, the node bound and `active`; 400 when the
/// node cannot take it ("No valid host was found").
pub(crate) async fn create(
    State(app): State<App>,
    Path(site): Path<String>,
    h: HeaderMap,
    axum::Json(req): axum::Json<Value>,
) -> Response {
    if let Some(r) = refused(&h) {
        return r;
    }
    let s = &req["server"];
    let text = |k: &str| s[k].as_str().unwrap_or_default();
    for k in ["name", "imageRef", "flavorRef", "hypervisor_hostname"] {
        if text(k).is_empty() {
            return fault(
                StatusCode::BAD_REQUEST,
                "badRequest",
                &format!("Invalid input for field/attribute server: '{k}' is a required property"),
            );
        }
    }
    let mut scenario = app.lock();
    let Some(d) = scenario.node_mut(&site, text("hypervisor_hostname")) else {
        return fault(
            StatusCode::BAD_REQUEST,
            "badRequest",
            &format!(
                "No valid host was found. Compute host {} could not be found.",
                text("hypervisor_hostname")
            ),
        );
    };
    if d.provision_state != "available" || d.instance_uuid.is_some() || d.maintenance.is_some() {
        return fault(
            StatusCode::BAD_REQUEST,
            "badRequest",
            &format!(
                "No valid host was found. Node {} is {}{}.",
                d.uuid,
                d.provision_state,
                if d.maintenance.is_some() {
                    ", in maintenance"
                } else {
                    ""
                }
            ),
        );
    }
    let id = uuid::Uuid::new_v4().to_string();
    d.instance_uuid = Some(id.clone());
    d.instance_info = Some(json!({"image_source": text("imageRef"), "flavor": text("flavorRef")}));
    d.provision_state = "active";
    d.operated = true;
    (
        StatusCode::ACCEPTED,
        axum::Json(json!({"server": {"id": id, "links": []}})),
    )
        .into_response()
}

/// `GET /servers/{id}`.
pub(crate) async fn show(
    State(app): State<App>,
    Path((site, id)): Path<(String, String)>,
    h: HeaderMap,
) -> Response {
    with_server(&app, &h, &site, &id, |d| {
        body(StatusCode::OK, json!({"server": server_json(d)}))
    })
}

#[derive(serde::Deserialize)]
pub(crate) struct DetailQuery {
    name: Option<String>,
}

/// `GET /servers/detail?name=`: the bound node named so, if any (without a
/// name filter, every bound node of the site).
pub(crate) async fn detail(
    State(app): State<App>,
    Path(site): Path<String>,
    Query(q): Query<DetailQuery>,
    h: HeaderMap,
) -> Response {
    if let Some(r) = refused(&h) {
        return r;
    }
    let name = q.name.as_deref().map(fleet_openstack::nova::name_of_filter);
    let scenario = app.lock();
    let servers: Vec<Value> = scenario
        .devices
        .iter()
        .filter(|d| d.site == site && d.instance_uuid.is_some())
        .filter(|d| name.as_ref().is_none_or(|n| &d.name == n))
        .map(server_json)
        .collect();
    body(StatusCode::OK, json!({ "servers": servers }))
}

/// `DELETE /servers/{id}`: 204, the node torn down to `available` and
/// unbound at once; 404 for a server Nova does not have.
pub(crate) async fn delete(
    State(app): State<App>,
    Path((site, id)): Path<(String, String)>,
    h: HeaderMap,
) -> Response {
    with_server(&app, &h, &site, &id, |d| {
        d.instance_uuid = None;
        d.instance_info = None;
        d.provision_state = "available";
        d.operated = true;
        StatusCode::NO_CONTENT.into_response()
    })
}
