//! The hub's outbox relay (`fleet_outbox::HUB`): a lane publishes the
//! `StatusChanged` rows it wrote right after its commit and claims them, so
//! the relay deletes what lanes published and publishes only what nobody
//! did. A crash between commit and publish re-publishes; the stream's
//! duplicate window drops the copy.

use std::sync::Arc;
use std::time::Duration;

use fleet_outbox::{Pending, HUB};
use fleet_runtime::Shutdown;

use crate::Hub;

impl Hub {
    /// Claims rows a lane wrote and will publish itself right after its
    /// commit; the relay leaves them alone.
    pub(crate) fn claim(&self, rows: &[Pending]) {
        let mut c = self.outbox_claims.lock().unwrap_or_else(|p| p.into_inner());
        c.extend(rows.iter().map(|r| r.id));
    }

    pub(crate) fn unclaim(&self, ids: impl IntoIterator<Item = i64>) {
        let mut c = self.outbox_claims.lock().unwrap_or_else(|p| p.into_inner());
        for id in ids {
            c.remove(&id);
        }
    }

    /// Commits a transaction that wrote `rows` to the outbox, then
    /// publishes them at once, as a lane does: the relay is left only what
    /// could not be published (at 100,000 devices the births and the first
    /// snapshots' events outran a relay publishing 1,000 rows a round).
    pub(crate) async fn commit_and_publish(
        &self,
        tx: sqlx::Transaction<'_, sqlx::Postgres>,
        rows: Vec<Pending>,
    ) -> Result<(), sqlx::Error> {
        self.claim(&rows);
        if let Err(e) = tx.commit().await {
            self.unclaim(rows.iter().map(|r| r.id));
            return Err(e);
        }
        self.publish_committed(rows).await;
        Ok(())
    }

    /// The end of a command's transaction: finishes its unit of work
    /// (derivation, rows, lifecycle, outbox), commits, and publishes the
    /// status events; returns the finished work for the reply.
    pub(crate) async fn commit_work(
        &self,
        mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
        work: crate::work::Work,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<crate::work::Work, fleet_store::StoreError> {
        let (_, mut work) = work
            .finish(&mut tx, now, &self.deadlines, &self.deps.subjects)
            .await?;
        self.commit_and_publish(tx, std::mem::take(&mut work.outbox))
            .await?;
        Ok(work)
    }

    /// Publishes rows a lane committed, awaiting every PubAck; the relay
    /// deletes the acked ones and publishes any that were not.
    pub(crate) async fn publish_committed(&self, rows: Vec<Pending>) {
        if rows.is_empty() {
            return;
        }
        let acked = HUB.publish(&self.deps.js, &rows).await;
        self.metrics.outbox_published.inc_by(acked.len() as u64);
        // The acked rows stay claimed until the relay has deleted them, so
        // it never publishes them a second time in between; the rest go
        // back to the relay.
        let done: std::collections::HashSet<i64> = acked.iter().copied().collect();
        self.unclaim(rows.iter().map(|r| r.id).filter(|id| !done.contains(id)));
        self.outbox_acked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(acked);
        self.relay_wake.notify_one();
    }

    /// Deletes the rows writers have published (their PubAcks arrived).
    async fn delete_acked(&self) -> anyhow::Result<()> {
        let done: Vec<i64> =
            std::mem::take(&mut *self.outbox_acked.lock().unwrap_or_else(|p| p.into_inner()));
        if let Err(e) = HUB.delete(&self.deps.pool, &done).await {
            self.outbox_acked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(done);
            return Err(e.into());
        }
        self.unclaim(done);
        Ok(())
    }

    /// Deletes what writers published, then publishes one page of the rows
    /// nobody is publishing: written at least `RELAY_AGE_SECS` ago (a
    /// writer that could not publish, or a process that died after its
    /// commit) and not claimed by a writer of this process. Returns how
    /// many it published.
    pub async fn relay_once(&self) -> anyhow::Result<usize> {
        self.delete_acked().await?;
        let claimed: std::collections::HashSet<i64> = self
            .outbox_claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let (acked, read) = HUB
            .relay_once(
                &self.deps.pool,
                &self.deps.js,
                self.config.outbox_batch,
                RELAY_AGE_SECS,
                |id| claimed.contains(&id),
            )
            .await?;
        self.metrics.outbox_published.inc_by(acked as u64);
        if acked < read {
            anyhow::bail!("{} of {read} outbox rows not acknowledged", read - acked);
        }
        Ok(acked)
    }

    /// Deletes published rows whenever a writer wakes it, and looks for
    /// rows nobody published once a second (at once again after a page).
    pub(crate) async fn relay_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        let mut backoff = Duration::from_millis(100);
        let mut last_scan: Option<tokio::time::Instant> = None;
        loop {
            let scan = last_scan.is_none_or(|t| t.elapsed() >= RELAY_SCAN_EVERY);
            let result = if scan {
                last_scan = Some(tokio::time::Instant::now());
                self.relay_once().await
            } else {
                self.delete_acked().await.map(|()| 0)
            };
            match result {
                Ok(n) if n > 0 => {
                    backoff = Duration::from_millis(100);
                    last_scan = None;
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

/// Rows younger than this are their writer's to publish.
const RELAY_AGE_SECS: f64 = 2.0;
/// How often the relay looks for rows nobody published.
const RELAY_SCAN_EVERY: Duration = Duration::from_secs(1);
