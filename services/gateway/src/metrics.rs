//! The gateway's Prometheus metrics.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_runtime::metrics::{count, Labels, Metrics};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone)]
pub struct GatewayMetrics {
    pub requests: Family<Labels, Counter>,
    pub request_seconds: Histogram,
    pub joins: Counter,
    pub sessions: Gauge,
    pub registry: Arc<Mutex<Registry>>,
}

impl GatewayMetrics {
    pub fn new() -> Self {
        let m = Metrics::new("fleet_gateway");
        GatewayMetrics {
            requests: m.counters(
                "requests",
                "Agent and relay requests by route and result code",
            ),
            request_seconds: m.histogram(
                "request_seconds",
                "Time to answer a request",
                exponential_buckets(0.0005, 2.0, 14),
            ),
            joins: m.counter("joins", "Successful joins"),
            sessions: m.gauge(
                "sessions",
                "Open sessions this replica holds, as of the last identity check",
            ),
            registry: m.registry(),
        }
    }

    pub fn request(&self, route: &str, code: &str, took: Duration) {
        count(&self.requests, &[("route", route), ("result", code)], 1);
        self.request_seconds.observe(took.as_secs_f64());
    }
}
