//! The outbox relay: publishes `StatusChanged` rows to `STATUS` with
//! `Nats-Msg-Id = outbox-<id>`, awaits every PubAck, then deletes the rows.
//! A crash between commit and publish re-publishes; the stream's duplicate
//! window drops the copy.

use std::sync::Arc;
use std::time::Duration;

use fleet_runtime::Shutdown;
use fleet_store::outbox;

use crate::Hub;

impl Hub {
    /// Publishes one page of pending rows; returns how many were acked.
    pub async fn relay_once(&self) -> anyhow::Result<usize> {
        let mut tx = self.pool.begin().await?;
        let rows = outbox::pending(&mut tx, self.config.hub.outbox_batch).await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let mut inflight = Vec::with_capacity(rows.len());
        for row in &rows {
            let headers = fleet_bus::headers(&row.schema, row.traceparent.as_deref());
            let msg_id = format!("outbox-{}", row.id);
            match fleet_bus::publish(
                &self.js,
                row.subject.clone(),
                &msg_id,
                headers,
                row.payload.clone().into(),
            )
            .await
            {
                Ok(ack) => inflight.push((row.id, ack)),
                Err(e) => {
                    tracing::warn!(error = %e, outbox_id = row.id, "publish failed");
                    break;
                }
            }
        }
        let mut acked = Vec::with_capacity(inflight.len());
        for (id, ack) in inflight {
            match ack.await {
                Ok(_) => acked.push(id),
                Err(e) => {
                    // Later rows may be stored already; they stay in the
                    // outbox and their re-publish is deduplicated.
                    tracing::warn!(error = %e, outbox_id = id, "no PubAck");
                    break;
                }
            }
        }
        outbox::delete(&mut tx, &acked).await?;
        tx.commit().await?;
        self.metrics.outbox_published.inc_by(acked.len() as u64);
        if acked.len() < rows.len() {
            anyhow::bail!(
                "{} of {} outbox rows not acknowledged",
                rows.len() - acked.len(),
                rows.len()
            );
        }
        Ok(acked.len())
    }

    pub(crate) async fn relay_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.relay_once().await {
                Ok(n) if n > 0 => {
                    backoff = Duration::from_millis(100);
                    continue;
                }
                Ok(_) => {
                    if shutdown.is_triggered() {
                        return;
                    }
                    tokio::select! {
                        _ = self.relay_wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                        _ = shutdown.wait() => {}
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "outbox relay retrying");
                    if shutdown.is_triggered() {
                        // Flushing at shutdown is best effort: rows stay
                        // and the next start publishes them.
                        return;
                    }
                    tokio::select! { _ = tokio::time::sleep(backoff) => {}, _ = shutdown.wait() => {} }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}
