//! The placer's Prometheus metrics.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

#[derive(Clone)]
pub struct PlacerMetrics {
    pub allocations: Family<Labels, Counter>,
    pub allocation_seconds: Histogram,
    pub attempts: Counter,
    pub slow_path: Counter,
    pub released: Counter,
    pub impaired: Counter,
    pub double_booking_refused: Counter,
    pub status_events: Family<Labels, Counter>,
    pub events_published: Counter,
    pub view_devices: Gauge,
    pub registry: Arc<Mutex<Registry>>,
}

impl Default for PlacerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl PlacerMetrics {
    pub fn new() -> Self {
        let m = PlacerMetrics {
            allocations: Family::default(),
            allocation_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            attempts: Counter::default(),
            slow_path: Counter::default(),
            released: Counter::default(),
            impaired: Counter::default(),
            double_booking_refused: Counter::default(),
            status_events: Family::default(),
            events_published: Counter::default(),
            view_devices: Gauge::default(),
            registry: Arc::new(Mutex::new(Registry::with_prefix("fleet_placer"))),
        };
        {
            let mut r = m.registry.lock().unwrap_or_else(|p| p.into_inner());
            r.register(
                "allocations",
                "Allocation requests by result code",
                m.allocations.clone(),
            );
            r.register(
                "allocation_seconds",
                "Time to answer an allocation request",
                m.allocation_seconds.clone(),
            );
            r.register("attempts", "Booking transactions tried", m.attempts.clone());
            r.register(
                "slow_path",
                "Requests that rebuilt their pool's view and waited for locks",
                m.slow_path.clone(),
            );
            r.register("released", "Allocations released", m.released.clone());
            r.register(
                "impaired",
                "Allocations marked impaired",
                m.impaired.clone(),
            );
            r.register(
                "double_booking_refused",
                "Bookings the unique atom index refused (a lock bug; must stay 0)",
                m.double_booking_refused.clone(),
            );
            r.register(
                "status_events",
                "STATUS events handled, by axis",
                m.status_events.clone(),
            );
            r.register(
                "events_published",
                "Allocation events published and acknowledged",
                m.events_published.clone(),
            );
            r.register(
                "view_devices",
                "Devices in the capacity view",
                m.view_devices.clone(),
            );
        }
        m
    }

    pub fn allocation(&self, code: &str, took: Duration) {
        self.allocations
            .get_or_create(&vec![("result".to_string(), code.to_string())])
            .inc();
        self.allocation_seconds.observe(took.as_secs_f64());
    }

    pub fn status_event(&self, axis: &str) {
        self.status_events
            .get_or_create(&vec![("axis".to_string(), axis.to_string())])
            .inc();
    }
}
