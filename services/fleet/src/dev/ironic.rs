//! The simulated Ironic's node API beyond the list the connector reads: one
//! node, its JSON patch, its provision and power transitions and its own
//! traits, as the workflow service drives them (Image and Unimage bind and
//! deploy, Enrolment manages, inspects and provides, Release clears the
//! lease and adds the customer-ready trait at a standalone site). A
//! transition lands at once (the fake-hardware driver's way, with no
//! deploy or clean time); what a real Ironic refuses is refused with its
//! status and fault text, so the workflows' fail-closed paths run too.
//! Every accepted write marks the device `operated`: the scenario's own
//! lifecycle leaves it to its jobs from then on, and the ground truth
//! follows what the jobs did.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::dev::engine::{
    SimDevice, CUSTOMER_PROJECT, CUSTOMER_READY_TRAIT, ENROL_PROJECT, MAINTENANCE_PROJECT,
};
use crate::dev::servers::{body, header, ironic_error, App, KEYSTONE_TOKEN};

/// A node as Ironic's API shows it (`GET /v1/nodes/{ident}`, and each entry
/// of `GET /v1/nodes?detail=True`).
pub(crate) fn node_json(d: &SimDevice) -> Value {
    json!({
        "uuid": d.uuid, "name": d.name,
        "provision_state": d.provision_state,
        "target_provision_state": null,
        "power_state": "power on",
        "target_power_state": null,
        "maintenance": d.maintenance.is_some(),
        "maintenance_reason": d.maintenance,
        "instance_uuid": d.instance_uuid,
        "instance_info": d.instance_info.clone().unwrap_or_else(|| json!({})),
        "lessee": if d.lessee.is_empty() { None } else { Some(d.lessee) },
        "owner": null,
        "last_error": if d.provision_state.ends_with("failed") { Some("simulated failure") } else { None },
        "inspection_finished_at": d.inspection_finished_at.map(|t| t.to_rfc3339()),
        "traits": if d.customer_ready { vec![CUSTOMER_READY_TRAIT] } else { vec![] },
        "resource_class": "gpu-h100", "driver": "redfish"
    })
}

/// Runs `f` on the node `ident` of `site` under the scenario lock, after
/// the token and outage checks every Ironic call makes.
fn with_node(
    app: &App,
    h: &HeaderMap,
    site: &str,
    ident: &str,
    f: impl FnOnce(&mut SimDevice) -> Response,
) -> Response {
    if header(h, "x-auth-token") != KEYSTONE_TOKEN {
        return ironic_error(StatusCode::UNAUTHORIZED, "Authentication required");
    }
    let mut s = app.lock();
    if s.outages.ironic {
        return ironic_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "simulated outage: ironic-api is down",
        );
    }
    match s.node_mut(site, ident) {
        Some(d) => f(d),
        None => ironic_error(
            StatusCode::NOT_FOUND,
            &format!("Node {ident} could not be found."),
        ),
    }
}

/// `GET /v1/nodes/{ident}`.
pub(crate) async fn node(
    State(app): State<App>,
    Path((site, ident)): Path<(String, String)>,
    h: HeaderMap,
) -> Response {
    with_node(&app, &h, &site, &ident, |d| {
        body(StatusCode::OK, node_json(d))
    })
}

/// The lessees the scenario models (`SimDevice::lessee` is one of them, or
/// empty for none).
fn known_lessee(v: &Value) -> Option<&'static str> {
    match v.as_str()? {
        CUSTOMER_PROJECT => Some(CUSTOMER_PROJECT),
        MAINTENANCE_PROJECT => Some(MAINTENANCE_PROJECT),
        ENROL_PROJECT => Some(ENROL_PROJECT),
        _ => None,
    }
}

/// One JSON patch operation on a copy of the node's writable fields.
fn patch_one(d: &mut SimDevice, op: &Value) -> Result<(), (StatusCode, String)> {
    let bad = |m: String| Err((StatusCode::BAD_REQUEST, m));
    let (Some(kind), Some(path)) = (op["op"].as_str(), op["path"].as_str()) else {
        return bad("a patch operation needs op and path".into());
    };
    let value = &op["value"];
    let set = matches!(kind, "add" | "replace");
    if !set && kind != "remove" {
        return bad(format!(
            "the simulated Ironic does not take the {kind:?} operation"
        ));
    }
    match path {
        "/instance_uuid" if set => {
            let Some(new) = value.as_str() else {
                return bad("instance_uuid must be a string".into());
            };
            if let Some(old) = &d.instance_uuid {
                if old != new {
                    return Err((
                        StatusCode::CONFLICT,
                        format!(
                            "Node {} is associated with instance {old}.",
                            d.uuid
                        ),
                    ));
                }
            }
            d.instance_uuid = Some(new.to_string());
        }
        "/instance_uuid" => d.instance_uuid = None,
        "/instance_info" if set => d.instance_info = Some(value.clone()),
        "/instance_info" => d.instance_info = None,
        p if p.starts_with("/instance_info/") => {
            let key = &p["/instance_info/".len()..];
            let info = d.instance_info.get_or_insert_with(|| json!({}));
            let Some(map) = info.as_object_mut() else {
                return bad("instance_info is not an object".into());
            };
            if set {
                map.insert(key.to_string(), value.clone());
            } else if map.remove(key).is_none() {
                return bad(format!("can't remove non-existent object '{key}'"));
            }
        }
        "/lessee" if set => match known_lessee(value) {
            Some(l) => d.lessee = l,
            None => {
                return bad(format!(
                    "the simulated Ironic knows the projects {CUSTOMER_PROJECT}, {MAINTENANCE_PROJECT} and {ENROL_PROJECT}, not {value}"
                ))
            }
        },
        "/lessee" => d.lessee = "",
        other => return bad(format!("the simulated Ironic does not patch {other}")),
    }
    Ok(())
}

/// `PATCH /v1/nodes/{ident}` (RFC 6902): `instance_uuid` (409 when the node
/// is bound to another instance), `instance_info` and its keys, `lessee`.
/// All or nothing, as Ironic does.
pub(crate) async fn patch(
    State(app): State<App>,
    Path((site, ident)): Path<(String, String)>,
    h: HeaderMap,
    axum::Json(ops): axum::Json<Value>,
) -> Response {
    with_node(&app, &h, &site, &ident, |d| {
        let Some(ops) = ops.as_array() else {
            return ironic_error(StatusCode::BAD_REQUEST, "a patch is a list of operations");
        };
        let mut copy = d.clone();
        for op in ops {
            if let Err((status, fault)) = patch_one(&mut copy, op) {
                return ironic_error(status, &fault);
            }
        }
        copy.operated = true;
        *d = copy;
        body(StatusCode::OK, node_json(d))
    })
}

/// Where a provision `target` takes a node resting in `state`, or `None`
/// where Ironic refuses it.
fn provision_target(d: &SimDevice, target: &str) -> Option<&'static str> {
    match (target, d.provision_state) {
        ("manage", "enroll" | "available" | "manageable") => Some("manageable"),
        ("inspect", "manageable") => Some("manageable"),
        ("provide", "manageable") => Some("available"),
        ("active", "available" | "deploy failed") if d.instance_uuid.is_some() => Some("active"),
        ("deleted", "active" | "deploy failed") => Some("available"),
        _ => None,
    }
}

/// `PUT /v1/nodes/{ident}/states/provision`: 202, the node already in the
/// state the transition rests in; 400 for a transition its state does not
/// allow or a node in maintenance.
pub(crate) async fn provision(
    State(app): State<App>,
    Path((site, ident)): Path<(String, String)>,
    h: HeaderMap,
    axum::Json(req): axum::Json<Value>,
) -> Response {
    with_node(&app, &h, &site, &ident, |d| {
        let target = req["target"].as_str().unwrap_or("");
        if d.maintenance.is_some() && target != "manage" {
            return ironic_error(
                StatusCode::BAD_REQUEST,
                &format!("Node {} is in maintenance mode.", d.uuid),
            );
        }
        let Some(next) = provision_target(d, target) else {
            return ironic_error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "The requested action \"{target}\" can not be performed on node \"{}\" while it is in state \"{}\".",
                    d.uuid, d.provision_state
                ),
            );
        };
        match target {
            "inspect" => d.inspection_finished_at = Some(chrono::Utc::now()),
            "deleted" => {
                d.instance_uuid = None;
                d.instance_info = None;
            }
            _ => {}
        }
        d.provision_state = next;
        d.operated = true;
        StatusCode::ACCEPTED.into_response()
    })
}

/// `PUT /v1/nodes/{ident}/states/power`: accepted and done (the node stays
/// powered on).
pub(crate) async fn power(
    State(app): State<App>,
    Path((site, ident)): Path<(String, String)>,
    h: HeaderMap,
    axum::Json(req): axum::Json<Value>,
) -> Response {
    with_node(&app, &h, &site, &ident, |d| {
        match req["target"].as_str().unwrap_or("") {
            "power on" | "power off" | "rebooting" | "soft rebooting" => {
                d.operated = true;
                StatusCode::ACCEPTED.into_response()
            }
            other => ironic_error(
                StatusCode::BAD_REQUEST,
                &format!("Invalid power state target {other:?}"),
            ),
        }
    })
}

/// `GET /v1/nodes/{ident}/traits`.
pub(crate) async fn traits(
    State(app): State<App>,
    Path((site, ident)): Path<(String, String)>,
    h: HeaderMap,
) -> Response {
    with_node(&app, &h, &site, &ident, |d| {
        body(StatusCode::OK, json!({ "traits": node_json(d)["traits"] }))
    })
}

fn only_customer_ready(name: &str) -> Option<Response> {
    (name != CUSTOMER_READY_TRAIT).then(|| {
        ironic_error(
            StatusCode::BAD_REQUEST,
            &format!(
                "the simulated Ironic keeps only the trait {CUSTOMER_READY_TRAIT}, not {name}"
            ),
        )
    })
}

/// `PUT /v1/nodes/{ident}/traits/{name}`: 204, idempotent.
pub(crate) async fn add_trait(
    State(app): State<App>,
    Path((site, ident, name)): Path<(String, String, String)>,
    h: HeaderMap,
) -> Response {
    with_node(&app, &h, &site, &ident, |d| {
        if let Some(refused) = only_customer_ready(&name) {
            return refused;
        }
        d.customer_ready = true;
        d.operated = true;
        StatusCode::NO_CONTENT.into_response()
    })
}

/// `DELETE /v1/nodes/{ident}/traits/{name}`: 204, or 404 when the node
/// does not have it.
pub(crate) async fn remove_trait(
    State(app): State<App>,
    Path((site, ident, name)): Path<(String, String, String)>,
    h: HeaderMap,
) -> Response {
    with_node(&app, &h, &site, &ident, |d| {
        if let Some(refused) = only_customer_ready(&name) {
            return refused;
        }
        if !d.customer_ready {
            return ironic_error(
                StatusCode::NOT_FOUND,
                &format!("Node {} doesn't have a trait '{name}'", d.uuid),
            );
        }
        d.customer_ready = false;
        d.operated = true;
        StatusCode::NO_CONTENT.into_response()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::engine::Scenario;

    fn node(state: &'static str) -> SimDevice {
        let mut d = Scenario::new(1, &["s1".into()], 1).devices[0].clone();
        d.provision_state = state;
        d.instance_uuid = None;
        d
    }

    #[test]
    fn transitions_follow_ironic_and_refuse_the_rest() {
        let mut d = node("available");
        assert_eq!(
            provision_target(&d, "active"),
            None,
            "deploy needs a bound instance"
        );
        d.instance_uuid = Some("i-1".into());
        assert_eq!(provision_target(&d, "active"), Some("active"));
        for (state, target, next) in [
            ("enroll", "manage", Some("manageable")),
            ("manageable", "inspect", Some("manageable")),
            ("manageable", "provide", Some("available")),
            ("active", "deleted", Some("available")),
            ("deploy failed", "deleted", Some("available")),
            ("cleaning", "deleted", None),
            ("active", "provide", None),
            ("manageable", "bogus", None),
        ] {
            let d = node(state);
            assert_eq!(provision_target(&d, target), next, "{target} from {state}");
        }
    }

    #[test]
    fn a_patch_binds_once_and_refuses_another_instance() {
        let mut d = node("available");
        let bind = |u: &str| json!({"op": "add", "path": "/instance_uuid", "value": u});
        patch_one(&mut d, &bind("i-1")).unwrap();
        patch_one(&mut d, &bind("i-1")).unwrap();
        assert_eq!(
            patch_one(&mut d, &bind("i-2")).unwrap_err().0,
            StatusCode::CONFLICT
        );
        patch_one(
            &mut d,
            &json!({"op": "add", "path": "/instance_info/image_source", "value": "http://img"}),
        )
        .unwrap();
        assert_eq!(
            d.instance_info.as_ref().unwrap()["image_source"],
            "http://img"
        );
        patch_one(&mut d, &json!({"op": "remove", "path": "/lessee"})).unwrap();
        assert_eq!(node_json(&d)["lessee"], Value::Null);
        let refused = patch_one(
            &mut d,
            &json!({"op": "replace", "path": "/lessee", "value": "someone-else"}),
        );
        assert_eq!(refused.unwrap_err().0, StatusCode::BAD_REQUEST);
        assert_eq!(
            patch_one(
                &mut d,
                &json!({"op": "add", "path": "/driver", "value": "ipmi"})
            )
            .unwrap_err()
            .0,
            StatusCode::BAD_REQUEST
        );
    }
}
