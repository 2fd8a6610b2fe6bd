//! Logging and tracing: `tracing` to stderr (text or JSON lines) and, when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, spans exported over OTLP/HTTP.
//! W3C `traceparent` headers join a span to its remote parent, so one
//! trace spans connector -> hub -> consumer.

use std::collections::HashMap;
use std::sync::OnceLock;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Installs the subscriber. `RUST_LOG` overrides the configured filter;
/// `OTEL_SERVICE_NAME` names the service (default `fleet`).
pub fn init_tracing(format: &str, filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter));
    // No colour codes when stderr is a file or a pipe.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let fmt = if format == "json" {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    // The log filter is the log's: spans are exported at info whatever
    // the log shows (`OTEL_TRACES_FILTER` overrides).
    let otel = otlp_provider().map(|provider| {
        let tracer = provider.tracer("fleet");
        let _ = PROVIDER.set(provider);
        let spans = std::env::var("OTEL_TRACES_FILTER")
            .ok()
            .and_then(|f| EnvFilter::try_new(f).ok())
            .unwrap_or_else(|| EnvFilter::new("info"));
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(spans)
    });
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otel)
        .try_init();
}

fn otlp_provider() -> Option<SdkTracerProvider> {
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())?;
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "fleet".into());
    // rustls is built without a default crypto provider: an https endpoint
    // needs one before the client is built.
    fleet_bus::connect::install_tls_provider();
    // The exporter reads the endpoint and headers from the OTEL_* environment.
    // The batch processor exports from a thread of its own, with no tokio
    // reactor: the blocking HTTP client works there (the async one panics).
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("OTLP export to {endpoint} disabled: {e}");
            return None;
        }
    };
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service)
        .build();
    Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build(),
    )
}

/// Flushes and stops the OTLP exporter, if any.
pub fn shutdown_tracing() {
    if let Some(p) = PROVIDER.get() {
        let _ = p.shutdown();
    }
}

/// Makes `span` a child of the remote span a `traceparent` header names.
pub fn set_remote_parent(span: &tracing::Span, traceparent: &str) {
    let carrier: HashMap<String, String> =
        [("traceparent".to_string(), traceparent.to_string())].into();
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// The `traceparent` of `span` when spans are exported; `None` otherwise.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    PROVIDER.get()?;
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}
