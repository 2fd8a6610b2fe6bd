//! Observations nobody consumes: `OBSERVATIONS` is a work queue, so every
//! message in it is pending for a hub consumer, in a hub's hands, or on a
//! subject no consumer filters (a publisher with another partition count,
//! a partition no replica binds). The last kind is reported as
//! `fleet_hub_observations_unconsumed`, an alert (docs/operations.md).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fleet_runtime::Shutdown;
use futures::StreamExt;

use crate::Hub;

/// What the stream holds, and how much of it no consumer will deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    pub messages: u64,
    pub pending: u64,
    pub unconsumed: u64,
}

impl Hub {
    /// The stream's count is read between two readings of every consumer
    /// (see [`count`]).
    pub async fn backlog(&self) -> anyhow::Result<Backlog> {
        let mut stream = self
            .deps
            .js
            .get_stream(self.deps.streams.observations())
            .await?;
        let before = consumer_readings(&mut stream).await?;
        let messages = stream.info().await?.state.messages;
        let after = consumer_readings(&mut stream).await?;
        Ok(count(messages, &before, &after))
    }

    pub(crate) async fn backlog_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        let every = Duration::from_secs(30);
        // One positive reading can be a burst or a partition being rewound
        // (its consumer is re-created); the log waits for a second one.
        let mut previous = 0u64;
        loop {
            match self.backlog().await {
                Ok(b) => {
                    self.metrics.observations_pending.set(b.pending as i64);
                    self.metrics
                        .observations_unconsumed
                        .set(b.unconsumed as i64);
                    let persists = previous > 0 && b.unconsumed > 0;
                    previous = b.unconsumed;
                    if persists {
                        tracing::warn!(
                            unconsumed = b.unconsumed,
                            "OBSERVATIONS holds messages no hub consumer filters; check that every publisher has this nats.partitions and every partition has a hub"
                        );
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cannot read the OBSERVATIONS backlog"),
            }
            tokio::select! { _ = tokio::time::sleep(every) => {}, _ = shutdown.wait() => return }
        }
    }
}

/// One consumer's reading: the messages it has still to deliver or awaits
/// an ack for, and how many deliveries it has made so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Reading {
    pending: u64,
    delivered: u64,
}

/// Every consumer's reading, by name.
async fn consumer_readings(
    stream: &mut async_nats::jetstream::stream::Stream,
) -> anyhow::Result<HashMap<String, Reading>> {
    let mut out = HashMap::new();
    let mut consumers = stream.consumers();
    while let Some(c) = consumers.next().await {
        let c = c?;
        out.insert(
            c.name.clone(),
            Reading {
                pending: c.num_pending + c.num_ack_pending as u64,
                delivered: c.delivered.consumer_sequence,
            },
        );
    }
    Ok(out)
}

/// What the stream's count of `messages`, read between the consumers'
/// readings `before` and `after`, says of the backlog. Each consumer counts
/// with the larger of its two pending figures: a message acked or published
/// while the readings are taken then never shows as unconsumed. A message
/// published after a consumer's first reading and acked before its second
/// is in the stream's count and in neither reading; the deliveries the
/// consumer made between its readings bound how many there can be, so they
/// are not counted as unconsumed (at 3,500 observations/s such messages
/// alone read as a few hundred unconsumed). A backlog on a subject no
/// consumer filters only grows, so it outlasts them.
fn count(
    messages: u64,
    before: &HashMap<String, Reading>,
    after: &HashMap<String, Reading>,
) -> Backlog {
    let mut pending = 0u64;
    let mut in_flight = 0u64;
    for (name, a) in after {
        let b = before.get(name).copied().unwrap_or_default();
        pending += a.pending.max(b.pending);
        // A consumer created anew between the readings counts from zero.
        in_flight += a.delivered.saturating_sub(b.delivered);
    }
    for (name, b) in before {
        if !after.contains_key(name) {
            pending += b.pending;
        }
    }
    Backlog {
        messages,
        pending,
        unconsumed: messages.saturating_sub(pending).saturating_sub(in_flight),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readings(r: &[(&str, u64, u64)]) -> HashMap<String, Reading> {
        r.iter()
            .map(|&(n, pending, delivered)| (n.to_string(), Reading { pending, delivered }))
            .collect()
    }

    #[test]
    fn a_message_no_consumer_counts_is_unconsumed() {
        let r = readings(&[("p0", 3, 10), ("p1", 0, 7)]);
        let b = count(4, &r, &r);
        assert_eq!((b.pending, b.unconsumed), (3, 1));
    }

    #[test]
    fn messages_that_flowed_through_between_the_readings_are_not_unconsumed() {
        // 40 published and acked on p0 while the readings were taken: the
        // stream's count held them, neither reading did.
        let before = readings(&[("p0", 5, 100), ("p1", 2, 50)]);
        let after = readings(&[("p0", 5, 140), ("p1", 2, 50)]);
        let b = count(47, &before, &after);
        assert_eq!((b.pending, b.unconsumed), (7, 0));
        // A stuck backlog larger than the flow still shows.
        let b = count(47 + 500, &before, &after);
        assert_eq!(b.unconsumed, 500);
    }

    #[test]
    fn a_consumer_seen_once_counts_its_pending() {
        // p0 went between the readings, p1 came (and has delivered nothing).
        let before = readings(&[("p0", 4, 9)]);
        let after = readings(&[("p1", 6, 0)]);
        assert_eq!(count(10, &before, &after).unconsumed, 0);
        assert_eq!(count(11, &before, &after).unconsumed, 1);
        // A consumer created anew between its readings counts no flow.
        let before = readings(&[("p0", 4, 50)]);
        let after = readings(&[("p0", 4, 3)]);
        assert_eq!(count(5, &before, &after).unconsumed, 1);
    }
}
