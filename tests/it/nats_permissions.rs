//! `spec/quality.md`, security: every service has its own NATS user with
//! subject permissions; a connector may publish only
//! `fleet.obs.<its source>.>` and only the hub may publish
//! `fleet.status.>`. This runs a real nats-server with the configuration
//! compose and Helm ship (`helm/fleet/files/nats.conf`).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fleet_bus::{StreamNames, Subjects};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

const USERS: [&str; 11] = [
    "HUB",
    "CONNECTOR_NETBOX",
    "CONNECTOR_OPENSTACK",
    "CONNECTOR_SLURM",
    "CONNECTOR_HEALTH",
    "CONNECTOR_BORNEO",
    "CONNECTOR_FABRIC",
    "GATEWAY",
    "PLACER",
    "RADAR",
    "API",
];

fn start(port: u16, dir: &std::path::Path) -> Child {
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/helm/fleet/files/nats.conf"
    ))
    .unwrap();
    let conf = shipped
        .replace("port: 4222", &format!("port: {port}"))
        .replace("http_port: 8222", "")
        .replace(
            "\"/data/jetstream\"",
            &format!("\"{}\"", dir.join("js").display()),
        );
    let path = dir.join("nats.conf");
    std::fs::write(&path, conf).unwrap();
    let mut cmd = Command::new("nats-server");
    cmd.arg("-c")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for u in USERS {
        cmd.env(format!("FLEET_NATS_{u}_PASSWORD"), format!("pw-{u}"));
    }
    cmd.spawn()
        .expect("nats-server is needed on PATH (Debian package nats-server)")
}

async fn connect(
    port: u16,
    user: &str,
    pass: &str,
    errors: tokio::sync::mpsc::UnboundedSender<String>,
) -> async_nats::Client {
    async_nats::ConnectOptions::with_user_and_password(user.into(), pass.into())
        .event_callback(move |e| {
            let errors = errors.clone();
            async move {
                if let async_nats::Event::ServerError(e) = e {
                    let _ = errors.send(e.to_string());
                }
            }
        })
        .connect(format!("nats://127.0.0.1:{port}"))
        .await
        .expect("connect with the service's credentials")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_cannot_publish_as_another_source_or_as_the_hub() {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("fleet-nats-perm-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut server = start(port, &dir);
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
    let subjects = Subjects::new("fleet", "radar");
    let streams = StreamNames::new("");

    // The hub creates the streams.
    let hub = connect(port, "hub", "pw-HUB", tx.clone()).await;
    let hub_js = async_nats::jetstream::new(hub.clone());
    fleet_bus::ensure_streams(&hub_js, &streams, &subjects)
        .await
        .expect("the hub may create streams");

    // A wrong password is refused outright.
    let bad = async_nats::ConnectOptions::with_user_and_password("hub".into(), "nope".into())
        .connect(format!("nats://127.0.0.1:{port}"))
        .await;
    assert!(bad.is_err(), "a wrong password connects");

    let slurm = connect(port, "connector-slurm", "pw-CONNECTOR_SLURM", tx.clone()).await;
    let js = async_nats::jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(2))
        .build(slurm.clone());
    let key = fleet_proto::v1::DeviceKey {
        site: "s1".into(),
        kind: "name".into(),
        key: "gpu-01".into(),
    };
    // Its own source: stored.
    let ok = fleet_bus::publish(
        &js,
        subjects.obs("slurm", 0, &key),
        "m1",
        fleet_bus::headers("x", None),
        "x".into(),
    )
    .await
    .unwrap()
    .await;
    assert!(
        ok.is_ok(),
        "connector-slurm publishes its own source: {ok:?}"
    );
    // Another source's subject: refused by the server, never stored.
    let other = fleet_bus::publish(
        &js,
        subjects.obs("openstack", 0, &key),
        "m2",
        fleet_bus::headers("x", None),
        "x".into(),
    )
    .await
    .unwrap()
    .await;
    assert!(other.is_err(), "connector-slurm published as openstack");
    // A status event: only the hub may.
    let status = fleet_bus::publish(
        &js,
        subjects.status("operational", "s1", "dev_1"),
        "m3",
        fleet_bus::headers("x", None),
        "x".into(),
    )
    .await
    .unwrap()
    .await;
    assert!(status.is_err(), "connector-slurm published a status event");
    let mut violations = vec![];
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(2), errors.recv()).await {
        violations.push(e);
        if violations.len() >= 2 {
            break;
        }
    }
    assert!(
        violations
            .iter()
            .any(|v| v.to_lowercase().contains("permissions violation")
                && v.contains("fleet.obs.openstack")),
        "{violations:?}"
    );
    assert!(
        violations
            .iter()
            .any(|v| v.contains("fleet.status.operational")),
        "{violations:?}"
    );

    // The stream holds exactly the one permitted message.
    let mut obs = hub_js.get_stream(streams.observations()).await.unwrap();
    assert_eq!(obs.info().await.unwrap().state.messages, 1);
    // The hub, by contrast, may publish status events.
    let hub_pub = fleet_bus::publish(
        &hub_js,
        subjects.status("operational", "s1", "dev_1"),
        "h1",
        fleet_bus::headers("x", None),
        "x".into(),
    )
    .await
    .unwrap()
    .await;
    assert!(hub_pub.is_ok(), "{hub_pub:?}");

    server.kill().ok();
    server.wait().ok();
    let _ = std::fs::remove_dir_all(&dir);
}
