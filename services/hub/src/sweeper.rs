//! The sweeper: re-derives devices whose source went silent (a freshness
//! deadline passed since they were last derived) and applies liveness
//! timeouts, without waiting for a new message.

use std::sync::Arc;
use std::time::Duration;

use crate::store::devices;
use chrono::Utc;
use fleet_runtime::Shutdown;

use crate::work::Work;
use crate::Hub;

impl Hub {
    /// One sweep; returns the number of devices re-derived.
    pub async fn sweep_once(&self) -> anyhow::Result<usize> {
        let h = &self.common.freshness;
        let ttls: Vec<_> = self.ttls.per_source.iter().map(|(s, d)| (*s, *d)).collect();
        let unreachable = chrono::Duration::from_std(h.unreachable_after)
            .unwrap_or(chrono::Duration::days(36_500));
        let lost =
            chrono::Duration::from_std(h.lost_after).unwrap_or(chrono::Duration::days(36_500));
        let mut total = 0;
        loop {
            let due = devices::due_for_sweep(
                &self.deps.pool,
                &ttls,
                self.ttls.default,
                unreachable,
                lost,
                500,
            )
            .await?;
            if due.is_empty() {
                return Ok(total);
            }
            let now = Utc::now();
            let mut tx = self.deps.pool.begin().await?;
            let mut work = Work::lock(&mut tx, &due).await?;
            for id in &due {
                if let Some(state) = work.device(id, "sweep", None) {
                    state.apply_liveness(now, unreachable, lost);
                }
            }
            let (_, work) = work
                .finish(&mut tx, now, &self.ttls, &self.deps.subjects)
                .await?;
            devices::touch_derived(&mut tx, &due).await?;
            self.commit_and_publish(tx, work.outbox).await?;
            self.metrics.swept.inc_by(due.len() as u64);
            total += due.len();
            if due.len() < 500 {
                return Ok(total);
            }
        }
    }

    /// Bounds `unresolved_observations` (`hub.unresolved_retention`,
    /// `hub.unresolved_max_rows`).
    pub async fn expire_unresolved(&self) -> Result<u64, sqlx::Error> {
        let h = &self.config;
        let before = Utc::now()
            - chrono::Duration::from_std(h.unresolved_retention)
                .unwrap_or(chrono::Duration::days(36_500));
        let gone =
            devices::expire_unresolved(&self.deps.pool, before, h.unresolved_max_rows).await?;
        if gone > 0 {
            tracing::info!(removed = gone, "expired unresolved observation keys");
        }
        Ok(gone)
    }

    pub(crate) async fn sweep_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        let every = self.config.sweep_interval.max(Duration::from_millis(100));
        let mut pause = every;
        loop {
            tokio::select! { _ = tokio::time::sleep(pause) => {}, _ = shutdown.wait() => return }
            let started = std::time::Instant::now();
            if let Err(e) = self.sweep_once().await {
                tracing::warn!(error = %e, "sweep failed; next interval retries");
            }
            if let Err(e) = self.expire_unresolved().await {
                tracing::warn!(error = %e, "expiring unresolved observations failed; next interval retries");
            }
            // Finding what is due reads every freshness row of the fleet,
            // which grows with it: at most a tenth of the time.
            pause = fleet_runtime::pace::pause_after(every, started.elapsed(), 10);
        }
    }
}
