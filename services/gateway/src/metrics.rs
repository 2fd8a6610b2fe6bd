//! The gateway's Prometheus metrics.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

#[derive(Clone)]
pub struct GatewayMetrics {
    pub requests: Family<Labels, Counter>,
    pub request_seconds: Histogram,
    pub joins: Counter,
    pub sessions: Gauge,
    pub registry: Arc<Mutex<Registry>>,
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl GatewayMetrics {
    pub fn new() -> Self {
        let m = GatewayMetrics {
            requests: Family::default(),
            request_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            joins: Counter::default(),
            sessions: Gauge::default(),
            registry: Arc::new(Mutex::new(Registry::with_prefix("fleet_gateway"))),
        };
        {
            let mut r = m.registry.lock().unwrap_or_else(|p| p.into_inner());
            r.register(
                "requests",
                "Agent and relay requests by route and result code",
                m.requests.clone(),
            );
            r.register(
                "request_seconds",
                "Time to answer a request",
                m.request_seconds.clone(),
            );
            r.register("joins", "Successful joins", m.joins.clone());
            r.register(
                "sessions",
                "Open sessions this replica holds, as of the last identity check",
                m.sessions.clone(),
            );
        }
        m
    }

    pub fn request(&self, route: &str, code: &str, took: Duration) {
        self.requests
            .get_or_create(&vec![
                ("route".to_string(), route.to_string()),
                ("result".to_string(), code.to_string()),
            ])
            .inc();
        self.request_seconds.observe(took.as_secs_f64());
    }
}
