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
    /// Claims rows a lane wrote and will publish itself right after its
    /// commit; the relay leaves them alone.
    pub(crate) fn claim(&self, rows: &[outbox::PendingRow]) {
        let mut c = self.outbox_claims.lock().unwrap_or_else(|p| p.into_inner());
        c.extend(rows.iter().map(|r| r.id));
    }

    pub(crate) fn unclaim(&self, ids: impl IntoIterator<Item = i64>) {
        let mut c = self.outbox_claims.lock().unwrap_or_else(|p| p.into_inner());
        for id in ids {
            c.remove(&id);
        }
    }

    /// Publishes rows a lane committed, awaiting every PubAck; the relay
    /// deletes the acked ones and publishes any that were not.
    pub(crate) async fn publish_committed(&self, rows: Vec<outbox::PendingRow>) {
        if rows.is_empty() {
            return;
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let acked = self.publish_rows(&rows).await;
        self.metrics.outbox_published.inc_by(acked.len() as u64);
        self.outbox_acked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(acked);
        self.unclaim(ids);
        self.relay_wake.notify_one();
    }

    /// Publishes in order with at most `WINDOW` PubAcks outstanding (the
    /// JetStream context blocks new publishes past its in-flight limit, so
    /// publishing everything before awaiting would deadlock); returns the
    /// acked ids, a prefix of `rows`.
    async fn publish_rows(&self, rows: &[outbox::PendingRow]) -> Vec<i64> {
        const WINDOW: usize = 256;
        let mut inflight = std::collections::VecDeque::with_capacity(WINDOW);
        let mut acked = Vec::with_capacity(rows.len());
        let mut failed = false;
        for row in rows {
            if inflight.len() >= WINDOW {
                let (id, ack): (i64, async_nats::jetstream::context::PublishAckFuture) =
                    inflight.pop_front().expect("window is full");
                match ack.await {
                    Ok(_) => acked.push(id),
                    Err(e) => {
                        tracing::warn!(error = %e, outbox_id = id, "no PubAck");
                        failed = true;
                        break;
                    }
                }
            }
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
                Ok(ack) => inflight.push_back((row.id, ack)),
                Err(e) => {
                    tracing::warn!(error = %e, outbox_id = row.id, "publish failed");
                    failed = true;
                    break;
                }
            }
        }
        // Await what is in flight even after a failure: a row stays in the
        // outbox unless its own ack arrived, and a re-publish is deduplicated.
        for (id, ack) in inflight {
            match ack.await {
                Ok(_) if !failed => acked.push(id),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, outbox_id = id, "no PubAck");
                    failed = true;
                }
            }
        }
        acked
    }

    /// Deletes what lanes published, then publishes one page of the rows
    /// nobody is publishing; returns how many it published.
    pub async fn relay_once(&self) -> anyhow::Result<usize> {
        let done: Vec<i64> =
            std::mem::take(&mut *self.outbox_acked.lock().unwrap_or_else(|p| p.into_inner()));
        if let Err(e) = outbox::delete(&self.pool, &done).await {
            self.outbox_acked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(done);
            return Err(e.into());
        }
        let claimed: Vec<i64> = self
            .outbox_claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect();
        let mut tx = self.pool.begin().await?;
        let rows = outbox::pending(&mut tx, self.config.hub.outbox_batch, &claimed).await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let acked = self.publish_rows(&rows).await;
        outbox::delete(&mut *tx, &acked).await?;
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
                        let _ = self.relay_once().await;
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
