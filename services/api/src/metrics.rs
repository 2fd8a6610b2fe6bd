//! Requests by route template and status, and their latency.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use fleet_runtime::metrics::{Histograms, Labels, Metrics};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::App;

#[derive(Clone)]
pub struct ApiMetrics {
    pub requests: Family<Labels, Counter>,
    pub latency: Histograms,
    pub registry: Arc<Mutex<Registry>>,
}

fn latency_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

impl ApiMetrics {
    pub fn new() -> Self {
        let m = Metrics::new("fleet_api");
        ApiMetrics {
            requests: m.counters("requests", "Requests by method, route and status"),
            latency: m.histograms(
                "request_seconds",
                "Request latency by method and route",
                latency_buckets,
            ),
            registry: m.registry(),
        }
    }
}

pub async fn track(State(app): State<App>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = method_label(req.method()).to_string();
    let start = Instant::now();
    let res = next.run(req).await;
    let status = res.status().as_u16().to_string();
    app.metrics
        .requests
        .get_or_create(&vec![
            ("method".into(), method.clone()),
            ("route".into(), route.clone()),
            ("status".into(), status),
        ])
        .inc();
    app.metrics
        .latency
        .get_or_create(&vec![("method".into(), method), ("route".into(), route)])
        .observe(start.elapsed().as_secs_f64());
    res
}

/// The method as a metric label: one of the methods the API serves, or
/// `other` (a client picks the method; labels stay a closed set).
pub fn method_label(m: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_methods_are_a_closed_set_of_labels() {
        use axum::http::Method;
        assert_eq!(super::method_label(&Method::GET), "GET");
        assert_eq!(
            super::method_label(&Method::from_bytes(b"XYZZY").unwrap()),
            "other"
        );
        assert_eq!(super::method_label(&Method::TRACE), "other");
    }
}
