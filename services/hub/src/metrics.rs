//! The hub's Prometheus metrics.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::observations::BatchStats;

type Labels = Vec<(String, String)>;

#[derive(Clone)]
pub struct HubMetrics {
    pub observations: Family<Labels, Counter>,
    pub dead_lettered: Family<Labels, Counter>,
    pub rows_written: Family<Labels, Counter>,
    pub status_events: Counter,
    pub outbox_published: Counter,
    pub commands: Family<Labels, Counter>,
    pub batch_size: Histogram,
    pub swept: Counter,
    pub confirmed: Counter,
    pub observations_pending: Gauge,
    pub observations_unconsumed: Gauge,
    pub registry: Arc<Mutex<Registry>>,
}

impl HubMetrics {
    pub fn new() -> Self {
        let m = HubMetrics {
            observations: Family::default(),
            dead_lettered: Family::default(),
            rows_written: Family::default(),
            status_events: Counter::default(),
            outbox_published: Counter::default(),
            commands: Family::default(),
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            swept: Counter::default(),
            confirmed: Counter::default(),
            observations_pending: Gauge::default(),
            observations_unconsumed: Gauge::default(),
            registry: Arc::new(Mutex::new(Registry::with_prefix("fleet_hub"))),
        };
        {
            let mut r = m.registry.lock().unwrap_or_else(|p| p.into_inner());
            r.register(
                "observations",
                "Observations by outcome (applied, stale, duplicate, unresolved, rejected)",
                m.observations.clone(),
            );
            r.register(
                "dead_lettered",
                "Messages copied to DLQ, by reason",
                m.dead_lettered.clone(),
            );
            r.register(
                "rows_written",
                "Rows written by table",
                m.rows_written.clone(),
            );
            r.register(
                "status_events",
                "StatusChanged rows written to the outbox",
                m.status_events.clone(),
            );
            r.register(
                "outbox_published",
                "Outbox rows published and acknowledged by JetStream",
                m.outbox_published.clone(),
            );
            r.register(
                "commands",
                "Hub commands by verb and result code",
                m.commands.clone(),
            );
            r.register(
                "batch_size",
                "Messages per applied batch",
                m.batch_size.clone(),
            );
            r.register(
                "swept",
                "Devices re-derived by the sweeper",
                m.swept.clone(),
            );
            r.register(
                "snapshots_confirmed",
                "Observations the fast path applied without loading the device (a snapshot with the same content: only freshness moved; a heartbeat of the live session: only session_last_seen moved); a subset of applied",
                m.confirmed.clone(),
            );
            r.register(
                "observations_pending",
                "OBSERVATIONS messages pending for a hub consumer or in a hub's hands",
                m.observations_pending.clone(),
            );
            r.register(
                "observations_unconsumed",
                "OBSERVATIONS messages on subjects no hub consumer filters (alert when above 0)",
                m.observations_unconsumed.clone(),
            );
        }
        m
    }

    fn count(f: &Family<Labels, Counter>, key: &str, value: &str, n: u64) {
        if n > 0 {
            f.get_or_create(&vec![(key.to_string(), value.to_string())])
                .inc_by(n);
        }
    }

    pub fn record_batch(&self, s: &BatchStats) {
        Self::count(&self.observations, "outcome", "applied", s.applied);
        Self::count(&self.observations, "outcome", "stale", s.stale);
        Self::count(&self.observations, "outcome", "duplicate", s.duplicate);
        Self::count(&self.observations, "outcome", "unresolved", s.unresolved);
        Self::count(&self.observations, "outcome", "rejected", s.rejected);
        self.confirmed.inc_by(s.confirmed);
        Self::count(
            &self.rows_written,
            "table",
            "devices",
            s.summary.written.devices,
        );
        Self::count(
            &self.rows_written,
            "table",
            "device_conditions",
            s.summary.written.conditions,
        );
        Self::count(
            &self.rows_written,
            "table",
            "device_source_freshness",
            s.summary.written.freshness,
        );
        Self::count(
            &self.rows_written,
            "table",
            "device_lifecycle_events",
            s.summary.lifecycle,
        );
        self.status_events.inc_by(s.summary.events);
        self.batch_size
            .observe((s.applied + s.stale + s.duplicate + s.unresolved + s.rejected) as f64);
    }

    pub fn dead_letter(&self, reason: &str) {
        Self::count(&self.dead_lettered, "reason", reason, 1);
    }

    pub fn command(&self, verb: &str, code: &str) {
        self.commands
            .get_or_create(&vec![
                ("verb".into(), verb.into()),
                ("code".into(), code.into()),
            ])
            .inc();
    }
}

impl Default for HubMetrics {
    fn default() -> Self {
        Self::new()
    }
}
