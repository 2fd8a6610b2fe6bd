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

/// A collector that counts `POST /v1/traces` requests.
async fn collector() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let posts = Arc::new(AtomicUsize::new(0));
    let p = posts.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let p = p.clone();
            async move {
                if !body.is_empty() {
                    p.fetch_add(1, Ordering::SeqCst);
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
    (addr, posts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_over_otlp_and_nothing_panics() {
    let env = TestEnv::new().await;
    let (addr, posts) = collector().await;
    let endpoint = format!("http://{addr}");

    // A command that only starts and exits.
    let out = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .arg("config")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // The hub, applying one observation: its span is exported.
    let hub = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .arg("hub")
        .env("FLEET__DATABASE__URL", &env.config.database.url)
        .env("FLEET__NATS__URL", &env.config.nats.url)
        .env("FLEET__NATS__SUBJECT_ROOT", &env.config.nats.subject_root)
        .env("FLEET__NATS__RADAR_ROOT", &env.config.nats.radar_root)
        .env("FLEET__NATS__STREAM_PREFIX", &env.config.nats.stream_prefix)
        .env("FLEET__NATS__PARTITIONS", env.config.nats.partitions.to_string())
        .env("FLEET__HUB__LISTEN", "127.0.0.1:0")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        .env("OTEL_SERVICE_NAME", "fleet-hub-test")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = env.create_device("s1", "gpu-otel-01").await;
    env.publish_snapshot(&openstack(
        "s1",
        "gpu-otel-01",
        micros(Utc::now()),
        true,
        true,
        false,
        false,
        false,
        false,
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
    let _ = Command::new("kill").arg(hub.id().to_string()).status();
    let status = tokio::task::spawn_blocking(move || {
        let s = hub.wait_with_output().unwrap();
        (s.status, String::from_utf8_lossy(&s.stderr).to_string())
    });
    let (status, stderr) = tokio::time::timeout(Duration::from_secs(30), status)
        .await
        .expect("the hub stops")
        .unwrap();
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    env.cleanup().await;
}
