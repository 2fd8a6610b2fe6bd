//! Prometheus metrics as every service declares them: one registry per
//! service (its names prefixed `fleet_<service>_`), each metric registered
//! where it is made, so a metric is never declared without being served.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};

/// A metric's labels, as the families here key them.
pub type Labels = Vec<(String, String)>;

/// A family of histograms, each made by the family's constructor.
pub type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// A service's registry; clones share it.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
}

impl Metrics {
    /// A registry whose names start `prefix` (`fleet_hub`).
    pub fn new(prefix: &str) -> Self {
        Metrics {
            registry: Arc::new(Mutex::new(Registry::with_prefix(prefix))),
        }
    }

    /// The registry, for the ops server's `/metrics`.
    pub fn registry(&self) -> Arc<Mutex<Registry>> {
        self.registry.clone()
    }

    /// Registers `metric` under `name` and returns it.
    pub fn register<M: Metric + Clone>(&self, name: &str, help: &str, metric: M) -> M {
        self.registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register(name, help, metric.clone());
        metric
    }

    pub fn counter(&self, name: &str, help: &str) -> Counter {
        self.register(name, help, Counter::default())
    }

    /// Counters by label.
    pub fn counters(&self, name: &str, help: &str) -> Family<Labels, Counter> {
        self.register(name, help, Family::default())
    }

    pub fn gauge(&self, name: &str, help: &str) -> Gauge {
        self.register(name, help, Gauge::default())
    }

    /// Gauges by label.
    pub fn gauges(&self, name: &str, help: &str) -> Family<Labels, Gauge> {
        self.register(name, help, Family::default())
    }

    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        buckets: impl Iterator<Item = f64>,
    ) -> Histogram {
        self.register(name, help, Histogram::new(buckets))
    }

    /// Histograms by label, each made by `make`.
    pub fn histograms(&self, name: &str, help: &str, make: fn() -> Histogram) -> Histograms {
        self.register(name, help, Family::new_with_constructor(make))
    }
}

/// Labels from `(name, value)` pairs.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Adds `n` to the counter of `family` labelled `pairs` (nothing for 0, so
/// a label that never occurred is never exported).
pub fn count(family: &Family<Labels, Counter>, pairs: &[(&str, &str)], n: u64) {
    if n > 0 {
        family.get_or_create(&labels(pairs)).inc_by(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_made_is_served() {
        let m = Metrics::new("fleet_test");
        let c = m.counter("things", "Things");
        let f = m.counters("by_kind", "Things by kind");
        c.inc();
        count(&f, &[("kind", "a")], 2);
        count(&f, &[("kind", "never")], 0);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &m.registry().lock().unwrap()).unwrap();
        assert!(out.contains("fleet_test_things_total 1"), "{out}");
        assert!(
            out.contains("fleet_test_by_kind_total{kind=\"a\"} 2"),
            "{out}"
        );
        assert!(!out.contains("never"), "{out}");
    }
}
