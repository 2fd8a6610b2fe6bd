//! Impairment holds in batches: the devices being cordoned (or released)
//! at once ask for their hold here, and one hub command
//! (`impairment_holds`) carries every ask of the same event that arrived
//! within `workflow.hold_batch_linger`, up to `workflow.hold_batch_max`,
//! in one hub transaction instead of one each (`fleet_hub_client::batch`).
//! Each device gets its own answer: applied, or the hub's refusal of that
//! device alone.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_hub_client::batch::Limits;
use fleet_hub_client::{Batcher, HubCallError, HubClient};
use fleet_proto::{v1, ErrorCode};
use v1::hub_command::Command as C;

/// One device's hold asked for by `actor` for `event`.
struct Ask {
    actor: String,
    event: String,
    device: String,
    set: bool,
}

/// Batches out at once: as many as the workflow's workers could want.
const IN_FLIGHT: usize = 64;

#[derive(Clone)]
pub(crate) struct Holds {
    batcher: Batcher<Ask, ()>,
}

impl Holds {
    /// Starts the batcher; it ends when the last `Holds` is dropped. A
    /// batch is at most 1,000 devices, the most the hub's command takes.
    pub fn start(hub: HubClient, max: usize, linger: Duration) -> Holds {
        let limits = Limits {
            max: max.clamp(1, 1000),
            linger,
            in_flight: IN_FLIGHT,
        };
        let batcher = Batcher::start(limits, move |asks: Vec<Ask>| {
            let hub = hub.clone();
            async move { Ok(send_all(&hub, asks).await) }
        });
        Holds { batcher }
    }

    /// The event's hold set (or removed) on the device.
    pub async fn hold(
        &self,
        actor: &str,
        event: &str,
        device: &str,
        set: bool,
    ) -> Result<(), HubCallError> {
        self.batcher
            .ask(Ask {
                actor: actor.to_string(),
                event: event.to_string(),
                device: device.to_string(),
                set,
            })
            .await
    }
}

/// One hub command per actor, event and direction of the batch, all at
/// once; the answers in the asks' order.
async fn send_all(hub: &HubClient, asks: Vec<Ask>) -> Vec<Result<(), HubCallError>> {
    let mut groups: BTreeMap<(&str, &str, bool), Vec<usize>> = BTreeMap::new();
    for (i, a) in asks.iter().enumerate() {
        groups
            .entry((&a.actor, &a.event, a.set))
            .or_default()
            .push(i);
    }
    let sent = groups.into_iter().map(|((actor, event, set), at)| {
        let devices: Vec<String> = at.iter().map(|&i| asks[i].device.clone()).collect();
        async move { (at, send(hub, actor, event, set, devices).await) }
    });
    let mut out: Vec<Result<(), HubCallError>> = asks
        .iter()
        .map(|_| Err(HubCallError::BadReply("no answer".into())))
        .collect();
    for (at, answers) in futures::future::join_all(sent).await {
        for (i, a) in at.into_iter().zip(answers) {
            out[i] = a;
        }
    }
    out
}

/// One event's holds on `devices`: one answer per device, in order.
async fn send(
    hub: &HubClient,
    actor: &str,
    event: &str,
    set: bool,
    devices: Vec<String>,
) -> Vec<Result<(), HubCallError>> {
    let c = C::ImpairmentHolds(v1::ImpairmentHolds {
        event_id: event.to_string(),
        device_ids: devices.clone(),
        set,
    });
    match hub.call(actor, 0, c).await.and_then(|a| a.holds()) {
        Ok(results) => {
            let mut by: BTreeMap<String, Option<v1::HubError>> = results
                .into_iter()
                .map(|r| (r.device_id, r.error))
                .collect();
            devices
                .iter()
                .map(|d| match by.remove(d) {
                    Some(None) => Ok(()),
                    Some(Some(e)) => Err(HubCallError::refused(e)),
                    None => Err(HubCallError::BadReply(format!(
                        "the hub answered no result for device {d}"
                    ))),
                })
                .collect()
        }
        Err(e) => {
            // The whole command failed (the hub away, a refusal of the
            // request itself): every device gets that answer.
            let e = match e {
                HubCallError::Refused {
                    code: ErrorCode::InvalidArgument,
                    message,
                } => HubCallError::Refused {
                    code: ErrorCode::Unavailable,
                    message: format!("the hub refused the batched hold: {message}"),
                },
                other => other,
            };
            devices.iter().map(|_| Err(e.clone())).collect()
        }
    }
}
