//! connector-netbox against a fake NetBox 4 speaking `/api/dcim/devices/`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_proto::v1::condition_snapshot::Mirror;
use fleet_runtime::config::{Credential, Secret};
use wiremock::{Request, ResponseTemplate};

use crate::support::*;

const SAMPLE: &str = include_str!("../../testdata/netbox-devices.json");
const V1_TOKEN: &str = "0123456789abcdef0123456789abcdef01234567";
const V2_TOKEN: &str = "nbt_peerskey0001.peerssecret0123456789abcdefghijklmnopqrst";

pub struct NetboxFake {
    /// The `Authorization` header NetBox accepts.
    pub authorization: Mutex<String>,
    pub devices: Mutex<Vec<serde_json::Value>>,
}

impl NetboxFake {
    /// `/api/dcim/devices/?site=&limit=&offset=`.
    fn devices(&self, r: &Request) -> ResponseTemplate {
        if header(r, "authorization") != *self.authorization.lock().unwrap() {
            return json(403, serde_json::json!({"detail": "Invalid v1 token"}));
        }
        let site = param(r, "site");
        let (limit, offset) = match (number_param(r, "limit"), number_param(r, "offset")) {
            (Ok(l), Ok(o)) => (l.unwrap_or(50), o.unwrap_or(0)),
            (Err(bad), _) | (_, Err(bad)) => return bad,
        };
        let devices = self.devices.lock().unwrap();
        let all: Vec<&serde_json::Value> = devices
            .iter()
            .filter(|d| site.as_deref().is_none_or(|s| d["site"]["slug"] == s))
            .collect();
        let page: Vec<&serde_json::Value> = all.iter().skip(offset).take(limit).copied().collect();
        // NetBox builds `next` from the host it believes it is: here not the
        // one the connector calls.
        let next = (offset + limit < all.len()).then(|| {
            format!(
                "http://netbox.internal:8000/api/dcim/devices/?limit={limit}&offset={}&site={}",
                offset + limit,
                site.unwrap_or_default()
            )
        });
        json(
            200,
            serde_json::json!({"count": all.len(), "next": next, "previous": null, "results": page}),
        )
    }
}

fn device(
    id: i64,
    name: Option<&str>,
    site: &str,
    status: &str,
    tags: &[(&str, &str)],
    rack: Option<&str>,
) -> serde_json::Value {
    serde_json::json!({
        "id": id, "url": format!("http://netbox.internal:8000/api/dcim/devices/{id}/"),
        "display": name.unwrap_or("unnamed"), "name": name,
        "role": {"id": 1, "name": "GPU Server", "slug": "gpu-server"},
        "serial": format!("SN-{id:04}"), "asset_tag": null,
        "site": {"id": 1, "name": site.to_uppercase(), "slug": site},
        "rack": rack.map(|r| serde_json::json!({"id": 9, "name": r})),
        "status": {"value": status, "label": status},
        "tags": tags.iter().map(|(n, s)| serde_json::json!({"id": 1, "name": n, "slug": s, "color": "9e9e9e"})).collect::<Vec<_>>(),
        "custom_fields": {}, "primary_ip4": null, "oob_ip": null,
        "last_updated": "2026-11-29T16:00:09.854406Z"
    })
}

/// The three devices of the sample (dc1) and synthesized ones: more dc1
/// devices with provisioning tags, one without a name, one in dc2 and one
/// in dc3 (an inventory-only site).
fn fleet_of_devices() -> Vec<serde_json::Value> {
    let sample: serde_json::Value = serde_json::from_str(SAMPLE).unwrap();
    let mut out: Vec<serde_json::Value> = sample["results"].as_array().unwrap().clone();
    out.push(device(
        4,
        Some("gpu04"),
        "dc1",
        "staged",
        &[
            ("Not Started", "not-started"),
            ("x", "dhcp-configured"),
            ("slurm", "slurm"),
        ],
        None,
    ));
    out.push(device(
        5,
        Some("gpu05"),
        "dc1",
        "failed",
        &[("Provisioned", "provisioned")],
        Some("r7"),
    ));
    out.push(device(6, None, "dc1", "active", &[], None));
    out.push(device(
        10,
        Some("gpu10"),
        "dc2",
        "active",
        &[("BMC Configured", "bmc-configured")],
        None,
    ));
    out.push(device(20, Some("gpu20"), "dc3", "inventory", &[], None));
    out
}

async fn netbox_fake(authorization: &str) -> (FakeHttp, Arc<NetboxFake>) {
    let fake = Arc::new(NetboxFake {
        authorization: Mutex::new(authorization.to_string()),
        devices: Mutex::new(fleet_of_devices()),
    });
    let http = FakeHttp::start().await;
    http.route(
        "GET",
        "^/api/dcim/devices/$",
        with(&fake, NetboxFake::devices),
    )
    .await;
    (http, fake)
}

fn netbox_config(url: &str, token: Credential) -> fleet_connector_netbox::Config {
    let mut config = fleet_connector_netbox::Config::default();
    let c = &mut config;
    c.listen = "127.0.0.1:0".into();
    c.poll = fast_poll();
    c.url = url.into();
    c.token = token;
    c.page_size = 2;
    // `nb-inv` is not in the database: the connector creates it, inventory-only.
    c.sites = [("s1", "dc1"), ("s2", "dc2"), ("nb-inv", "dc3")]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    c.inventory_only_sites = vec!["nb-inv".into()];
    config
}

fn run_netbox(env: &TestEnv, config: fleet_connector_netbox::Config) -> Running {
    Running::spawn(env, config, fleet_connector_netbox::run)
}

/// The connector against the fake at `url`, with the v1 token.
fn run_netbox_v1(env: &TestEnv, url: &str) -> Running {
    let token = Credential {
        value: Secret::new(V1_TOKEN),
        ..Default::default()
    };
    run_netbox(env, netbox_config(url, token))
}

#[derive(Debug, PartialEq, Eq, sqlx::FromRow)]
struct Row {
    site_id: String,
    inventory_status: String,
    netbox_tags: Vec<String>,
    netbox_id: Option<i64>,
    serial: Option<String>,
    rack: Option<String>,
    inventory_only: bool,
    operational_status: String,
}

/// How many lifecycle rows of `kind` with `value` the device has.
async fn lifecycle_rows(env: &TestEnv, device_id: &str, kind: &str, value: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM device_lifecycle_events WHERE device_id = $1 AND kind = $2 AND value = $3",
    )
    .bind(device_id)
    .bind(kind)
    .bind(value)
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

async fn rows(env: &TestEnv, name: &str) -> Vec<Row> {
    sqlx::query_as(
        "SELECT site_id, inventory_status, netbox_tags, netbox_id, serial, rack, inventory_only, operational_status \
         FROM devices WHERE name = $1",
    )
    .bind(name)
    .fetch_all(&env.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn netbox_creates_unknown_devices_and_mirrors_status_and_tags_through_the_hub() {
    let env = TestEnv::new().await;
    let hub = HubTask::start(&env).await;
    // Known to the hub already: create_device answers CONFLICT.
    env.create_device("s1", "gpu01").await;
    let (control, _fake) = netbox_fake(&format!("Token {V1_TOKEN}")).await;
    let connector = run_netbox_v1(&env, &control.url());

    let gpu05 = eventually("gpu05 created from netbox", || async {
        let r = rows(&env, "gpu05").await;
        (r.len() == 1 && r[0].netbox_tags == ["Provisioned"]).then(|| r.into_iter().next().unwrap())
    })
    .await;
    assert_eq!(
        gpu05,
        Row {
            site_id: "s1".into(),
            inventory_status: "failed".into(),
            netbox_tags: vec!["Provisioned".into()],
            netbox_id: Some(5),
            serial: Some("SN-0005".into()),
            rack: Some("r7".into()),
            inventory_only: false,
            operational_status: "unknown".into(),
        }
    );
    let gpu04 = eventually("gpu04 tags", || async {
        let r = rows(&env, "gpu04").await;
        (r.len() == 1 && !r[0].netbox_tags.is_empty()).then(|| r.into_iter().next().unwrap())
    })
    .await;
    assert_eq!(gpu04.netbox_tags, vec!["Not Started", "DHCP Configured"]);
    assert_eq!(gpu04.inventory_status, "staged");
    // The device the hub knew gets NetBox's status through the mirror.
    eventually("gpu01 active", || async {
        let r = rows(&env, "gpu01").await;
        (r.len() == 1 && r[0].inventory_status == "active").then_some(())
    })
    .await;
    for (name, site, status) in [
        ("gpu02", "s1", "planned"),
        ("gpu03", "s1", "offline"),
        ("gpu10", "s2", "active"),
    ] {
        let r = eventually(&format!("{name} created"), || async {
            let r = rows(&env, name).await;
            (r.len() == 1).then(|| r.into_iter().next().unwrap())
        })
        .await;
        assert_eq!(
            (r.site_id.as_str(), r.inventory_status.as_str()),
            (site, status),
            "{name}"
        );
    }
    // The connector created the configured site it did not find, inventory-
    // only from its configuration, and the hub gives its devices the flag.
    let gpu20 = eventually("gpu20 created", || async {
        let r = rows(&env, "gpu20").await;
        (r.len() == 1).then(|| r.into_iter().next().unwrap())
    })
    .await;
    assert_eq!(
        (gpu20.site_id.as_str(), gpu20.inventory_only),
        ("nb-inv", true)
    );
    let site: (String, bool) =
        sqlx::query_as("SELECT name, inventory_only FROM sites WHERE id = 'nb-inv'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(site, ("dc3".to_string(), true));
    // A site that existed keeps its flag (s2 is managed).
    let s2: bool = sqlx::query_scalar("SELECT inventory_only FROM sites WHERE id = 's2'")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(!s2);

    // Pagination followed, rebased onto the configured origin, with the token.
    let dc1: Vec<Seen> = control
        .seen()
        .await
        .into_iter()
        .filter(|s| s.uri.contains("site=dc1"))
        .collect();
    assert!(
        dc1.iter().any(|s| s.uri.contains("offset=4")),
        "third page read"
    );
    assert!(dc1
        .iter()
        .all(|s| s.headers["authorization"] == format!("Token {V1_TOKEN}")));
    // Several polls later, still one device per name.
    let polls = control.count("/api/dcim/devices/").await;
    eventually("more polls", || async {
        (control.count("/api/dcim/devices/").await > polls + 6).then_some(())
    })
    .await;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM devices")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(
        n, 7,
        "gpu01-05, gpu10, gpu20; the unnamed device is skipped"
    );

    // NetBox down: it owns no conditions, so nothing changes and nothing fails.
    control.fail("/api/", Fault::Status(503, r#"{"detail": "maintenance"}"#));
    let polls = control.count("/api/dcim/devices/").await;
    eventually("failing polls", || async {
        (control.count("/api/dcim/devices/").await > polls + 4).then_some(())
    })
    .await;
    connector.assert_alive();
    assert_eq!(rows(&env, "gpu05").await[0].inventory_status, "failed");
    let bad: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM devices WHERE operational_status IN ('failed', 'quarantine')",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(bad, 0);

    hub.stop(connector, env).await;
}

/// A v2 token goes as `Bearer`; a revoked token is an auth failure that is
/// logged and counted, never a crash, and publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn netbox_bearer_token_from_the_environment_and_auth_failure() {
    let env = TestEnv::new().await;
    let reader = ObsReader::new(&env, "netbox").await;
    let (control, fake) = netbox_fake(&format!("Bearer {V2_TOKEN}")).await;
    let url = control.url();
    let var = format!("FLEET_TEST_NETBOX_TOKEN_{}", env.db_name.to_uppercase());
    std::env::set_var(&var, V2_TOKEN);
    let port = free_port();
    let mut config = netbox_config(
        &url,
        Credential {
            env: var.clone(),
            ..Default::default()
        },
    );
    config.listen = format!("127.0.0.1:{port}");
    let connector = run_netbox(&env, config);
    // No hub runs: creation gets no reply, and the snapshots are published anyway.
    let s = reader.until("gpu10", |s| key_of(s) == "gpu10").await;
    let k = s.device.as_ref().unwrap();
    assert_eq!((k.site.as_str(), k.kind.as_str()), ("s2", "name"));
    assert!(s.conditions.is_empty());
    match &s.mirror {
        Some(Mirror::Netbox(m)) => {
            assert_eq!(m.status, "active");
            assert_eq!(m.tags, vec!["BMC Configured"]);
            assert_eq!(m.netbox_id, 10);
        }
        other => panic!("{other:?}"),
    }
    assert!(control
        .seen()
        .await
        .iter()
        .all(|s| s.headers["authorization"] == format!("Bearer {V2_TOKEN}")));

    // Every site's first poll has gone through (the unnamed device is
    // counted) before the token is revoked: on a loaded machine a site's
    // first poll can come after the revocation.
    eventually("the unnamed device counted", || async {
        metrics(port)
            .await
            .contains(
                r#"fleet_connector_mapping_warnings_total{source="netbox",kind="unnamed_device"}"#,
            )
            .then_some(())
    })
    .await;
    *fake.authorization.lock().unwrap() = "Bearer nbt_rotated.other".into();
    let polls = control.count("/api/dcim/devices/").await;
    eventually("refused polls", || async {
        (control.count("/api/dcim/devices/").await > polls + 4).then_some(())
    })
    .await;
    reader
        .assert_silent(
            Duration::ZERO,
            Duration::from_millis(500),
            "an unreadable netbox publishes nothing",
        )
        .await;
    connector.assert_alive();
    let m = metrics(port).await;
    assert!(
        m.contains(r#"fleet_connector_errors_total{source="netbox",site="s1",kind="auth"}"#),
        "{m}"
    );
    assert!(
        m.contains(
            r#"fleet_connector_mapping_warnings_total{source="netbox",kind="unnamed_device"}"#
        ),
        "{m}"
    );
    assert!(
        m.contains(r#"fleet_connector_errors_total{source="netbox",site="s1",kind="hub_command"}"#),
        "{m}"
    );
    connector.stop().await;
    std::env::remove_var(&var);
    env.cleanup().await;
}

/// Issue 19: "A device that disappears from NetBox is marked": its
/// inventory status goes `unknown` (so it is not `active`), its tags are
/// cleared and the inventory axis gets a lifecycle row; listed again, it
/// takes NetBox's status back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_gone_from_netbox_is_marked_and_comes_back() {
    let env = TestEnv::new().await;
    let hub = HubTask::start(&env).await;
    let (control, fake) = netbox_fake(&format!("Token {V1_TOKEN}")).await;
    let connector = run_netbox_v1(&env, &control.url());
    eventually("gpu05 created as failed", || async {
        let r = rows(&env, "gpu05").await;
        (r.len() == 1 && r[0].inventory_status == "failed").then_some(())
    })
    .await;
    // A board swap and a move, edited in NetBox: the serial and the rack
    // follow, each a lifecycle row.
    {
        let mut d = fake.devices.lock().unwrap();
        let x = d.iter_mut().find(|x| x["name"] == "gpu05").unwrap();
        x["serial"] = "SN-SWAPPED-0005".into();
        x["rack"] = serde_json::json!({"id": 10, "name": "r8"});
    }
    let swapped = eventually("gpu05's new serial and rack mirrored", || async {
        let r = rows(&env, "gpu05").await;
        (r.len() == 1 && r[0].serial.as_deref() == Some("SN-SWAPPED-0005"))
            .then(|| r.into_iter().next().unwrap())
    })
    .await;
    assert_eq!(swapped.rack.as_deref(), Some("r8"));
    let kinds: Vec<(String, String)> = sqlx::query_as(
        "SELECT kind, value FROM device_lifecycle_events e JOIN devices d ON d.id = e.device_id \
         WHERE d.name = 'gpu05' AND kind IN ('serial', 'rack') ORDER BY e.id",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert!(
        kinds.contains(&("serial".into(), "SN-SWAPPED-0005".into())),
        "{kinds:?}"
    );
    assert!(kinds.contains(&("rack".into(), "r8".into())), "{kinds:?}");
    let removed = {
        let mut d = fake.devices.lock().unwrap();
        let i = d.iter().position(|x| x["name"] == "gpu05").unwrap();
        d.remove(i)
    };
    let gone = eventually("gpu05 marked once gone from netbox", || async {
        let r = rows(&env, "gpu05").await;
        (r.len() == 1 && r[0].inventory_status == "unknown").then(|| r.into_iter().next().unwrap())
    })
    .await;
    assert!(gone.netbox_tags.is_empty(), "{gone:?}");
    assert_eq!(
        gone.serial.as_deref(),
        Some("SN-SWAPPED-0005"),
        "the mark keeps the identity"
    );
    let id: String = sqlx::query_scalar("SELECT id FROM devices WHERE name = 'gpu05'")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(
        lifecycle_rows(&env, &id, "inventory", "unknown").await,
        1,
        "one lifecycle row for the mark"
    );
    // Still one device of that name: the mark is not a deletion.
    assert_eq!(rows(&env, "gpu05").await.len(), 1);

    // Back, but deleted and re-created in NetBox: a new NetBox id, which
    // the device follows (a lifecycle row on `netbox_id`).
    let mut recreated = removed;
    recreated["id"] = 905.into();
    fake.devices.lock().unwrap().push(recreated);
    eventually("gpu05 back with netbox's status and new id", || async {
        let r = rows(&env, "gpu05").await;
        (r.len() == 1 && r[0].inventory_status == "failed" && r[0].netbox_id == Some(905))
            .then_some(())
    })
    .await;
    assert_eq!(
        lifecycle_rows(&env, &id, "netbox_id", "905").await,
        1,
        "one lifecycle row for the new NetBox id"
    );

    // NetBox naming gpu04 with the id gpu05 holds (unique in the site)
    // does not fail the hub's write: gpu04 keeps its id, and the rest of
    // its snapshot (a status change) applies.
    let gpu04_id = rows(&env, "gpu04").await[0].netbox_id;
    {
        let mut d = fake.devices.lock().unwrap();
        let x = d.iter_mut().find(|x| x["name"] == "gpu04").unwrap();
        x["id"] = 905.into();
        x["status"] = serde_json::json!({"value": "offline", "label": "Offline"});
    }
    let after = eventually("gpu04's status applied", || async {
        let r = rows(&env, "gpu04").await;
        (r.len() == 1 && r[0].inventory_status == "offline").then(|| r.into_iter().next().unwrap())
    })
    .await;
    assert_eq!(after.netbox_id, gpu04_id, "gpu04 keeps its own NetBox id");
    assert_eq!(rows(&env, "gpu05").await[0].netbox_id, Some(905));
    hub.stop(connector, env).await;
}
