//! Radar's Prometheus metrics.

use std::sync::{Arc, Mutex};

use fleet_runtime::metrics::{count, Labels, Metrics};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone)]
pub struct RadarMetrics {
    pub published: Family<Labels, Counter>,
    pub status_events: Counter,
    pub devices: Gauge,
    pub registry: Arc<Mutex<Registry>>,
}

impl RadarMetrics {
    pub fn new() -> Self {
        let m = Metrics::new("fleet_radar");
        RadarMetrics {
            published: m.counters(
                "published",
                "Projections published, by kind (projection, tombstone)",
            ),
            status_events: m.counter("status_events", "STATUS events handled"),
            devices: m.gauge("devices", "Devices at the last rebuild"),
            registry: m.registry(),
        }
    }

    pub fn published(&self, kind: &str) {
        count(&self.published, &[("kind", kind)], 1);
    }
}
