//! Issue 14, items 6 and 12, at the API: metric labels stay a closed set
//! whatever method a client sends, a body over the limit is 413, `/readyz`
//! answers 503 at once while PostgreSQL is away, and with no hub running a
//! mutation says nothing was sent.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

/// Sends a request whose body the server may refuse before reading it all:
/// write errors are ignored, the answer is read.
async fn oversized(addr: std::net::SocketAddr, path: &str, token: &str, len: usize) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let body = vec![b' '; len];
    let _ = s.write_all(&body).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_bounds_labels_and_bodies_and_says_what_it_did_not_do() {
    let env = TestEnv::new().await;
    let (addr, stop) = start_api(&env.common, &Default::default()).await;
    let t = token(&env, fleet_api::Scope::ALL).await;
    // No hub runs in this test: the device row is set up directly.
    let id = "dev_edge01".to_string();
    sqlx::query(
        "INSERT INTO devices (id, name, site_id, role) VALUES ($1, 'gpu-e-01', 's1', 'host')",
    )
    .bind(&id)
    .execute(&env.pool)
    .await
    .unwrap();

    // Random methods from an unauthenticated client: one `other` label.
    for i in 0..40 {
        let m = format!("M{i}X");
        let _ = http_raw(addr, &m, "/api/v1/devices/", None, None, b"").await;
    }
    let metrics = get(addr, "/metrics", &t).await.body;
    let methods: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split("method=\"").nth(1))
        .filter_map(|r| r.split('"').next())
        .collect();
    assert!(
        methods.iter().all(|m| [
            "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"
        ]
        .contains(m)),
        "{methods:?}"
    );
    assert!(methods.contains("other"), "{methods:?}");
    // The standard process metrics and the build, on every service's
    // /metrics (the runtime's ops router).
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "fleet_build_info{version=",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }

    // 2 MB: 413 in the one error shape.
    let r = oversized(addr, &format!("/api/v1/devices/{id}/cordon"), &t, 2 << 20).await;
    assert!(r.starts_with("HTTP/1.1 413"), "{r}");
    assert!(r.contains("PAYLOAD_TOO_LARGE"), "{r}");

    // No hub subscribed: the command was never sent, and the API says so.
    let r = send(
        addr,
        "POST",
        &format!("/api/v1/devices/{id}/cordon"),
        &t,
        serde_json::json!({"version": 1, "reason": "x"}),
    )
    .await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(
        r.body
            .contains("no hub is running; the command was not sent"),
        "{}",
        r.body
    );

    // PostgreSQL away: /readyz answers 503 within the ready timeout.
    env.database_reachable(false).await;
    let r = tokio::time::timeout(
        fleet_store::READY_TIMEOUT * 4,
        http_raw(addr, "GET", "/readyz", None, None, b""),
    )
    .await
    .expect("/readyz answers at once while PostgreSQL is away");
    assert_eq!(r.status, 503, "{}", r.body);
    env.database_reachable(true).await;
    // Issue 19: a timestamp without a time zone says what is expected.
    let r = send(
        addr,
        "POST",
        "/api/v1/device-conditions/apply/",
        &t,
        serde_json::json!({"source": "slurm", "device_id": id, "observed_at": "2026-12-01T10:00:00",
            "conditions": []}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.contains("observed_at") && r.body.contains("RFC 3339 with a time zone"),
        "{}",
        r.body
    );
    stop.trigger();
    env.cleanup().await;
}
