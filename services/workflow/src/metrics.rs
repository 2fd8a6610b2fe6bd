//! The workflow service's metrics: device runs finished by workflow and
//! outcome (a closed set: the job device statuses and the failure codes).

use std::sync::{Arc, Mutex};

use fleet_runtime::metrics::{count, Labels, Metrics};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone)]
pub(crate) struct WorkflowMetrics {
    pub registry: Arc<Mutex<Registry>>,
    finished: Family<Labels, Counter>,
    pub running: Gauge,
    pub external_writes: Family<Labels, Counter>,
    /// Waiting runs woken by a STATUS event, and waits that ran out to the
    /// backstop (should stay near 0 while the STATUS consumer is up).
    pub woken: Counter,
    pub backstop: Counter,
}

impl WorkflowMetrics {
    pub fn new() -> Self {
        let m = Metrics::new("fleet_workflow");
        WorkflowMetrics {
            finished: m.counters(
                "device_runs_finished",
                "Device runs finished, by workflow, status and failure code",
            ),
            running: m.gauge(
                "device_runs_active",
                "Device runs this replica is working on",
            ),
            external_writes: m.counters(
                "external_writes",
                "Writes sent to an external system, by system and call",
            ),
            woken: m.counter(
                "waits_woken",
                "Runs waiting on the hub woken by a STATUS event",
            ),
            backstop: m.counter(
                "waits_backstop",
                "Runs waiting on the hub that read again after the backstop without a STATUS event",
            ),
            registry: m.registry(),
        }
    }

    pub fn finished(&self, workflow: &str, status: &str, code: &str) {
        let labels = [
            ("workflow", workflow),
            ("status", status),
            ("failure_code", code),
        ];
        count(&self.finished, &labels, 1);
    }

    pub fn wrote(&self, system: &str, call: &str) {
        count(
            &self.external_writes,
            &[("system", system), ("call", call)],
            1,
        );
    }
}
