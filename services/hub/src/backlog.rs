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

/// How often the loop reads the stream's count.
const EVERY: Duration = Duration::from_secs(30);
/// At most how often it reads every consumer: on nats-server 2.9 a
/// consumer's pending count for a filtered consumer is a scan of the
/// stream, and the `CONSUMER.LIST` of the readings held the whole server
/// for 3.5 - 7.3 s (every client's read loop waiting) while `OBSERVATIONS`
/// held 500,000 messages behind a hub that had fallen behind.
const READINGS_EVERY: Duration = Duration::from_secs(300);

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

    /// The backlog from the stream's count alone (one cheap request), when
    /// that settles it: see [`settled`].
    pub async fn quick_backlog(&self, young: Duration) -> anyhow::Result<Option<Backlog>> {
        let (messages, oldest) = self.stream_count().await?;
        Ok(settled(messages, oldest, young))
    }

    /// The messages `OBSERVATIONS` holds and how long its oldest has.
    async fn stream_count(&self) -> anyhow::Result<(u64, Duration)> {
        let mut stream = self
            .deps
            .js
            .get_stream(self.deps.streams.observations())
            .await?;
        let state = &stream.info().await?.state;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
        let age = now.as_nanos() as i128 - state.first_timestamp.unix_timestamp_nanos();
        Ok((
            state.messages,
            Duration::from_nanos(u64::try_from(age).unwrap_or(0)),
        ))
    }

    pub(crate) async fn backlog_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        // One positive reading can be a burst or a partition being rewound
        // (its consumer is re-created); the log waits for a second one.
        let mut previous = 0u64;
        let mut read_at: Option<tokio::time::Instant> = None;
        loop {
            let due = read_at.is_none_or(|t| t.elapsed() >= READINGS_EVERY);
            let reading = match self.stream_count().await {
                Ok((messages, oldest)) => match settled(messages, oldest, EVERY) {
                    Some(b) => Ok(Some(b)),
                    None if due => {
                        read_at = Some(tokio::time::Instant::now());
                        self.backlog().await.map(Some)
                    }
                    // Not due: the pending gauge from the count alone (an
                    // upper bound), the unconsumed one as last read.
                    None => {
                        self.metrics.observations_pending.set(messages as i64);
                        Ok(None)
                    }
                },
                Err(e) => Err(e),
            };
            match reading {
                Ok(Some(b)) => {
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
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "cannot read the OBSERVATIONS backlog"),
            }
            tokio::select! { _ = tokio::time::sleep(EVERY) => {}, _ = shutdown.wait() => return }
        }
    }
}

/// The backlog when the stream's count of `messages` and the age of its
/// oldest one settle it: `OBSERVATIONS` is a work queue, and a message no
/// consumer filters stays in it for good, so while its oldest message is
/// younger than `young`, nothing has waited unconsumed for longer than
/// that, and every message is pending for a consumer or in a hub's hands.
/// `None`: only the consumers' readings tell.
fn settled(messages: u64, oldest: Duration, young: Duration) -> Option<Backlog> {
    (messages == 0 || oldest < young).then_some(Backlog {
        messages,
        pending: messages,
        unconsumed: 0,
    })
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
    fn the_count_alone_settles_a_stream_whose_oldest_message_is_young() {
        let young = Duration::from_secs(30);
        let b = settled(0, Duration::from_secs(3600), young).unwrap();
        assert_eq!((b.pending, b.unconsumed), (0, 0));
        let b = settled(500, Duration::from_secs(29), young).unwrap();
        assert_eq!((b.messages, b.pending, b.unconsumed), (500, 500, 0));
        // The oldest message has waited a whole period: it may be one no
        // consumer filters, so only the readings tell.
        assert_eq!(settled(500, young, young), None);
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
