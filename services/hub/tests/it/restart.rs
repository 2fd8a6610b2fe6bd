//! `spec/quality.md`: restart NATS under load; the hub reconnects and
//! resumes, `/readyz` is false while NATS is down, nothing is lost. The
//! test runs its own `nats-server` so the shared one is never disturbed.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

fn nats_server(port: u16, store: &std::path::Path) -> Child {
    Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server is needed on PATH (Debian package nats-server)")
}

async fn get(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.ok()?;
    Some(buf)
}

async fn wait_port(port: u16) {
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nats-server did not listen on {port}");
}

/// Waits until the hub's `/readyz` at `ops` answers `code`.
async fn readyz(ops: std::net::SocketAddr, what: &str, code: &str) {
    eventually(what, || async {
        get(ops, "/readyz")
            .await
            .filter(|r| r.contains(code))
            .map(|_| ())
    })
    .await;
}

/// Publishes openstack's snapshot of each of the ten devices `gpu-r-00`
/// to `gpu-r-09` as `node`, observed `at`, and waits until all ten are
/// `status`.
async fn all_ten(env: &TestEnv, at: chrono::DateTime<Utc>, node: Node, status: &str) {
    for i in 0..10 {
        env.publish_snapshot(&openstack_as("s1", &format!("gpu-r-{i:02}"), at, node))
            .await;
    }
    eventually_count(
        env,
        &format!("{status} everywhere"),
        "SELECT count(*) FROM devices WHERE operational_status = $1",
        status,
        10,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_survives_a_nats_restart_and_loses_nothing() {
    let port = fleet_testkit::connector::free_port();
    let store = std::env::temp_dir().join(format!("fleet-nats-{port}-{}", ulid::Ulid::new()));
    let mut nats = nats_server(port, &store);
    wait_port(port).await;
    let mut env = TestEnv::with_nats(&format!("nats://127.0.0.1:{port}")).await;
    env.hub.ack_wait = std::time::Duration::from_secs(2);
    let hub = RunningHub::start(&env).await;
    let mut ids = vec![];
    for i in 0..10 {
        ids.push(env.create_device("s1", &format!("gpu-r-{i:02}")).await);
    }
    let t0 = micros(Utc::now());
    all_ten(&env, t0, Node::Maintenance, "quarantine").await;
    let ops = *hub.ops_addr.get().expect("ops server bound");
    assert!(
        get(ops, "/readyz").await.unwrap().contains("200"),
        "ready before the restart"
    );

    nats.kill().unwrap();
    nats.wait().unwrap();
    readyz(ops, "/readyz false while NATS is down", "503").await;
    assert!(
        get(ops, "/healthz").await.unwrap().contains("200"),
        "alive all the same"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut nats = nats_server(port, &store);
    wait_port(port).await;
    readyz(ops, "/readyz true again", "200").await;
    // New observations after the restart are applied: the consumers came back.
    all_ten(
        &env,
        t0 + chrono::Duration::seconds(10),
        Node::InUse,
        "in_use",
    )
    .await;
    // Every status change made it to STATUS: the outbox is empty.
    outbox_drained(&env).await;
    hub.stop(env).await;
    nats.kill().ok();
    nats.wait().ok();
    let _ = std::fs::remove_dir_all(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_redelivers_and_dead_letters_nothing() {
    let mut env = TestEnv::new().await;
    env.hub.max_deliver = 2;
    let hub = RunningHub::start(&env).await;
    let id = env.create_device("s1", "gpu-p-01").await;
    let t0 = micros(Utc::now());
    let snap = |at, node| openstack_as("s1", "gpu-p-01", at, node);
    env.publish_snapshot(&snap(t0, Node::Maintenance)).await;
    eventually_field(&env, &id, "operational_status", "quarantine").await;

    // Take the test database away from the hub: no new connections, and
    // every open one terminated.
    env.database_reachable(false).await;
    let ops = *hub.ops_addr.get().unwrap();
    readyz(ops, "/readyz false while PostgreSQL is away", "503").await;
    env.publish_snapshot(&snap(t0 + chrono::Duration::seconds(5), Node::InUse))
        .await;
    // A command meanwhile answers UNAVAILABLE, never a guess.
    let r = env
        .command(
            "cordon",
            1,
            fleet_proto::v1::hub_command::Command::Cordon(fleet_proto::v1::Cordon {
                device_id: id.clone(),
                reason: "x".into(),
            }),
        )
        .await;
    assert_eq!(error_code(&r), "UNAVAILABLE");
    // Several redeliveries happen meanwhile (max_deliver is 2).
    tokio::time::sleep(Duration::from_secs(5)).await;

    env.database_reachable(true).await;
    let pool = fleet_store::connect(&env.common.database.url, 1)
        .await
        .unwrap();
    eventually("in_use once PostgreSQL is back", || async {
        let s: String = sqlx::query_scalar("SELECT operational_status FROM devices WHERE id = $1")
            .bind(&id)
            .fetch_one(&pool)
            .await
            .ok()?;
        (s == "in_use").then_some(())
    })
    .await;
    let stream = env.js.get_stream(env.streams.dlq()).await.unwrap();
    let mut stream = stream;
    assert_eq!(
        stream.info().await.unwrap().state.messages,
        0,
        "a database outage dead-letters nothing"
    );
    pool.close().await;
    hub.stop(env).await;
}
