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
    pub async fn backlog(&self) -> anyhow::Result<Backlog> {
        let mut stream = self.js.get_stream(self.streams.observations()).await?;
        let messages = stream.info().await?.state.messages;
        let mut pending = 0u64;
        let mut consumers = stream.consumers();
        while let Some(c) = consumers.next().await {
            let c = c?;
            pending += c.num_pending + c.num_ack_pending as u64;
        }
        Ok(Backlog {
            messages,
            pending,
            unconsumed: messages.saturating_sub(pending),
        })
    }

    pub(crate) async fn backlog_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        let every = Duration::from_secs(30);
        loop {
            match self.backlog().await {
                Ok(b) => {
                    self.metrics.observations_pending.set(b.pending as i64);
                    self.metrics.observations_unconsumed.set(b.unconsumed as i64);
                    if b.unconsumed > 0 {
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
