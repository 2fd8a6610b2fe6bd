//! Creating the devices NetBox lists and the hub does not know, through the
//! hub's `create_devices` command (many creates in one transaction). The
//! connector reads nothing from PostgreSQL: a `CONFLICT` item means the
//! device exists already.

use std::time::Duration;

use fleet_connector::{Bus, ConnectorMetrics};
use fleet_proto::{v1, ErrorCode};
use futures::StreamExt;

const ACTOR: &str = "connector-netbox";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Devices per `create_devices` request (the hub takes up to 1,000).
pub const CHUNK: usize = 500;
const IN_FLIGHT: usize = 2;

/// What the hub said about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    Created {
        device_id: String,
    },
    /// `CONFLICT`: a device of that name (or NetBox id) exists in the site.
    Exists,
    /// Another typed error (`NOT_FOUND` for an unknown site, ...).
    Rejected {
        code: ErrorCode,
        message: String,
    },
    /// No reply: the hub is down or slow. Tried again next poll.
    Unanswered(String),
}

/// Interprets one item of a `create_devices` reply.
pub fn item_outcome(item: &v1::CreateResult) -> Created {
    match &item.error {
        None => Created::Created {
            device_id: item.id.clone(),
        },
        Some(e) => match fleet_proto::error_code_of(e.code) {
            ErrorCode::Conflict => Created::Exists,
            code => Created::Rejected {
                code,
                message: e.message.clone(),
            },
        },
    }
}

/// Interprets a whole `create_devices` reply for the `n` devices sent: one
/// outcome per device, in order. A refused request refuses every device.
pub fn outcomes(reply: &v1::HubReply, n: usize) -> Vec<Created> {
    if let Some(e) = &reply.error {
        let c = Created::Rejected {
            code: fleet_proto::error_code_of(e.code),
            message: e.message.clone(),
        };
        return vec![c; n];
    }
    match &reply.record {
        Some(v1::hub_reply::Record::Created(c)) if c.results.len() == n => {
            c.results.iter().map(item_outcome).collect()
        }
        Some(v1::hub_reply::Record::Created(c)) => vec![
            Created::Unanswered(format!(
                "hub answered {} items for {n} devices",
                c.results.len()
            ));
            n
        ],
        _ => vec![Created::Unanswered("the hub answered no create results".into()); n],
    }
}

async fn create_chunk(bus: &Bus, devices: Vec<v1::CreateDevice>) -> Vec<Created> {
    let n = devices.len();
    let hub =
        fleet_hub_client::HubClient::new(bus.nats.clone(), bus.subjects.clone(), REQUEST_TIMEOUT);
    let command = v1::hub_command::Command::CreateDevices(v1::CreateDevices { devices });
    match hub.request(ACTOR, 0, command).await {
        Ok(r) => outcomes(&r, n),
        Err(e) => vec![Created::Unanswered(e.to_string()); n],
    }
}

/// Makes sure the hub knows `site`: `create_site` with the configured
/// `inventory_only` flag; `CONFLICT` means it exists (and keeps its flag,
/// immutable after create). `false` when the hub did not answer or refused
/// otherwise: tried again next poll.
pub async fn ensure_site(
    bus: &Bus,
    metrics: &ConnectorMetrics,
    site: &str,
    slug: &str,
    inventory_only: bool,
) -> bool {
    let hub =
        fleet_hub_client::HubClient::new(bus.nats.clone(), bus.subjects.clone(), REQUEST_TIMEOUT);
    let command = v1::hub_command::Command::CreateSite(v1::Site {
        id: site.to_string(),
        name: slug.to_string(),
        inventory_only,
        placement_enabled: true,
        ..Default::default()
    });
    match hub.call(ACTOR, 0, command).await {
        Ok(_) => {
            tracing::info!(
                site,
                inventory_only,
                "created the site from netbox's configuration"
            );
            true
        }
        Err(fleet_hub_client::HubCallError::Refused {
            code: ErrorCode::Conflict,
            ..
        }) => true,
        Err(e) => {
            tracing::warn!(site, error = %e, "could not make sure the hub knows the site; retrying next poll");
            metrics.error("netbox", site, "hub_command");
            false
        }
    }
}

/// What one round of `create_devices` left.
#[derive(Debug, Default)]
pub struct Ensured {
    /// Names the hub is now known to have (created or already there).
    pub known: Vec<String>,
    /// Names it refused, with its code and message (the caller logs them
    /// when they start and when they end).
    pub rejected: Vec<(String, ErrorCode, String)>,
}

/// Sends `create_devices` for the devices, `CHUNK` at a time.
pub async fn ensure_devices(
    bus: &Bus,
    metrics: &ConnectorMetrics,
    site: &str,
    devices: Vec<v1::CreateDevice>,
) -> Ensured {
    let chunks: Vec<Vec<v1::CreateDevice>> = devices.chunks(CHUNK).map(|c| c.to_vec()).collect();
    let results: Vec<(String, Created)> = futures::stream::iter(chunks)
        .map(|chunk| async move {
            let names: Vec<String> = chunk.iter().map(|d| d.name.clone()).collect();
            names
                .into_iter()
                .zip(create_chunk(bus, chunk).await)
                .collect::<Vec<_>>()
        })
        .buffer_unordered(IN_FLIGHT)
        .flat_map(futures::stream::iter)
        .collect()
        .await;
    let mut out = Ensured::default();
    for (name, r) in results {
        match r {
            Created::Created { device_id } => {
                tracing::debug!(site, device = %name, %device_id, "created device from netbox");
                out.known.push(name);
            }
            Created::Exists => out.known.push(name),
            Created::Rejected { code, message } => {
                metrics.warning("netbox", "create_rejected");
                out.rejected.push((name, code, message));
            }
            Created::Unanswered(e) => {
                tracing::warn!(site, device = %name, error = %e, "create_devices got no reply; retrying next poll");
                metrics.error("netbox", site, "hub_command");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_item_by_item() {
        let item = |name: &str, id: &str, error: Option<(ErrorCode, &str)>| v1::CreateResult {
            site: "s1".into(),
            name: name.into(),
            id: id.into(),
            error: error.map(|(code, message)| v1::HubError {
                code: code as i32,
                message: message.into(),
            }),
        };
        let ok = v1::HubReply {
            error: None,
            version: 0,
            record: Some(v1::hub_reply::Record::Created(v1::CreateResults {
                results: vec![
                    item("a", "dev_01", None),
                    item("b", "", Some((ErrorCode::Conflict, "exists"))),
                    item("c", "", Some((ErrorCode::NotFound, "site x"))),
                ],
            })),
        };
        assert_eq!(
            outcomes(&ok, 3),
            vec![
                Created::Created {
                    device_id: "dev_01".into()
                },
                Created::Exists,
                Created::Rejected {
                    code: ErrorCode::NotFound,
                    message: "site x".into()
                }
            ]
        );
        assert!(
            matches!(outcomes(&ok, 2)[0], Created::Unanswered(_)),
            "a count mismatch is no answer"
        );
        let refused = v1::HubReply {
            error: Some(v1::HubError {
                code: ErrorCode::InvalidArgument as i32,
                message: "m".into(),
            }),
            version: 0,
            record: None,
        };
        assert_eq!(
            outcomes(&refused, 2),
            vec![
                Created::Rejected {
                    code: ErrorCode::InvalidArgument,
                    message: "m".into()
                };
                2
            ]
        );
    }
}
