//! The placer's Prometheus metrics.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_runtime::metrics::{count, Labels, Metrics};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

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

impl PlacerMetrics {
    pub fn new() -> Self {
        let m = Metrics::new("fleet_placer");
        PlacerMetrics {
            allocations: m.counters("allocations", "Allocation requests by result code"),
            allocation_seconds: m.histogram(
                "allocation_seconds",
                "Time to answer an allocation request",
                exponential_buckets(0.0005, 2.0, 14),
            ),
            attempts: m.counter("attempts", "Booking transactions tried"),
            slow_path: m.counter(
                "slow_path",
                "Requests that rebuilt their pool's view and waited for locks",
            ),
            released: m.counter("released", "Allocations released"),
            impaired: m.counter("impaired", "Allocations marked impaired"),
            double_booking_refused: m.counter(
                "double_booking_refused",
                "Bookings the unique atom index refused (a lock bug; must stay 0)",
            ),
            status_events: m.counters("status_events", "STATUS events handled, by axis"),
            events_published: m.counter(
                "events_published",
                "Allocation events published and acknowledged",
            ),
            view_devices: m.gauge("view_devices", "Devices in the capacity view"),
            registry: m.registry(),
        }
    }

    pub fn allocation(&self, code: &str, took: Duration) {
        count(&self.allocations, &[("result", code)], 1);
        self.allocation_seconds.observe(took.as_secs_f64());
    }

    pub fn status_event(&self, axis: &str) {
        count(&self.status_events, &[("axis", axis)], 1);
    }
}
