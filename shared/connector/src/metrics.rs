//! The metrics every connector exports under `fleet_connector_`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_runtime::metrics::{count, labels, Histograms, Labels, Metrics};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

fn poll_buckets() -> Histogram {
    // 10 ms .. ~160 s
    Histogram::new(exponential_buckets(0.01, 2.0, 15))
}

fn publish_buckets() -> Histogram {
    // 0.5 ms .. ~8 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 15))
}

#[derive(Clone)]
pub struct ConnectorMetrics {
    /// One poll, read and publish, by source, site and outcome (ok, outage).
    pub poll_duration: Histograms,
    /// Devices in the last successful read, by source and site.
    pub devices_seen: Family<Labels, Gauge>,
    /// Failed polls and failed publishes, by source, site and kind.
    pub errors: Family<Labels, Counter>,
    /// Requests retried within a poll, by source and kind.
    pub retries: Family<Labels, Counter>,
    /// Send to PubAck of one observation, by source.
    pub publish_latency: Histograms,
    /// Observations acknowledged by JetStream, by source, site and kind
    /// (observed, outage, vanished).
    pub published: Family<Labels, Counter>,
    /// Input the mapping dropped or could not model, by source and kind.
    pub warnings: Family<Labels, Counter>,
    pub registry: Arc<Mutex<Registry>>,
}

impl ConnectorMetrics {
    pub fn new() -> Self {
        let m = Metrics::new("fleet_connector");
        ConnectorMetrics {
            poll_duration: m.histograms(
                "poll_duration_seconds",
                "One poll (read, map, publish) by source, site and outcome",
                poll_buckets,
            ),
            devices_seen: m.gauges(
                "devices_seen",
                "Devices in the last successful read of the source",
            ),
            errors: m.counters(
                "errors",
                "Failed reads and publishes by kind (connect, timeout, http_5xx, auth, malformed, publish, ...)",
            ),
            retries: m.counters("request_retries", "Requests retried within a poll, by kind"),
            publish_latency: m.histograms(
                "publish_latency_seconds",
                "From publish to JetStream PubAck, per observation",
                publish_buckets,
            ),
            published: m.counters(
                "published",
                "Observations acknowledged by JetStream, by kind (observed, outage, vanished)",
            ),
            warnings: m.counters(
                "mapping_warnings",
                "Source input the mapping dropped or could not model, by kind",
            ),
            registry: m.registry(),
        }
    }

    pub fn poll(&self, source: &str, site: &str, outcome: &str, took: Duration) {
        self.poll_duration
            .get_or_create(&labels(&[
                ("source", source),
                ("site", site),
                ("outcome", outcome),
            ]))
            .observe(took.as_secs_f64());
    }

    pub fn devices(&self, source: &str, site: &str, n: usize) {
        self.devices_seen
            .get_or_create(&labels(&[("source", source), ("site", site)]))
            .set(n as i64);
    }

    pub fn error(&self, source: &str, site: &str, kind: &str) {
        count(
            &self.errors,
            &[("source", source), ("site", site), ("kind", kind)],
            1,
        );
    }

    pub fn retry(&self, source: &str, kind: &str) {
        count(&self.retries, &[("source", source), ("kind", kind)], 1);
    }

    pub fn publish_latency(&self, source: &str, took: Duration) {
        self.publish_latency
            .get_or_create(&labels(&[("source", source)]))
            .observe(took.as_secs_f64());
    }

    pub fn published(&self, source: &str, site: &str, kind: &str, n: u64) {
        count(
            &self.published,
            &[("source", source), ("site", site), ("kind", kind)],
            n,
        );
    }

    pub fn warning(&self, source: &str, kind: &str) {
        count(&self.warnings, &[("source", source), ("kind", kind)], 1);
    }

    /// The text exposition, for tests and debugging.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        let r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let _ = prometheus_client::encoding::text::encode(&mut s, &r);
        s
    }
}

impl Default for ConnectorMetrics {
    fn default() -> Self {
        Self::new()
    }
}
