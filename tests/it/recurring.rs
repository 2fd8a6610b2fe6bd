//! Issue 19: "The same warning repeated on every poll forever ... log a
//! repeated condition once when it starts". The real `fleet connector
//! netbox` process polls a NetBox whose page carries a device without a
//! name, a dozen times; its log says so once.

use std::process::{Command, Stdio};
use std::time::Duration;

use fleet_testkit::connector::{json, FakeHttp};
use serde_json::json as j;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warning_repeated_on_every_poll_is_logged_once() {
    let env = TestEnv::new().await;
    // The hub makes the streams the connector publishes to.
    let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
    let netbox = FakeHttp::start().await;
    let device = |id: i64, name: Option<&str>| {
        j!({"id": id, "name": name, "serial": format!("SN-{id}"),
            "site": {"id": 1, "name": "DC1", "slug": "dc1"}, "rack": null,
            "status": {"value": "active", "label": "Active"}, "tags": []})
    };
    netbox
        .route(
            "GET",
            "^/api/dcim/devices/$",
            json(
                200,
                j!({"count": 2, "next": null, "previous": null,
                    "results": [device(1, Some("gpu-rec-01")), device(2, None)]}),
            ),
        )
        .await;
    let n = &env.common.nats;
    let config = format!(
        r#"
[nats]
url = "{}"
subject_root = "{}"
radar_root = "{}"
stream_prefix = "{}"
partitions = {}

[connectors.netbox]
listen = "127.0.0.1:0"
url = "{}"
token = {{ value = "0123456789abcdef0123456789abcdef01234567" }}
auth_scheme = "token"
create_devices = false

[connectors.netbox.sites]
s1 = "dc1"

[connectors.netbox.poll]
resync_interval = "200ms"
jitter = 0.0
resync_spread = 0.0
"#,
        n.url,
        n.subject_root,
        n.radar_root,
        n.stream_prefix,
        n.partitions,
        netbox.url()
    );
    let dir = std::env::temp_dir().join(format!("{}-recurring", env.db_name));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fleet.toml");
    std::fs::write(&path, config).unwrap();
    let log = dir.join("connector.log");
    let mut child = Reaped::new(
        Command::new(env!("CARGO_BIN_EXE_fleet"))
            .args(["connector", "netbox", "--config"])
            .arg(&path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("spawn fleet connector netbox"),
    );
    eventually_within(
        "a dozen polls of the NetBox page",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { (netbox.count("/api/dcim/devices/").await >= 12).then_some(()) },
    )
    .await;
    child.stop("TERM", Duration::from_secs(10)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    let said = text.matches("netbox device has no name; skipped").count();
    assert_eq!(said, 1, "logged once over a dozen polls:\n{text}");
    stop(hub_trigger, hub_task).await;
    let _ = std::fs::remove_dir_all(&dir);
    env.cleanup().await;
}
