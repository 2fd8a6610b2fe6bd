//! The sweeper: re-derives devices whose source went silent (a freshness
//! deadline passed since they were last derived) and applies liveness
//! timeouts, without waiting for a new message.

use std::sync::Arc;
use std::time::Duration;

use crate::store::devices;
use chrono::Utc;
use fleet_domain::state::SweepTurn;
use fleet_runtime::Shutdown;

use crate::work::Work;
use crate::Hub;

/// Devices a sweep looks at in one statement.
const SWEEP_BATCH: usize = 500;
/// Batches one sweep runs at most before it pauses: after a change of the
/// TTLs every live device is due once, and lanes need the database too.
const SWEEP_MAX_BATCHES: usize = 200;

impl Hub {
    /// One sweep: looks at the devices whose `sweep_at` has passed (and
    /// only those: `device_sweep_at` finds them), sets again the `sweep_at`
    /// of those nothing is due for, and re-derives the others under their
    /// locks. Returns the number of devices re-derived.
    pub async fn sweep_once(&self) -> anyhow::Result<usize> {
        let params = devices::SweepParams::new(&self.deadlines);
        let mut total = 0;
        for _ in 0..SWEEP_MAX_BATCHES {
            let looked =
                devices::look_for_sweep(&self.deps.pool, SWEEP_BATCH as i64, &params).await?;
            self.metrics.sweep_looked.inc_by(looked.len() as u64);
            let mut due: Vec<String> = looked
                .iter()
                .filter(|(_, due)| *due)
                .map(|(id, _)| id.clone())
                .collect();
            if !due.is_empty() {
                due.sort();
                total += self.sweep_due(&due, &params).await?;
            }
            if looked.len() < SWEEP_BATCH {
                break;
            }
        }
        Ok(total)
    }

    /// Re-derives the devices of `ids` still due once locked, and sets the
    /// `sweep_at` of all of them; returns how many were re-derived.
    async fn sweep_due(
        &self,
        ids: &[String],
        params: &devices::SweepParams,
    ) -> anyhow::Result<usize> {
        let mut tx = self.deps.pool.begin().await?;
        // Locked first, read after: a write of these devices that
        // committed while this waited is seen by the reads below.
        devices::lock_heads(&mut tx, ids, &[], devices::HeldRows::Wait).await?;
        let due = devices::due_among(&mut tx, ids, params).await?;
        let mut outbox = vec![];
        if !due.is_empty() {
            let now = Utc::now();
            let (unreachable, lost) = (self.deadlines.unreachable_after, self.deadlines.lost_after);
            let mut work = Work::load_locked(&mut tx, &due).await?;
            for id in &due {
                if let Some(state) = work.device(id, "sweep", None) {
                    state.apply_liveness(now, unreachable, lost);
                }
            }
            let (_, work) = work
                .finish(&mut tx, now, &self.deadlines, &self.deps.subjects)
                .await?;
            devices::touch_derived(&mut tx, &due).await?;
            outbox = work.outbox;
        }
        devices::set_sweep(&mut tx, ids, params).await?;
        self.commit_and_publish(tx, outbox).await?;
        self.metrics.swept.inc_by(due.len() as u64);
        Ok(due.len())
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
        let fingerprint = &self.sweep_settings;
        // The newer settings this replica leaves the sweep to, while it does.
        let mut leaving: Option<String> = None;
        loop {
            tokio::select! { _ = tokio::time::sleep(every) => {}, _ = shutdown.wait() => return }
            match devices::take_sweep_turn(&self.deps.pool, fingerprint).await {
                Ok((SweepTurn::Leave { newer }, _)) => {
                    if leaving.as_ref() != Some(&newer) {
                        tracing::info!(ours = %fingerprint, %newer, "a replica started later runs other freshness TTLs or liveness timeouts: this replica leaves the sweep to it");
                    }
                    leaving = Some(newer);
                    self.metrics.sweeping.set(0);
                }
                Ok((SweepTurn::Sweep { .. }, marked)) => {
                    if leaving.take().is_some() {
                        tracing::info!("no replica started later with other settings is live: this replica sweeps again");
                    }
                    if let Some(marked) = marked {
                        tracing::info!(marked, "the freshness TTLs or liveness timeouts that sweep are new, or a replica with other ones has gone: every live device is swept once");
                    }
                    self.metrics.sweeping.set(1);
                    if let Err(e) = self.sweep_once().await {
                        tracing::warn!(error = %e, "sweep failed; next interval retries");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read whose sweep it is; next interval retries");
                }
            }
            match devices::sweep_behind(&self.deps.pool).await {
                Ok(secs) => {
                    self.metrics.sweep_behind.set(secs);
                }
                Err(e) => tracing::debug!(error = %e, "cannot read how far the sweep is behind"),
            }
            if let Err(e) = self.expire_unresolved().await {
                tracing::warn!(error = %e, "expiring unresolved observations failed; next interval retries");
            }
        }
    }
}
