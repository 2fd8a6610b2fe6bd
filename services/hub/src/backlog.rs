//! Observations nobody consumes. Each queue of each partition is a
//! work-queue stream of its own (`fleet_bus::StreamNames::observations`),
//! so every message in one is pending for that stream's hub consumer or in
//! a hub's hands, unless the stream has no consumer at all: no replica has
//! ever taken the partition, or the one that did is re-creating it. What
//! waits in such a stream is reported as `fleet_hub_observations_unconsumed`,
//! an alert (docs/operations.md). A publisher with another partition count
//! is refused at its start, and its messages for a partition this mesh does
//! not have find no stream: the publish fails and is retried.

use std::sync::Arc;
use std::time::Duration;

use fleet_bus::ObservationStream;
use fleet_runtime::Shutdown;

use crate::Hub;

/// What the streams hold, and how much of it no consumer will deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    pub messages: u64,
    pub pending: u64,
    pub unconsumed: u64,
}

/// How often the loop reads the streams (one info request each).
const EVERY: Duration = Duration::from_secs(30);

impl Hub {
    /// The backlog now: a stream without a consumer whose oldest message
    /// has waited at least `young` counts as unconsumed (a consumer being
    /// re-created leaves its stream without one for a moment).
    pub async fn backlog(&self, young: Duration) -> anyhow::Result<Backlog> {
        let streams = fleet_bus::observation_streams(&self.deps.js, &self.common.nats).await?;
        Ok(tally(&streams, young))
    }

    pub(crate) async fn backlog_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        // One positive reading can be a partition being rewound (its
        // consumer is re-created); the log waits for a second one.
        let mut previous = 0u64;
        loop {
            match self.backlog(EVERY).await {
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
                            "observation streams without a hub consumer hold messages; check that every partition has a live hub replica"
                        );
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cannot read the observation streams"),
            }
            tokio::select! { _ = tokio::time::sleep(EVERY) => {}, _ = shutdown.wait() => return }
        }
    }
}

/// The backlog the streams' states tell: what a stream with a consumer
/// holds is pending; what a stream without one has held for `young` or
/// longer is unconsumed.
fn tally(streams: &[ObservationStream], young: Duration) -> Backlog {
    let mut b = Backlog {
        messages: 0,
        pending: 0,
        unconsumed: 0,
    };
    for s in streams {
        b.messages += s.messages;
        if s.consumers == 0 && s.messages > 0 && s.oldest >= young {
            b.unconsumed += s.messages;
        } else {
            b.pending += s.messages;
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_bus::Queue;

    fn stream(partition: u32, messages: u64, consumers: usize, oldest: u64) -> ObservationStream {
        ObservationStream {
            name: format!("OBSERVATIONS_P{partition}"),
            queue: Queue::Reads,
            partition,
            messages,
            consumers,
            oldest: Duration::from_secs(oldest),
        }
    }

    #[test]
    fn what_a_consumed_stream_holds_is_pending() {
        let b = tally(&[stream(0, 40, 1, 3600), stream(1, 0, 1, 0)], EVERY);
        assert_eq!((b.messages, b.pending, b.unconsumed), (40, 40, 0));
    }

    #[test]
    fn what_waits_in_a_stream_without_a_consumer_is_unconsumed() {
        let b = tally(&[stream(0, 5, 1, 10), stream(1, 7, 0, 31)], EVERY);
        assert_eq!((b.messages, b.pending, b.unconsumed), (12, 5, 7));
    }

    #[test]
    fn a_stream_whose_consumer_is_being_recreated_is_not_unconsumed_at_once() {
        // Its oldest message is younger than a period: a rewind, not a
        // partition nobody takes.
        let b = tally(&[stream(0, 9, 0, 2)], EVERY);
        assert_eq!((b.pending, b.unconsumed), (9, 0));
        assert_eq!(tally(&[stream(0, 9, 0, 2)], Duration::ZERO).unconsumed, 9);
        assert_eq!(tally(&[stream(0, 0, 0, 0)], Duration::ZERO).unconsumed, 0);
    }
}
