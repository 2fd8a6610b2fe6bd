//! Issue 18: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, a `fleet` process
//! starts (it used to panic at once: no rustls crypto provider; then "no
//! reactor running" in the exporter's thread) and its spans reach the
//! collector over OTLP/HTTP.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use crate::support::*;

type Spans = Arc<std::sync::Mutex<Vec<(String, String, String)>>>;
/// (trace id, span id, parent span id, name) of every span.
type Links = Arc<std::sync::Mutex<Vec<(String, String, String, String)>>>;

fn hexs(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// A collector that counts `POST /v1/traces` requests and keeps every
/// span as (service, trace id, name).
async fn collector() -> (std::net::SocketAddr, Arc<AtomicUsize>, Spans) {
    let (addr, posts, spans, _) = collector_with_links().await;
    (addr, posts, spans)
}

async fn collector_with_links() -> (std::net::SocketAddr, Arc<AtomicUsize>, Spans, Links) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message as _;
    let posts = Arc::new(AtomicUsize::new(0));
    let spans: Spans = Default::default();
    let links: Links = Default::default();
    let (p, kept, linked) = (posts.clone(), spans.clone(), links.clone());
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let (p, kept, linked) = (p.clone(), kept.clone(), linked.clone());
            async move {
                if !body.is_empty() {
                    p.fetch_add(1, Ordering::SeqCst);
                }
                if let Ok(req) = ExportTraceServiceRequest::decode(body.as_ref()) {
                    let mut kept = kept.lock().unwrap();
                    for rs in req.resource_spans {
                        let service = rs
                            .resource
                            .iter()
                            .flat_map(|r| r.attributes.iter())
                            .find(|a| a.key == "service.name")
                            .and_then(|a| a.value.as_ref())
                            .map(|v| format!("{:?}", v.value))
                            .unwrap_or_default();
                        for ss in rs.scope_spans {
                            for sp in ss.spans {
                                linked.lock().unwrap().push((
                                    hexs(&sp.trace_id),
                                    hexs(&sp.span_id),
                                    hexs(&sp.parent_span_id),
                                    sp.name.clone(),
                                ));
                                kept.push((service.clone(), hexs(&sp.trace_id), sp.name));
                            }
                        }
                    }
                }
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, posts, spans, links)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_over_otlp_and_nothing_panics() {
    let env = TestEnv::new().await;
    let (addr, posts, _) = collector().await;
    let endpoint = format!("http://{addr}");

    // A command that only starts and exits.
    let out = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .arg("config")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The hub, applying one observation: its span is exported.
    let hub = env
        .fleet_env(Command::new(env!("CARGO_BIN_EXE_fleet")).arg("hub"))
        .env("FLEET__HUB__LISTEN", "127.0.0.1:0")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        .env("OTEL_SERVICE_NAME", "fleet-hub-test")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut hub = Reaped::new(hub);
    let id = env.create_device("s1", "gpu-otel-01").await;
    env.publish_snapshot(&openstack_as(
        "s1",
        "gpu-otel-01",
        micros(Utc::now()),
        Node::Maintenance,
    ))
    .await;
    eventually("the snapshot applied", || async {
        (env.device_field(&id, "operational_status").await == "quarantine").then_some(())
    })
    .await;
    eventually("a span batch at the collector", || async {
        (posts.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    // SIGTERM: the hub stops cleanly (flushing its spans), never panics.
    let status = hub.stop("TERM", Duration::from_secs(30)).await;
    assert!(status.success(), "{status:?}");
    env.cleanup().await;
}

/// One trace across the bus: the real slurmrestd read by `fleet connector
/// slurm`, applied by `fleet hub` (each its own process, each exporting),
/// and the `StatusChanged` it caused carries the same trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_read_and_the_hub_apply_are_one_trace() {
    let token =
        std::env::var("SLURM_JWT_FILE").unwrap_or_else(|_| "/tmp/peers/slurm/jwt.token".into());
    let url = std::env::var("SLURM_REST_URL").unwrap_or_else(|_| "http://127.0.0.1:6820".into());
    assert!(
        std::path::Path::new(&token).exists(),
        "the real slurmrestd is needed: bash tests/peers/slurm.sh start"
    );
    let env = TestEnv::new().await;
    let (addr, _, spans) = collector().await;
    let endpoint = format!("http://{addr}");
    let common = |c: &mut Command, service: &str| {
        env.fleet_env(c)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "200")
            .env("OTEL_SERVICE_NAME", service)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    };
    let mut hub = Command::new(env!("CARGO_BIN_EXE_fleet"));
    hub.arg("hub").env("FLEET__HUB__LISTEN", "127.0.0.1:0");
    common(&mut hub, "fleet-hub");
    let mut hub = Reaped::new(hub.spawn().unwrap());
    for n in 1..=6 {
        env.create_device("s1", &format!("gpu0{n}")).await;
    }
    let mut slurm = Command::new(env!("CARGO_BIN_EXE_fleet"));
    slurm
        .args(["connector", "slurm"])
        .env("FLEET__CONNECTORS__SLURM__LISTEN", "127.0.0.1:0")
        .env("FLEET__CONNECTORS__SLURM__SITES__S1__URL", &url)
        .env("FLEET__CONNECTORS__SLURM__SITES__S1__USER_NAME", "root")
        .env("FLEET__CONNECTORS__SLURM__SITES__S1__TOKEN__FILE", &token);
    common(&mut slurm, "fleet-connector-slurm");
    let mut slurm = Reaped::new(slurm.spawn().unwrap());

    let shared = eventually(
        "a trace with the connector's read and the hub's apply",
        || async {
            let spans = spans.lock().unwrap().clone();
            let reads: std::collections::HashSet<&String> = spans
                .iter()
                .filter(|(s, _, n)| s.contains("fleet-connector-slurm") && n == "connector.read")
                .map(|(_, t, _)| t)
                .collect();
            spans
                .iter()
                .find(|(s, t, n)| {
                    s.contains("fleet-hub") && n == "hub.observation" && reads.contains(t)
                })
                .map(|(_, t, _)| t.clone())
        },
    )
    .await;
    // The StatusChanged events of that apply carry the same trace.
    let stream = env.js.get_stream(env.streams.status()).await.unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config::default())
        .await
        .unwrap();
    let traced = eventually("a StatusChanged in the connector's trace", || async {
        let mut batch = consumer
            .fetch()
            .max_messages(10_000)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .ok()?;
        let mut found = None;
        while let Some(Ok(m)) = futures::StreamExt::next(&mut batch).await {
            let tp = m
                .headers
                .as_ref()
                .and_then(|h| h.get("traceparent"))
                .map(|v| v.to_string())
                .unwrap_or_default();
            if tp.split('-').nth(1) == Some(shared.as_str()) {
                found = Some(m.subject.to_string());
            }
        }
        found
    })
    .await;
    assert!(traced.contains(".status."), "{traced}");
    for p in [&mut slurm, &mut hub] {
        let status = p.stop("TERM", Duration::from_secs(30)).await;
        assert!(status.success(), "{status:?}");
    }
    env.cleanup().await;
}

/// The whole chain in one trace, with its parent links, from `fleet dev`
/// exporting: a connector's read, the hub's apply of what it published,
/// the outbox relay of the change, and a status consumer's handling of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_dev_exports_one_trace_from_a_connector_read_to_a_consumer() {
    let (addr, _, _, links) = collector_with_links().await;
    let child = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .args(["dev", "--sim", "20", "--tick-secs", "0.5", "--agents", "0"])
        .env(
            "FLEET__DATABASE__URL",
            format!("{}/fleet", admin_url().rsplit_once('/').unwrap().0),
        )
        .env("FLEET__NATS__URL", nats_url())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Reaped::new(child);
    let chain = eventually(
        "connector.read -> hub.observation -> hub.relay -> status.consume",
        || async {
            let spans = links.lock().unwrap().clone();
            let by_id: std::collections::HashMap<&str, &(String, String, String, String)> =
                spans.iter().map(|s| (s.1.as_str(), s)).collect();
            spans
                .iter()
                .filter(|s| s.3 == "status.consume")
                .find_map(|consume| {
                    let relay = by_id
                        .get(consume.2.as_str())
                        .filter(|s| s.3 == "hub.relay")?;
                    let apply = by_id
                        .get(relay.2.as_str())
                        .filter(|s| s.3 == "hub.observation")?;
                    let read = by_id
                        .get(apply.2.as_str())
                        .filter(|s| s.3 == "connector.read")?;
                    let same = [&relay.0, &apply.0, &read.0]
                        .iter()
                        .all(|t| **t == consume.0);
                    same.then(|| consume.0.clone())
                })
        },
    )
    .await;
    assert_eq!(chain.len(), 32, "{chain}");
    let status = child.stop("INT", Duration::from_secs(90)).await;
    assert_eq!(status.code(), Some(0), "{status:?}");
}
