//! Observations nobody consumes: `OBSERVATIONS` is a work queue, so every
//! message in it is pending for a hub consumer, in a hub's hands, or on a
//! subject no consumer filters (a publisher with another partition count,
//! a partition no replica binds). The last kind is reported as
//! `fleet_hub_observations_unconsumed`, an alert (docs/operations.md).

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
    /// The stream's count is read between two readings of every consumer,
    /// and each consumer counts with the larger of its two: a message acked
    /// or published while the readings are taken then never shows as
    /// unconsumed (pending moves one way within a few milliseconds).
    pub async fn backlog(&self) -> anyhow::Result<Backlog> {
        let mut stream = self
            .deps
            .js
            .get_stream(self.deps.streams.observations())
            .await?;
        let before = consumer_pending(&mut stream).await?;
        let messages = stream.info().await?.state.messages;
        let after = consumer_pending(&mut stream).await?;
        let mut pending = 0u64;
        for (name, p) in &after {
            pending += (*p).max(before.get(name).copied().unwrap_or(0));
        }
        for (name, p) in &before {
            if !after.contains_key(name) {
                pending += p;
            }
        }
        Ok(Backlog {
            messages,
            pending,
            unconsumed: messages.saturating_sub(pending),
        })
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

/// Every consumer's messages still to deliver or awaiting an ack, by name.
async fn consumer_pending(
    stream: &mut async_nats::jetstream::stream::Stream,
) -> anyhow::Result<std::collections::HashMap<String, u64>> {
    let mut out = std::collections::HashMap::new();
    let mut consumers = stream.consumers();
    while let Some(c) = consumers.next().await {
        let c = c?;
        out.insert(c.name.clone(), c.num_pending + c.num_ack_pending as u64);
    }
    Ok(out)
}
