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

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

/// Whether and how spans are exported, from the standard `OTEL_*`
/// variables: off with `OTEL_SDK_DISABLED=true` or without an endpoint
/// (`OTEL_EXPORTER_OTLP_ENDPOINT`, or `..._TRACES_ENDPOINT`); only the
/// `http/protobuf` protocol is built in, another one is refused with a
/// message rather than ignored. Pure, for the tests.
pub fn otlp_setting(get: impl Fn(&str) -> Option<String>) -> Result<Option<String>, String> {
    if get("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let Some(endpoint) =
        get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    else {
        return Ok(None);
    };
    let protocol = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| get("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|| "http/protobuf".into());
    if protocol.trim() != "http/protobuf" {
        return Err(format!(
            "OTLP protocol {protocol:?} is not built in (only http/protobuf); spans to {endpoint} are not exported"
        ));
    }
    Ok(Some(endpoint))
}

fn otlp_provider() -> Option<SdkTracerProvider> {
    let endpoint = match otlp_setting(env) {
        Ok(Some(e)) => e,
        Ok(None) => return None,
        Err(why) => {
            eprintln!("{why}");
            return None;
        }
    };
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
    // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by the
    // builder's detectors; `fleet` names the service only when neither does.
    let mut resource = opentelemetry_sdk::Resource::builder();
    let named = env("OTEL_SERVICE_NAME").is_some()
        || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="));
    if !named {
        resource = resource.with_service_name("fleet");
    }
    Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build(),
    )
}

/// Flushes and stops the OTLP exporter, if any.
pub fn shutdown_tracing() {
    if let Some(p) = PROVIDER.get() {
        let _ = p.shutdown();
    }
}

/// NATS headers as OpenTelemetry's propagation carriers.
struct HeaderExtractor<'a>(&'a async_nats::HeaderMap);

impl opentelemetry::propagation::Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_ref()).collect()
    }
}

struct HeaderInjector<'a>(&'a mut async_nats::HeaderMap);

impl opentelemetry::propagation::Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

/// Makes `span` a child of the remote span the message's headers carry
/// (W3C trace context, through OpenTelemetry's propagator); nothing to do
/// when spans are not exported: the parent only matters to
/// the OpenTelemetry layer.
pub fn set_parent_from(span: &tracing::Span, headers: Option<&async_nats::HeaderMap>) {
    if PROVIDER.get().is_none() {
        return;
    }
    let Some(h) = headers else { return };
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(h));
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// Makes `span` a child of the span a `traceparent` value names (one kept
/// with a row, as the outbox keeps it); nothing when spans are not
/// exported (the relay called this for every row it published: 4 % of the
/// hub's CPU in `fleet bench hub`'s initial load, for a parent no layer
/// read).
pub fn set_parent_traceparent(span: &tracing::Span, traceparent: &str) {
    if PROVIDER.get().is_none() {
        return;
    }
    let carrier: HashMap<String, String> =
        [("traceparent".to_string(), traceparent.to_string())].into();
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// Puts `span`'s trace context into `headers` when spans are exported.
pub fn inject(span: &tracing::Span, headers: &mut async_nats::HeaderMap) {
    if PROVIDER.get().is_none() {
        return;
    }
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeaderInjector(headers));
}

/// The `traceparent` what `span` causes carries downstream: the span's own
/// when spans are exported; else a span id of its own in the trace of the
/// message's headers; else a new trace. So a trace id follows a change
/// across the bus even where nothing exports.
pub fn downstream_traceparent(
    span: &tracing::Span,
    headers: Option<&async_nats::HeaderMap>,
) -> String {
    use opentelemetry::trace::{SpanContext, TraceFlags, TraceState};
    use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
    if let Some(tp) = traceparent_of(span) {
        return tp;
    }
    let ids = RandomIdGenerator::default();
    let parent = headers
        .map(|h| TraceContextPropagator::new().extract(&HeaderExtractor(h)))
        .map(|cx| cx.span().span_context().clone())
        .filter(|sc| sc.is_valid());
    let (trace_id, flags) = match parent {
        Some(sc) => (sc.trace_id(), sc.trace_flags()),
        None => (ids.new_trace_id(), TraceFlags::SAMPLED),
    };
    let sc = SpanContext::new(
        trace_id,
        ids.new_span_id(),
        flags,
        false,
        TraceState::default(),
    );
    w3c_traceparent(&sc)
}

/// The W3C `traceparent` of `sc`, as `TraceContextPropagator` injects it
/// (version 00, only the sampled flag), without its carrier map.
fn w3c_traceparent(sc: &opentelemetry::trace::SpanContext) -> String {
    use opentelemetry::trace::TraceFlags;
    format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags() & TraceFlags::SAMPLED
    )
}

/// The `traceparent` of `span` when spans are exported; `None` otherwise.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    PROVIDER.get()?;
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| w3c_traceparent(&sc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_otel_variables_decide_the_export() {
        let with = |pairs: &[(&str, &str)]| {
            let m: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            otlp_setting(move |k| m.get(k).cloned())
        };
        assert_eq!(with(&[]), Ok(None));
        assert_eq!(
            with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]),
            Ok(Some("http://c:4318".into()))
        );
        assert_eq!(
            with(&[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://c:4318/v1/traces"
            )]),
            Ok(Some("http://c:4318/v1/traces".into()))
        );
        assert_eq!(
            with(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_SDK_DISABLED", "true")
            ]),
            Ok(None)
        );
        assert!(with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        ])
        .is_err());
        assert_eq!(
            with(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
            ]),
            Ok(Some("http://c:4318".into()))
        );
    }

    #[test]
    fn a_traceparent_is_written_as_the_propagator_writes_it() {
        use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
        for flags in [0x00, 0x01, 0x03, 0xff] {
            let sc = SpanContext::new(
                TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"),
                SpanId::from_hex("00f067aa0ba902b7").expect("hex"),
                TraceFlags::new(flags),
                true,
                TraceState::default(),
            );
            let cx = opentelemetry::Context::new().with_remote_span_context(sc.clone());
            let mut carrier: HashMap<String, String> = HashMap::new();
            TraceContextPropagator::new().inject_context(&cx, &mut carrier);
            assert_eq!(
                Some(&w3c_traceparent(&sc)),
                carrier.get("traceparent"),
                "{flags}"
            );
        }
    }

    #[test]
    fn a_downstream_traceparent_stays_in_the_publishers_trace() {
        let mut h = async_nats::HeaderMap::new();
        h.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
        let tp = downstream_traceparent(&tracing::Span::none(), Some(&h));
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!(parts[1], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_ne!(parts[2], "00f067aa0ba902b7");
        assert_eq!(parts[3], "01");
        // No parent: a trace of its own.
        let root = downstream_traceparent(&tracing::Span::none(), None);
        assert_eq!(root.split('-').count(), 4);
        assert_ne!(
            root.split('-').nth(1),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        // A malformed header is no parent.
        let mut bad = async_nats::HeaderMap::new();
        bad.insert("traceparent", "garbage");
        assert_eq!(
            downstream_traceparent(&tracing::Span::none(), Some(&bad))
                .split('-')
                .count(),
            4
        );
    }
}
