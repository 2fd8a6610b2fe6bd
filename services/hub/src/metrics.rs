//! The hub's Prometheus metrics.

use std::sync::{Arc, Mutex};

use fleet_runtime::metrics::{count, labels, Histograms, Labels, Metrics};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::observations::BatchStats;

#[derive(Clone)]
pub struct HubMetrics {
    pub observations: Family<Labels, Counter>,
    pub dead_lettered: Family<Labels, Counter>,
    pub rows_written: Family<Labels, Counter>,
    pub status_events: Counter,
    pub outbox_published: Counter,
    pub commands: Family<Labels, Counter>,
    pub batch_size: Histogram,
    pub batch_seconds: Histograms,
    pub swept: Counter,
    pub sweep_looked: Counter,
    pub sweep_behind: Gauge,
    pub sweeping: Gauge,
    pub confirmed: Counter,
    pub deferred: Counter,
    pub observations_pending: Gauge,
    pub observations_unconsumed: Gauge,
    pub lease_held: Gauge,
    pub lease_lost: Counter,
    pub lease_round_seconds: Histogram,
    pub registry: Arc<Mutex<Registry>>,
}

impl HubMetrics {
    pub fn new() -> Self {
        let m = Metrics::new("fleet_hub");
        HubMetrics {
            observations: m.counters(
                "observations",
                "Observations by outcome (applied, stale, duplicate, unresolved, rejected)",
            ),
            dead_lettered: m.counters("dead_lettered", "Messages copied to DLQ, by reason"),
            rows_written: m.counters("rows_written", "Rows written by table"),
            status_events: m.counter(
                "status_events",
                "StatusChanged rows written to the outbox",
            ),
            outbox_published: m.counter(
                "outbox_published",
                "Outbox rows published and acknowledged by JetStream",
            ),
            commands: m.counters("commands", "Hub commands by verb and result code"),
            batch_size: m.histogram(
                "batch_size",
                "Messages per applied batch",
                exponential_buckets(1.0, 2.0, 12),
            ),
            batch_seconds: m.histograms(
                "batch_seconds",
                "Where a lane's batch spends its time, by stage: age (its oldest message's time in the stream when the batch closes), wait (from the lane taking its first message to the batch closing, at most hub.linger after that message was fetched), apply (the transaction), publish (acks and StatusChanged publishes after the commit)",
                || Histogram::new(exponential_buckets(0.000_25, 2.0, 16)),
            ),
            swept: m.counter("swept", "Devices re-derived by the sweeper"),
            sweep_looked: m.counter(
                "sweep_looked",
                "Devices the sweeper looked at because their sweep_at had passed; swept counts those a deadline had passed for",
            ),
            sweep_behind: m.gauge(
                "sweep_behind_seconds",
                "After a sweep, how long ago the earliest sweep_at still waiting passed (0: none): how late a silent source or a late heartbeat is noticed",
            ),
            sweeping: m.gauge(
                "sweeping",
                "1 while this replica sweeps, 0 while it leaves the sweep to a replica started later with other freshness TTLs or liveness timeouts (a rolling change of them); the sum over replicas is 0 only when none sweeps",
            ),
            confirmed: m.counter(
                "snapshots_confirmed",
                "Observations the fast path applied without loading the device (a snapshot with the same content: only freshness moved; a heartbeat of the live session: only session_last_seen moved); a subset of applied",
            ),
            deferred: m.counter(
                "observations_deferred",
                "Observations whose device another transaction held when their batch locked it (another lane's batch or a command): applied right after the rest of the batch committed, in a transaction that waits for the device",
            ),
            observations_pending: m.gauge(
                "observations_pending",
                "Observation stream messages pending for a hub consumer or in a hub's hands",
            ),
            observations_unconsumed: m.gauge(
                "observations_unconsumed",
                "Observation stream messages that have waited 30 s or more in a stream no hub consumes (alert when above 0)",
            ),
            lease_held: m.gauge(
                "partition_leases_held",
                "Observation partitions this replica holds a lease on and consumes",
            ),
            lease_lost: m.counter(
                "partition_leases_lost",
                "Partition leases this replica found taken over (not handed back)",
            ),
            lease_round_seconds: m.histogram(
                "partition_lease_round_seconds",
                "Time of one lease round (heartbeat, renew, hand back, claim)",
                exponential_buckets(0.001, 2.0, 12),
            ),
            registry: m.registry(),
        }
    }

    pub fn record_batch(&self, s: &BatchStats) {
        for (outcome, n) in [
            ("applied", s.applied),
            ("stale", s.stale),
            ("duplicate", s.duplicate),
            ("unresolved", s.unresolved),
            ("rejected", s.rejected),
        ] {
            count(&self.observations, &[("outcome", outcome)], n);
        }
        self.confirmed.inc_by(s.confirmed);
        self.deferred.inc_by(s.deferred);
        let w = &s.summary.written;
        for (table, n) in [
            ("devices", w.devices),
            ("device_conditions", w.conditions),
            ("device_source_freshness", w.freshness),
            ("device_lifecycle_events", s.summary.lifecycle),
        ] {
            count(&self.rows_written, &[("table", table)], n);
        }
        self.status_events.inc_by(s.summary.events);
        self.batch_size
            .observe((s.applied + s.stale + s.duplicate + s.unresolved + s.rejected) as f64);
    }

    /// Time a batch spent in `stage` (see `batch_seconds`).
    pub fn stage(&self, stage: &str, took: std::time::Duration) {
        self.batch_seconds
            .get_or_create(&labels(&[("stage", stage)]))
            .observe(took.as_secs_f64());
    }

    pub fn dead_letter(&self, reason: &str) {
        count(&self.dead_lettered, &[("reason", reason)], 1);
    }

    pub fn command(&self, verb: &str, code: &str) {
        count(&self.commands, &[("verb", verb), ("code", code)], 1);
    }
}
