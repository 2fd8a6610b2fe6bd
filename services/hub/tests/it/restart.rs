//! `spec/quality.md`: restart NATS under load; the hub reconnects and
//! resumes, `/readyz` is false while NATS is down, nothing is lost. The
//! test runs its own `nats-server` so the shared one is never disturbed.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::start_hub;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_survives_a_nats_restart_and_loses_nothing() {
    let port = fleet_testkit::connector::free_port();
    let store = std::env::temp_dir().join(format!("fleet-nats-{port}-{}", ulid::Ulid::new()));
    let mut nats = nats_server(port, &store);
    wait_port(port).await;
    let mut env = TestEnv::with_nats(&format!("nats://127.0.0.1:{port}")).await;
    env.hub.ack_wait = std::time::Duration::from_secs(2);
    let (hub, trigger, task) = start_hub(&env).await;
    let mut ids = vec![];
    for i in 0..10 {
        ids.push(env.create_device("s1", &format!("gpu-r-{i:02}")).await);
    }
    let t0 = micros(Utc::now());
    for i in 0..10 {
        env.publish_snapshot(&openstack_as(
            "s1",
            &format!("gpu-r-{i:02}"),
            t0,
            Node::Maintenance,
        ))
        .await;
    }
    eventually("quarantine everywhere", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM devices WHERE operational_status = 'quarantine'",
        )
        .fetch_one(&env.pool)
        .await
        .unwrap();
        (n == 10).then_some(())
    })
    .await;
    let ops = *hub.ops_addr.get().expect("ops server bound");
    assert!(
        get(ops, "/readyz").await.unwrap().contains("200"),
        "ready before the restart"
    );

    nats.kill().unwrap();
    nats.wait().unwrap();
    eventually("/readyz false while NATS is down", || async {
        get(ops, "/readyz")
            .await
            .filter(|r| r.contains("503"))
            .map(|_| ())
    })
    .await;
    assert!(
        get(ops, "/healthz").await.unwrap().contains("200"),
        "alive all the same"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut nats = nats_server(port, &store);
    wait_port(port).await;
    eventually("/readyz true again", || async {
        get(ops, "/readyz")
            .await
            .filter(|r| r.contains("200"))
            .map(|_| ())
    })
    .await;
    // New observations after the restart are applied: the consumers came back.
    for i in 0..10 {
        env.publish_snapshot(&openstack_as(
            "s1",
            &format!("gpu-r-{i:02}"),
            t0 + chrono::Duration::seconds(10),
            Node::InUse,
        ))
        .await;
    }
    eventually("in_use everywhere after the restart", || async {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM devices WHERE operational_status = 'in_use'")
                .fetch_one(&env.pool)
                .await
                .unwrap();
        (n == 10).then_some(())
    })
    .await;
    // Every status change made it to STATUS: the outbox is empty.
    outbox_drained(&env).await;
    stop(trigger, task).await;
    env.cleanup().await;
    nats.kill().ok();
    nats.wait().ok();
    let _ = std::fs::remove_dir_all(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_redelivers_and_dead_letters_nothing() {
    let mut env = TestEnv::new().await;
    env.hub.max_deliver = 2;
    let (hub, trigger, task) = start_hub(&env).await;
    let id = env.create_device("s1", "gpu-p-01").await;
    let t0 = micros(Utc::now());
    env.publish_snapshot(&openstack_as("s1", "gpu-p-01", t0, Node::Maintenance))
        .await;
    eventually("quarantine", || async {
        (env.device_field(&id, "operational_status").await == "quarantine").then_some(())
    })
    .await;

    // Take the test database away from the hub: no new connections, and
    // every open one terminated.
    env.database_reachable(false).await;
    let ops = *hub.ops_addr.get().unwrap();
    eventually("/readyz false while PostgreSQL is away", || async {
        get(ops, "/readyz")
            .await
            .filter(|r| r.contains("503"))
            .map(|_| ())
    })
    .await;
    env.publish_snapshot(&openstack_as(
        "s1",
        "gpu-p-01",
        t0 + chrono::Duration::seconds(5),
        Node::InUse,
    ))
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
    assert_eq!(
        r.error
            .map(|e| fleet_proto::error_code_of(e.code).as_str_name()),
        Some("UNAVAILABLE")
    );
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
    stop(trigger, task).await;
    env.cleanup().await;
}
