//! The workflow service's metrics: device runs finished by workflow and
//! outcome (a closed set: the job device statuses and the failure codes).

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

#[derive(Clone)]
pub(crate) struct WorkflowMetrics {
    pub registry: Arc<Mutex<Registry>>,
    finished: Family<Labels, Counter>,
    pub running: Gauge,
    pub external_writes: Family<Labels, Counter>,
}

impl WorkflowMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("fleet_workflow");
        let finished = Family::<Labels, Counter>::default();
        let running = Gauge::default();
        let external_writes = Family::<Labels, Counter>::default();
        registry.register(
            "device_runs_finished",
            "Device runs finished, by workflow, status and failure code",
            finished.clone(),
        );
        registry.register(
            "device_runs_active",
            "Device runs this replica is working on",
            running.clone(),
        );
        registry.register(
            "external_writes",
            "Writes sent to an external system, by system and call",
            external_writes.clone(),
        );
        WorkflowMetrics {
            registry: Arc::new(Mutex::new(registry)),
            finished,
            running,
            external_writes,
        }
    }

    pub fn finished(&self, workflow: &str, status: &str, code: &str) {
        self.finished
            .get_or_create(&vec![
                ("workflow".into(), workflow.into()),
                ("status".into(), status.into()),
                ("failure_code".into(), code.into()),
            ])
            .inc();
    }

    pub fn wrote(&self, system: &str, call: &str) {
        self.external_writes
            .get_or_create(&vec![
                ("system".into(), system.into()),
                ("call".into(), call.into()),
            ])
            .inc();
    }
}
