//! Creating the devices NetBox lists and the hub does not know, through the
//! hub's `create_device` command. The connector reads nothing from
//! PostgreSQL: a `CONFLICT` reply means the device exists already.

use std::time::Duration;

use fleet_connector::{Bus, ConnectorMetrics};
use fleet_proto::{v1, Message};
use futures::StreamExt;

const ACTOR: &str = "connector-netbox";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const IN_FLIGHT: usize = 8;

/// What the hub said to one `create_device`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    Created {
        device_id: String,
    },
    /// `CONFLICT`: a device of that name (or NetBox id) exists in the site.
    Exists,
    /// Another typed error (`NOT_FOUND` for an unknown site, ...).
    Rejected {
        code: String,
        message: String,
    },
    /// No reply: the hub is down or slow. Tried again next poll.
    Unanswered(String),
}

/// Interprets a hub reply.
pub fn outcome(reply: &v1::HubReply) -> Created {
    match &reply.error {
        None => {
            let id = serde_json::from_slice::<serde_json::Value>(&reply.record_json)
                .ok()
                .and_then(|v| v["id"].as_str().map(String::from))
                .unwrap_or_default();
            Created::Created { device_id: id }
        }
        Some(e) if e.code == "CONFLICT" => Created::Exists,
        Some(e) => Created::Rejected {
            code: e.code.clone(),
            message: e.message.clone(),
        },
    }
}

async fn create_one(bus: &Bus, d: v1::CreateDevice) -> Created {
    let cmd = v1::HubCommand {
        actor: ACTOR.into(),
        expected_version: 0,
        command: Some(v1::hub_command::Command::CreateDevice(d)),
    };
    let req = bus.nats.request(
        bus.subjects.hub_cmd("create_device"),
        cmd.encode_to_vec().into(),
    );
    match tokio::time::timeout(REQUEST_TIMEOUT, req).await {
        Err(_) => Created::Unanswered(format!("no reply within {} s", REQUEST_TIMEOUT.as_secs())),
        Ok(Err(e)) => Created::Unanswered(e.to_string()),
        Ok(Ok(msg)) => match v1::HubReply::decode(msg.payload.as_ref()) {
            Ok(r) => outcome(&r),
            Err(e) => Created::Unanswered(format!("undecodable hub reply: {e}")),
        },
    }
}

/// Sends `create_device` for each device and returns the names the hub is
/// now known to have (created or already there).
pub async fn ensure_devices(
    bus: &Bus,
    metrics: &ConnectorMetrics,
    site: &str,
    devices: Vec<v1::CreateDevice>,
) -> Vec<String> {
    let results: Vec<(String, Created)> = futures::stream::iter(devices)
        .map(|d| async move {
            let name = d.name.clone();
            (name, create_one(bus, d).await)
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut known = Vec::new();
    for (name, r) in results {
        match r {
            Created::Created { device_id } => {
                tracing::info!(site, device = %name, %device_id, "created device from netbox");
                known.push(name);
            }
            Created::Exists => known.push(name),
            Created::Rejected { code, message } => {
                tracing::warn!(site, device = %name, %code, %message, "hub refused to create device");
                metrics.warning("netbox", "create_rejected");
            }
            Created::Unanswered(e) => {
                tracing::warn!(site, device = %name, error = %e, "create_device got no reply; retrying next poll");
                metrics.error("netbox", site, "hub_command");
            }
        }
    }
    known
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_by_code() {
        let ok = v1::HubReply {
            error: None,
            record_json: br#"{"id": "dev_01"}"#.to_vec(),
            version: 1,
        };
        assert_eq!(
            outcome(&ok),
            Created::Created {
                device_id: "dev_01".into()
            }
        );
        let err = |code: &str| v1::HubReply {
            error: Some(v1::HubError {
                code: code.into(),
                message: "m".into(),
            }),
            record_json: vec![],
            version: 0,
        };
        assert_eq!(outcome(&err("CONFLICT")), Created::Exists);
        assert_eq!(
            outcome(&err("NOT_FOUND")),
            Created::Rejected {
                code: "NOT_FOUND".into(),
                message: "m".into()
            }
        );
    }
}
