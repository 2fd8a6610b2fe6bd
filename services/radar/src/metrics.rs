//! Radar's Prometheus metrics.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

#[derive(Clone)]
pub struct RadarMetrics {
    pub published: Family<Labels, Counter>,
    pub status_events: Counter,
    pub devices: Gauge,
    pub registry: Arc<Mutex<Registry>>,
}

impl Default for RadarMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RadarMetrics {
    pub fn new() -> Self {
        let m = RadarMetrics {
            published: Family::default(),
            status_events: Counter::default(),
            devices: Gauge::default(),
            registry: Arc::new(Mutex::new(Registry::with_prefix("fleet_radar"))),
        };
        {
            let mut r = m.registry.lock().unwrap_or_else(|p| p.into_inner());
            r.register(
                "published",
                "Projections published, by kind (projection, tombstone)",
                m.published.clone(),
            );
            r.register(
                "status_events",
                "STATUS events handled",
                m.status_events.clone(),
            );
            r.register("devices", "Devices at the last rebuild", m.devices.clone());
        }
        m
    }

    pub fn published(&self, kind: &str) {
        self.published
            .get_or_create(&vec![("kind".to_string(), kind.to_string())])
            .inc();
    }
}
