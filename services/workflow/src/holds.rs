//! Impairment holds in batches: the devices being cordoned (or released)
//! at once ask for their hold here, and one hub command
//! (`impairment_holds`) carries every ask of the same event that arrived
//! within `workflow.hold_batch_linger`, up to `workflow.hold_batch_max`,
//! in one hub transaction instead of one each. Each device gets its own
//! answer: applied, or the hub's refusal of that device alone.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_hub_client::{HubCallError, HubClient};
use fleet_proto::{v1, ErrorCode};
use tokio::sync::{mpsc, oneshot};
use v1::hub_command::Command as C;

struct Ask {
    actor: String,
    event: String,
    device: String,
    set: bool,
    reply: oneshot::Sender<Result<(), HubCallError>>,
}

#[derive(Clone)]
pub(crate) struct Holds {
    tx: mpsc::Sender<Ask>,
}

impl Holds {
    /// Starts the batcher; it ends when the last `Holds` is dropped. A
    /// batch is at most 1,000 devices, the most the hub's command takes.
    pub fn start(hub: HubClient, max: usize, linger: Duration) -> Holds {
        let max = max.clamp(1, 1000);
        let (tx, rx) = mpsc::channel(max.max(1) * 4);
        tokio::spawn(batch_loop(hub, rx, max.max(1), linger));
        Holds { tx }
    }

    /// The event's hold set (or removed) on the device.
    pub async fn hold(
        &self,
        actor: &str,
        event: &str,
        device: &str,
        set: bool,
    ) -> Result<(), HubCallError> {
        let (reply, answer) = oneshot::channel();
        let ask = Ask {
            actor: actor.to_string(),
            event: event.to_string(),
            device: device.to_string(),
            set,
            reply,
        };
        let gone = || HubCallError::Transport("the hold batcher stopped".into());
        self.tx.send(ask).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn batch_loop(hub: HubClient, mut rx: mpsc::Receiver<Ask>, max: usize, linger: Duration) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + linger;
        while batch.len() < max {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(a)) => batch.push(a),
                _ => break,
            }
        }
        let mut groups: BTreeMap<(String, String, bool), Vec<Ask>> = BTreeMap::new();
        for a in batch {
            groups
                .entry((a.actor.clone(), a.event.clone(), a.set))
                .or_default()
                .push(a);
        }
        for ((actor, event, set), asks) in groups {
            let hub = hub.clone();
            tokio::spawn(async move { send(&hub, &actor, &event, set, asks).await });
        }
    }
}

async fn send(hub: &HubClient, actor: &str, event: &str, set: bool, asks: Vec<Ask>) {
    let c = C::ImpairmentHolds(v1::ImpairmentHolds {
        event_id: event.to_string(),
        device_ids: asks.iter().map(|a| a.device.clone()).collect(),
        set,
    });
    match hub.call(actor, 0, c).await.and_then(|a| a.holds()) {
        Ok(results) => {
            let mut by: BTreeMap<String, Option<v1::HubError>> = results
                .into_iter()
                .map(|r| (r.device_id, r.error))
                .collect();
            for a in asks {
                let outcome = match by.remove(&a.device) {
                    Some(None) => Ok(()),
                    Some(Some(e)) => Err(HubCallError::Refused {
                        code: fleet_proto::error_code_of(e.code),
                        message: e.message,
                    }),
                    None => Err(HubCallError::BadReply(format!(
                        "the hub answered no result for device {}",
                        a.device
                    ))),
                };
                let _ = a.reply.send(outcome);
            }
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
            for a in asks {
                let _ = a.reply.send(Err(e.clone()));
            }
        }
    }
}
