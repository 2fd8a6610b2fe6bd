//! connector-fabric against a fake NetBox (cabled interfaces), fake NVUE
//! switches and a fake NMX-M on one port, through the hub: the three
//! live-fabric observations per device from three sources, latch drift
//! counted and listed (never repaired), outages of each system; and the
//! drift SQL against the domain's table.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use fleet_connector_fabric::SiteConfig as FabricSiteConfig;
use fleet_domain::drift::{drift, PAIRS};
use fleet_domain::ConditionStatus;
use fleet_latch::{Latch, LatchWrite, LatchWriter};
use fleet_runtime::config::{Credential, Secret};
use fleet_store::drift::{DriftFilter, Freshness};
use wiremock::{Request, ResponseTemplate};

use crate::support::*;

const NETBOX_TOKEN: &str = "0123456789abcdef0123456789abcdef01234567";
const NVUE_PASSWORD: &str = "CumulusLab1!";
const NMX_TOKEN: &str = "nmx-bearer-token";

pub struct FabricFake {
    /// NetBox interfaces (all switches; filtered by `device=`).
    pub interfaces: Mutex<Vec<serde_json::Value>>,
    /// Switch -> its `GET /nvue_v1/interface` body.
    pub switches: Mutex<BTreeMap<String, serde_json::Value>>,
    pub gpus: Mutex<Vec<serde_json::Value>>,
}

fn iface(switch: &str, port: &str, device: &str, device_port: &str) -> serde_json::Value {
    serde_json::json!({
        "id": 1, "name": port, "device": {"id": 1, "name": switch},
        "cable": {"id": 1},
        "link_peers": [{"id": 2, "name": device_port, "device": {"id": 2, "name": device}}],
        "link_peers_type": "dcim.interface",
        "connected_endpoints": [{"id": 2, "name": device_port, "device": {"id": 2, "name": device}}],
        "connected_endpoints_type": "dcim.interface",
        "connected_endpoints_reachable": true
    })
}

impl FabricFake {
    /// NetBox's `/netbox/api/dcim/interfaces/?site=dc1&cabled=true&device=..`.
    fn netbox_interfaces(&self, r: &Request) -> ResponseTemplate {
        if header(r, "authorization") != format!("Token {NETBOX_TOKEN}") {
            return json(403, serde_json::json!({"detail": "Invalid v1 token"}));
        }
        let p = query(r);
        if param(r, "site").as_deref() != Some("dc1")
            || param(r, "cabled").as_deref() != Some("true")
        {
            return json(400, serde_json::json!({"detail": "unexpected filter"}));
        }
        let devices: BTreeSet<&str> = p
            .iter()
            .filter(|(k, _)| k == "device")
            .map(|(_, v)| v.as_str())
            .collect();
        let number = |k: &str| param(r, k).and_then(|l| l.parse::<usize>().ok());
        let (limit, offset) = (number("limit").unwrap_or(50), number("offset").unwrap_or(0));
        let all: Vec<serde_json::Value> = self
            .interfaces
            .lock()
            .unwrap()
            .iter()
            .filter(|i| devices.contains(i["device"]["name"].as_str().unwrap_or_default()))
            .cloned()
            .collect();
        let page: Vec<_> = all.iter().skip(offset).take(limit).cloned().collect();
        // NetBox names itself as it believes it is reached.
        let next = (offset + limit < all.len()).then(|| {
            let mut q: Vec<String> = p
                .iter()
                .filter(|(k, _)| k != "offset")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            q.push(format!("offset={}", offset + limit));
            format!(
                "http://netbox.internal:8000/netbox/api/dcim/interfaces/?{}",
                q.join("&")
            )
        });
        json(
            200,
            serde_json::json!({"count": all.len(), "next": next, "previous": null, "results": page}),
        )
    }

    /// A switch's `/switch/{switch}/nvue_v1/interface?rev=operational`.
    fn nvue_interfaces(&self, r: &Request) -> ResponseTemplate {
        let want = format!(
            "Basic {}",
            base64(format!("cumulus:{NVUE_PASSWORD}").as_bytes())
        );
        if header(r, "authorization") != want {
            return json(
                401,
                serde_json::json!({"status": 401, "title": "Unauthorized"}),
            );
        }
        if param(r, "rev").as_deref() != Some("operational") {
            return json(400, serde_json::json!({"title": "rev expected"}));
        }
        let switch = r.url.path().split('/').nth(2).unwrap_or_default();
        match self.switches.lock().unwrap().get(switch) {
            Some(body) => json(200, body.clone()),
            None => json(404, serde_json::json!({"title": "Not Found"})),
        }
    }

    /// NMX-M's `/nmx/v1/{partitions,gpus,compute-nodes}`.
    fn nmx(&self, r: &Request) -> ResponseTemplate {
        if header(r, "authorization") != format!("Bearer {NMX_TOKEN}") {
            return json(401, serde_json::json!({"message": "unauthorized"}));
        }
        let body = match r.url.path().trim_start_matches("/nmx/v1/") {
            "partitions" => serde_json::json!([
                {"ID": "p0", "PartitionID": 32766, "Name": "Default Partition", "Health": "HEALTHY"},
                {"ID": "p1", "PartitionID": 7, "Name": "repair", "Health": "HEALTHY"}
            ]),
            "gpus" => serde_json::Value::Array(self.gpus.lock().unwrap().clone()),
            "compute-nodes" => serde_json::json!([
                {"ID": "n1", "Name": "gpu-f1-01", "GpuIDList": ["g1", "g2"]},
                {"ID": "n2", "Name": "gpu-f1-02", "GpuIDList": ["g3", "g4"]}
            ]),
            _ => return json(404, serde_json::json!({"message": "not found"})),
        };
        json(200, body)
    }
}

/// NetBox, the NVUE switches and NMX-M on one port.
pub async fn fabric_fake(fake: FabricFake) -> (FakeHttp, Arc<FabricFake>) {
    let fake = Arc::new(fake);
    let http = FakeHttp::start().await;
    let routes: [(&str, fn(&FabricFake, &Request) -> ResponseTemplate); 3] = [
        (
            "^/netbox/api/dcim/interfaces/$",
            FabricFake::netbox_interfaces,
        ),
        (
            "^/switch/[^/]+/nvue_v1/interface$",
            FabricFake::nvue_interfaces,
        ),
        ("^/nmx/v1/[^/]+$", FabricFake::nmx),
    ];
    for (path, answer) in routes {
        http.route("GET", path, with(&fake, answer)).await;
    }
    (http, fake)
}

fn gpus(repair: &[&str]) -> Vec<serde_json::Value> {
    ["g1", "g2", "g3", "g4"]
        .iter()
        .map(|g| {
            let p = if repair.contains(g) { 7 } else { 32766 };
            serde_json::json!({"ID": g, "PartitionID": p, "DeviceID": 0})
        })
        .collect()
}

fn fabric_config(url: &str) -> fleet_connector_fabric::Config {
    let mut config = fleet_connector_fabric::Config::default();
    let c = &mut config;
    c.listen = "127.0.0.1:0".into();
    c.poll = fast_poll();
    c.netbox_url = format!("{url}/netbox");
    c.netbox_token = Credential {
        value: Secret::new(NETBOX_TOKEN),
        ..Default::default()
    };
    c.netbox_page_size = 2;
    c.nvue_username = "cumulus".into();
    c.nvue_password = Credential {
        value: Secret::new(NVUE_PASSWORD),
        ..Default::default()
    };
    let sw = |n: &str| (n.to_string(), format!("{url}/switch/{n}"));
    c.sites.insert(
        "s1".into(),
        FabricSiteConfig {
            netbox_site: "dc1".into(),
            frontend_switches: [sw("leaf01"), sw("leaf02")].into(),
            backend_switches: [sw("be01")].into(),
            customer_vrfs: vec!["cust-*".into()],
            maintenance_vrf: "maint".into(),
            exclude_peers: vec!["spine*".into()],
            nmx_url: url.to_string(),
            nmx_token: Credential {
                value: Secret::new(NMX_TOKEN),
                ..Default::default()
            },
            repair_partition: "repair".into(),
            ..Default::default()
        },
    );
    config
}

async fn expect(env: &TestEnv, id: &str, t: &str, status: &str, reason: &str) -> String {
    eventually(&format!("{t} {status} {reason}"), || async {
        let (s, r, m) = condition_row(env, id, t).await?;
        (s == status && r == reason).then_some(m)
    })
    .await
}

const FE: &str = "FrontendPortsObservedInCustomerVrf";
const BE: &str = "BackendPortsObservedInMaintenanceVrf";
const NV: &str = "NvLinkGpusObservedInRepairPartition";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fabric_observations_through_the_hub_drift_counted_never_repaired_and_outages() {
    let mut env = TestEnv::new().await;
    let hub_port = free_port();
    env.hub.listen = format!("127.0.0.1:{hub_port}");
    let hub = RunningHub::start(&env).await;
    let f1 = env.create_device("s1", "gpu-f1-01").await;
    let f2 = env.create_device("s1", "gpu-f1-02").await;
    let (control, fake) = fabric_fake(FabricFake {
        interfaces: Mutex::new(vec![
            iface("leaf01", "swp1", "gpu-f1-01", "eth0"),
            iface("leaf02", "swp1", "gpu-f1-01", "eth1"),
            iface("leaf01", "swp2", "gpu-f1-02", "eth0"),
            iface("leaf02", "swp31", "spine01", "swp1"),
            iface("be01", "swp1", "gpu-f1-01", "ens1f0"),
            iface("be01", "swp2", "gpu-f1-02", "ens1f0"),
        ]),
        switches: Mutex::new(
            [
                (
                    "leaf01".to_string(),
                    serde_json::json!({
                        "swp1": {"ip": {"vrf": "cust-7"}, "type": "swp"},
                        "swp2": {"bridge": {"domain": {"br_default": {"access": 20}}}, "type": "swp"},
                        "vlan20": {"ip": {"vrf": "isolate"}, "type": "svi", "vlan": 20}
                    }),
                ),
                (
                    "leaf02".to_string(),
                    serde_json::json!({"swp1": {"ip": {"vrf": "cust-7"}, "type": "swp"}}),
                ),
                (
                    "be01".to_string(),
                    serde_json::json!({
                        "swp1": {"ip": {"vrf": "maint"}, "type": "swp"},
                        "swp2": {"ip": {"vrf": "roce"}, "type": "swp"}
                    }),
                ),
            ]
            .into(),
        ),
        gpus: Mutex::new(gpus(&["g1", "g2"])),
    })
    .await;
    let config = fabric_config(&control.url());
    let connector = Running::spawn(&env, config, fleet_connector_fabric::run);

    let m = expect(&env, &f1, FE, "True", "CustomerVrfObserved").await;
    assert_eq!(
        m,
        "every port in a customer VRF: leaf01:swp1 (eth0) in cust-7; leaf02:swp1 (eth1) in cust-7"
    );
    expect(&env, &f2, FE, "False", "CustomerVrfNotObserved").await;
    expect(&env, &f1, BE, "True", "MaintenanceVrfObserved").await;
    expect(&env, &f2, BE, "False", "MaintenanceVrfNotObserved").await;
    expect(&env, &f1, NV, "True", "RepairPartitionObserved").await;
    expect(&env, &f2, NV, "False", "RepairPartitionNotObserved").await;
    for (t, source) in [
        (FE, "frontend-fabric"),
        (BE, "backend-fabric"),
        (NV, "nvlink-fabric"),
    ] {
        assert_eq!(
            condition_row_with_source(&env, &f1, t).await.unwrap().3,
            source,
            "a snapshot's source owns its type"
        );
    }
    // The spine behind leaf02 is not a device.
    let spine: i64 =
        sqlx::query_scalar("SELECT count(*) FROM unresolved_observations WHERE key = 'spine01'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(spine, 0);
    // What was asked of each system.
    let seen = control.seen().await;
    let nb: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.uri.starts_with("/netbox/"))
        .collect();
    assert!(
        nb.iter().any(|s| s.uri.contains("offset=2")),
        "next followed, rebased"
    );
    let fe_query = nb
        .iter()
        .find(|s| s.uri.contains("device=leaf01"))
        .expect("the front-end plane's query");
    assert!(fe_query.uri.contains("device=leaf02") && !fe_query.uri.contains("device=be01"));
    assert!(seen
        .iter()
        .any(|s| s.uri == "/switch/be01/nvue_v1/interface?rev=operational"));

    // Latches written by workflows; the observations disagree for two.
    let writer = LatchWriter::new(env.nats.clone(), env.subjects.clone(), "workflow:test");
    let now = micros(Utc::now());
    let write = |latch, id: &str, reason: &str| {
        LatchWrite::new(latch, LatchWrite::device_id(id), reason, "verified", now).unwrap()
    };
    // gpu-f1-01: NVLink move verified, agrees; no front-end latch while its
    // ports are in a customer VRF: unguarded.
    writer
        .write(&write(Latch::NvlinkPartition, &f1, "MoveVerified"))
        .await
        .unwrap();
    // gpu-f1-02: back-end isolation recorded, but the ports are not in
    // the maintenance VRF: a stale guard.
    writer
        .write(&write(Latch::BackendVrf, &f2, "IsolateVerified"))
        .await
        .unwrap();
    let unguarded = r#"fleet_hub_latch_drift_devices{site="s1",latch="FrontendPortsInCustomerVrf",drift="unguarded"} 1"#;
    let stale_guard = r#"fleet_hub_latch_drift_devices{site="s1",latch="BackendPortsInMaintenanceVrf",drift="stale_guard"} 1"#;
    let backend_unguarded = r#"fleet_hub_latch_drift_devices{site="s1",latch="BackendPortsInMaintenanceVrf",drift="unguarded"} 1"#;
    eventually("the drift gauge", || async {
        let m = metrics(hub_port).await;
        (m.contains(unguarded) && m.contains(stale_guard) && m.contains(backend_unguarded))
            .then_some(())
    })
    .await;
    assert!(!metrics(hub_port)
        .await
        .contains("NvLinkGpusInRepairPartition"));
    let per_source: Vec<_> = hub
        .deadlines
        .ttls
        .per_source
        .iter()
        .map(|(s, d)| (*s, *d))
        .collect();
    let fresh = Freshness {
        per_source: &per_source,
        default: hub.deadlines.ttls.default,
    };
    let listed = fleet_store::drift::list(&env.pool, &fresh, &DriftFilter::default(), 100)
        .await
        .unwrap();
    let got: BTreeSet<(String, String, String, Option<String>, String)> = listed
        .iter()
        .map(|r| {
            (
                r.device_id.clone(),
                r.latch_type.clone(),
                r.drift.clone(),
                r.latch_status.clone(),
                r.observed_status.clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                f1.clone(),
                "FrontendPortsInCustomerVrf".to_string(),
                "unguarded".to_string(),
                None,
                "True".to_string()
            ),
            // Its back-end ports are in the maintenance VRF with no latch.
            (
                f1.clone(),
                "BackendPortsInMaintenanceVrf".to_string(),
                "unguarded".to_string(),
                None,
                "True".to_string()
            ),
            (
                f2.clone(),
                "BackendPortsInMaintenanceVrf".to_string(),
                "stale_guard".to_string(),
                Some("True".to_string()),
                "False".to_string()
            ),
        ]
        .into()
    );
    let only_site2 = fleet_store::drift::list(
        &env.pool,
        &fresh,
        &DriftFilter {
            site: Some("s2".into()),
            ..Default::default()
        },
        100,
    )
    .await
    .unwrap();
    assert!(only_site2.is_empty());
    // The hub counts and never repairs: after more polls the latches are
    // exactly as written.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        condition_row_with_source(&env, &f2, "BackendPortsInMaintenanceVrf")
            .await
            .unwrap(),
        (
            "True".into(),
            "IsolateVerified".into(),
            "verified".into(),
            "backend-fabric".into()
        )
    );
    assert!(condition_row(&env, &f1, "FrontendPortsInCustomerVrf")
        .await
        .is_none());

    // A verified flip resolves the unguarded device; the series goes.
    writer
        .write(&write(Latch::FrontendVrf, &f1, "CustomerVrfFlipVerified"))
        .await
        .unwrap();
    eventually("unguarded resolved", || async {
        let m = metrics(hub_port).await;
        (!m.contains(unguarded) && m.contains(stale_guard)).then_some(())
    })
    .await;

    // The live membership moves: the NVLink observation follows, the latch
    // does not, and the disagreement is counted.
    *fake.gpus.lock().unwrap() = gpus(&[]);
    expect(&env, &f1, NV, "False", "RepairPartitionNotObserved").await;
    eventually("nvlink stale guard", || async {
        metrics(hub_port)
            .await
            .contains(r#"latch="NvLinkGpusInRepairPartition",drift="stale_guard"} 1"#)
            .then_some(())
    })
    .await;
    assert_eq!(
        condition_row(&env, &f1, "NvLinkGpusInRepairPartition")
            .await
            .unwrap()
            .1,
        "MoveVerified"
    );
    *fake.gpus.lock().unwrap() = gpus(&["g1", "g2", "g3"]);
    let m = expect(&env, &f2, NV, "Unknown", "PartiallyInRepairPartition").await;
    assert_eq!(m, r#"1 of 2 GPUs in partition "repair" (PartitionID 7)"#);

    // One switch down: only the devices behind it are Unknown.
    control.fail("/switch/leaf02/", Fault::Status(503, "<html>nginx</html>"));
    let m = expect(&env, &f1, FE, "Unknown", "SwitchUnreachable").await;
    assert!(
        m.contains("leaf02:swp1 (eth1) switch unreachable") && m.contains("HTTP 503"),
        "{m}"
    );
    assert_eq!(
        condition_row(&env, &f2, FE).await.unwrap().1,
        "CustomerVrfNotObserved"
    );
    control.heal();
    expect(&env, &f1, FE, "True", "CustomerVrfObserved").await;
    // A port the switch does not list.
    fake.switches
        .lock()
        .unwrap()
        .get_mut("be01")
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove("swp2");
    let m = expect(&env, &f2, BE, "Unknown", "PortVrfUnresolved").await;
    assert!(m.contains("the switch lists no such interface"), "{m}");
    // NetBox down: both planes Unknown; NMX-M down: NVLink Unknown.
    control.fail("/netbox/", Fault::Status(502, "bad gateway"));
    expect(&env, &f1, FE, "Unknown", "NetboxUnreachable").await;
    expect(&env, &f1, BE, "Unknown", "NetboxUnreachable").await;
    control.fail("/nmx/", Fault::Malformed);
    let m = expect(&env, &f1, NV, "Unknown", "NmxUnreachable").await;
    assert!(m.contains("malformed body"), "{m}");
    connector.assert_alive();
    control.heal();
    expect(&env, &f1, BE, "True", "MaintenanceVrfObserved").await;

    connector.stop().await;
    hub.stop(env).await;
}

/// The drift query agrees with the domain's table for every combination of
/// latch and observation, fresh and stale, on each of the three pairs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latch_drift_sql_agrees_with_the_domain() {
    let env = TestEnv::new().await;
    let now = micros(Utc::now());
    let old = now - chrono::Duration::minutes(30);
    let statuses = [
        None,
        Some(ConditionStatus::True),
        Some(ConditionStatus::False),
        Some(ConditionStatus::Unknown),
    ];
    // (status, stale, confirmed by a fresh snapshot)
    let observations: Vec<Option<(ConditionStatus, bool, bool)>> = vec![
        None,
        Some((ConditionStatus::True, false, false)),
        Some((ConditionStatus::False, false, false)),
        Some((ConditionStatus::Unknown, false, false)),
        Some((ConditionStatus::True, true, false)),
        Some((ConditionStatus::False, true, false)),
        Some((ConditionStatus::True, true, true)),
    ];
    let mut want = BTreeSet::new();
    let mut n = 0;
    for (pi, pair) in PAIRS.iter().enumerate() {
        let source = pair.observed.entry().owners[0].as_str();
        for latch in statuses {
            for obs in &observations {
                n += 1;
                let id = format!("dev-{pi}-{n:03}");
                sqlx::query("INSERT INTO devices (id, name, site_id) VALUES ($1, $1, 's1')")
                    .bind(&id)
                    .execute(&env.pool)
                    .await
                    .unwrap();
                if let Some(l) = latch {
                    let (t, status) = (pair.latch.as_str(), l.as_str());
                    env.insert_condition(&id, t, status, "", source, true, old)
                        .await;
                }
                let mut effective = None;
                if let Some((s, stale, confirmed)) = obs {
                    let at = if *stale { old } else { now };
                    let (t, status) = (pair.observed.as_str(), s.as_str());
                    env.insert_condition(&id, t, status, "", source, false, at)
                        .await;
                    if *confirmed {
                        sqlx::query(
                            "INSERT INTO device_source_freshness (device_id, source, observed_at, digest, received_at) VALUES ($1, $2, $3, '\\x00', $3)",
                        )
                        .bind(&id)
                        .bind(source)
                        .bind(now)
                        .execute(&env.pool)
                        .await
                        .unwrap();
                    }
                    effective = Some(if *stale && !*confirmed {
                        ConditionStatus::Unknown
                    } else {
                        *s
                    });
                }
                if let Some(d) = drift(latch, effective) {
                    want.insert((id, pair.latch.as_str().to_string(), d.as_str().to_string()));
                }
            }
        }
    }
    let ttls: Vec<(fleet_domain::Source, chrono::Duration)> = vec![];
    let fresh = Freshness {
        per_source: &ttls,
        default: chrono::Duration::seconds(180),
    };
    // Two pages, to walk the keyset cursor.
    let mut got = BTreeSet::new();
    let mut filter = DriftFilter::default();
    loop {
        let page = fleet_store::drift::list(&env.pool, &fresh, &filter, 10)
            .await
            .unwrap();
        for r in &page {
            got.insert((r.device_id.clone(), r.latch_type.clone(), r.drift.clone()));
        }
        match page.last() {
            Some(last) if page.len() == 10 => {
                filter.after = Some((last.device_id.clone(), last.latch_type.clone()))
            }
            _ => break,
        }
    }
    assert_eq!(got, want);
    // Per pair: unguarded for a fresh (or freshly confirmed) True under a
    // False or absent latch (4), stale_guard for a fresh False under a
    // True or Unknown latch (2).
    assert_eq!(want.len(), 3 * 6);
    let counts = fleet_store::drift::counts(&env.pool, &fresh).await.unwrap();
    assert_eq!(
        counts.iter().map(|c| c.devices).sum::<i64>(),
        want.len() as i64
    );
    env.cleanup().await;
}
