//! Latch drift: a periodic count of devices whose durable fabric latch
//! disagrees with a fresh live observation (`fleet_domain::drift`),
//! exported as `fleet_hub_latch_drift_devices{site,latch,drift}`. The hub
//! only counts: it never rewrites a latch from an observation.

use std::sync::Arc;
use std::time::Duration;

use fleet_runtime::Shutdown;
use fleet_store::drift::{counts, DriftCount, Freshness};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::Hub;

type Labels = Vec<(String, String)>;

impl Hub {
    /// The drift counts now.
    pub async fn drift_counts(&self) -> Result<Vec<DriftCount>, sqlx::Error> {
        let per_source: Vec<_> = self
            .deadlines
            .ttls
            .per_source
            .iter()
            .map(|(s, d)| (*s, *d))
            .collect();
        counts(
            &self.deps.pool,
            &Freshness {
                per_source: &per_source,
                default: self.deadlines.ttls.default,
            },
        )
        .await
    }

    /// Refreshes the gauge every six sweep intervals (30 s by default), or
    /// less often when counting is slow.
    pub(crate) async fn drift_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        let gauge: Family<Labels, Gauge> = Family::default();
        self.metrics
            .registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register(
                "latch_drift_devices",
                "Devices whose durable fabric latch disagrees with a fresh live observation, by site, latch and drift (unguarded, stale_guard)",
                gauge.clone(),
            );
        let every = self.config.sweep_interval.max(Duration::from_millis(100)) * 6;
        loop {
            let started = std::time::Instant::now();
            match self.drift_counts().await {
                Ok(rows) => {
                    gauge.clear();
                    for r in rows {
                        gauge
                            .get_or_create(&vec![
                                ("site".to_string(), r.site_id),
                                ("latch".to_string(), r.latch_type),
                                ("drift".to_string(), r.drift),
                            ])
                            .set(r.devices);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "latch drift count failed; next interval retries")
                }
            }
            // The count reads every fabric row of the fleet (seconds, on
            // parallel workers, at 100,000 devices) and must not take a core
            // from the observations: at most a twentieth of the time.
            let pause = fleet_runtime::pace::pause_after(every, started.elapsed(), 20);
            tokio::select! { _ = tokio::time::sleep(pause) => {}, _ = shutdown.wait() => return }
        }
    }
}
