//! connector-openstack against a fake Keystone v3, Ironic and Placement on
//! one port (the catalogue points at it).

use std::sync::{Arc, Mutex, OnceLock};

use chrono::Utc;
use fleet_openstack::SiteConfig as OpenstackSiteConfig;
use fleet_proto::v1;
use fleet_proto::v1::condition_snapshot::Mirror;
use fleet_runtime::config::{Credential, Secret};
use wiremock::{Request, ResponseTemplate};

use crate::support::*;

const TRAIT: &str = "CUSTOM_CUSTOMER_READY";
const PASSWORD: &str = "s3cret-pw";
const MAINT_PROJECT: &str = "4b0c9f0e-slurm-project";

pub struct OpenstackFake {
    base: OnceLock<String>,
    /// The one token Ironic and Placement accept; empty: none.
    valid_token: Mutex<String>,
    issued: Mutex<u32>,
    locked_out: Mutex<bool>,
    /// false: a standalone Ironic with `auth_strategy = noauth`.
    require_auth: bool,
    nodes: Mutex<Vec<serde_json::Value>>,
    /// Resource provider UUIDs carrying the trait.
    ready: Mutex<Vec<String>>,
}

fn ironic_error(status: u16, fault: &str) -> ResponseTemplate {
    // Ironic double-encodes its errors.
    let inner = serde_json::json!({"faultcode": "Client", "faultstring": fault, "debuginfo": null})
        .to_string();
    json(status, serde_json::json!({"error_message": inner}))
}

impl OpenstackFake {
    fn new(require_auth: bool, nodes: Vec<serde_json::Value>, ready: &[&str]) -> Self {
        OpenstackFake {
            base: OnceLock::new(),
            valid_token: Mutex::new(String::new()),
            issued: Mutex::new(0),
            locked_out: Mutex::new(false),
            require_auth,
            nodes: Mutex::new(nodes),
            ready: Mutex::new(ready.iter().map(|s| s.to_string()).collect()),
        }
    }

    /// Keystone revokes the current token.
    fn revoke(&self) {
        self.valid_token.lock().unwrap().clear();
    }

    /// Keystone revokes the token and refuses the connector's password.
    fn lock_out(&self) {
        *self.locked_out.lock().unwrap() = true;
        self.revoke();
    }

    fn authorised(&self, r: &Request) -> bool {
        !self.require_auth || {
            let t = header(r, "x-auth-token");
            !t.is_empty() && t == *self.valid_token.lock().unwrap()
        }
    }

    /// Keystone's `POST /v3/auth/tokens`: a password scoped to `service`.
    fn issue_token(&self, r: &Request) -> ResponseTemplate {
        let body = match json_body(r) {
            Ok(b) => b,
            Err(refused) => return refused,
        };
        let user = &body["auth"]["identity"]["password"]["user"];
        if *self.locked_out.lock().unwrap()
            || user["name"] != "fleet"
            || user["password"] != PASSWORD
            || body["auth"]["scope"]["project"]["name"] != "service"
        {
            return json(
                401,
                serde_json::json!({"error": {"code": 401, "title": "Unauthorized", "message": "The request you have made requires authentication."}}),
            );
        }
        let n = {
            let mut i = self.issued.lock().unwrap();
            *i += 1;
            *i
        };
        let token = format!("tok-{n}");
        *self.valid_token.lock().unwrap() = token.clone();
        let base = self.base.get().unwrap();
        let body = serde_json::json!({"token": {
            "methods": ["password"],
            "expires_at": (Utc::now() + chrono::Duration::hours(1)).to_rfc3339(),
            "project": {"id": "p1", "name": "service", "domain": {"id": "default", "name": "Default"}},
            "catalog": [
                {"type": "identity", "name": "keystone", "endpoints": [{"interface": "public", "region": "RegionOne", "region_id": "RegionOne", "url": format!("{base}/v3")}]},
                {"type": "baremetal", "name": "ironic", "endpoints": [
                    {"interface": "internal", "region": "RegionOne", "region_id": "RegionOne", "url": "http://127.0.0.1:1/unreachable"},
                    {"interface": "public", "region": "RegionOne", "region_id": "RegionOne", "url": format!("{base}/baremetal")}
                ]},
                {"type": "placement", "name": "placement", "endpoints": [{"interface": "public", "region": "RegionOne", "region_id": "RegionOne", "url": format!("{base}/placement")}]}
            ]
        }});
        json(201, body).insert_header("X-Subject-Token", token.as_str())
    }

    /// Ironic's `GET /baremetal/v1/nodes?detail=true&limit=&marker=`.
    fn ironic_nodes(&self, r: &Request) -> ResponseTemplate {
        if !self.authorised(r) {
            return ironic_error(401, "Authentication required");
        }
        if header(r, "x-openstack-ironic-api-version") != "1.80" {
            return ironic_error(406, "microversion header missing");
        }
        if param(r, "detail")
            .map(|d| d.to_ascii_lowercase())
            .as_deref()
            != Some("true")
        {
            return ironic_error(400, "expected detail=true");
        }
        let limit = match number_param(r, "limit") {
            Ok(l) => l.unwrap_or(1000),
            Err(bad) => return bad,
        };
        let nodes = self.nodes.lock().unwrap().clone();
        let start = match param(r, "marker") {
            None => 0,
            Some(m) => match nodes.iter().position(|n| n["uuid"] == m.as_str()) {
                Some(i) => i + 1,
                None => return ironic_error(400, &format!("Marker {m} could not be found.")),
            },
        };
        let page: Vec<serde_json::Value> = nodes.iter().skip(start).take(limit).cloned().collect();
        let mut body = serde_json::json!({"nodes": page});
        if start + limit < nodes.len() {
            let last = page.last().unwrap()["uuid"].as_str().unwrap().to_string();
            // Ironic's `next` names the host it believes it is.
            body["next"] = format!("http://ironic.internal:6385/baremetal/v1/nodes?detail=True&limit={limit}&marker={last}").into();
        }
        json(200, body)
    }

    /// Placement's `GET /placement/resource_providers[?required=<trait>]`.
    fn resource_providers(&self, r: &Request) -> ResponseTemplate {
        if !self.authorised(r) {
            return json(
                401,
                serde_json::json!({"errors": [{"status": 401, "title": "Unauthorized", "detail": "unauthorized"}]}),
            );
        }
        let required = param(r, "required");
        if header(r, "openstack-api-version") != "placement 1.18"
            || required.as_deref().is_some_and(|t| t != TRAIT)
        {
            return json(
                400,
                serde_json::json!({"errors": [{"status": 400, "title": "Bad Request", "detail": "required needs placement 1.18"}]}),
            );
        }
        // Without `required`: every provider, one per node (Nova's Ironic
        // driver names each after its node's uuid).
        let uuids: Vec<String> = match required {
            Some(_) => self.ready.lock().unwrap().iter().cloned().collect(),
            None => self
                .nodes
                .lock()
                .unwrap()
                .iter()
                .filter_map(|n| n["uuid"].as_str().map(str::to_string))
                .collect(),
        };
        let rps: Vec<serde_json::Value> = uuids
            .iter()
            .map(|u| serde_json::json!({"uuid": u, "name": u, "generation": 2, "root_provider_uuid": u, "parent_provider_uuid": null}))
            .collect();
        json(200, serde_json::json!({"resource_providers": rps}))
    }
}

/// Keystone, Ironic and Placement on one port (the catalogue points at it).
async fn openstack_fake(fake: OpenstackFake) -> (FakeHttp, Arc<OpenstackFake>) {
    let fake = Arc::new(fake);
    let http = FakeHttp::start().await;
    fake.base.set(http.url()).unwrap();
    let routes: [(&str, &str, fn(&OpenstackFake, &Request) -> ResponseTemplate); 3] = [
        ("POST", "^/v3/auth/tokens$", OpenstackFake::issue_token),
        ("GET", "^/baremetal/v1/nodes$", OpenstackFake::ironic_nodes),
        (
            "GET",
            "^/placement/resource_providers$",
            OpenstackFake::resource_providers,
        ),
    ];
    for (verb, path, answer) in routes {
        http.route(verb, path, with(&fake, answer)).await;
    }
    (http, fake)
}

#[allow(clippy::too_many_arguments)]
fn node(
    uuid: &str,
    name: &str,
    state: &str,
    maintenance: Option<&str>,
    instance: Option<&str>,
    lessee: Option<&str>,
    traits: &[&str],
) -> serde_json::Value {
    // The fields of the ironic-nodes-detail sample the connector reads, plus
    // a few it ignores.
    serde_json::json!({
        "uuid": uuid, "name": name, "provision_state": state, "target_provision_state": null,
        "power_state": "power on", "maintenance": maintenance.is_some(), "maintenance_reason": maintenance,
        "instance_uuid": instance, "lessee": lessee, "owner": null, "resource_class": "gpu.h100.8x",
        "last_error": if state.ends_with("failed") { serde_json::json!("PXE boot timed out") } else { serde_json::Value::Null },
        "fault": null, "retired": false, "traits": traits, "driver": "ipmi", "extra": {},
        "provision_updated_at": "2026-11-29T15:54:15.630443+00:00",
        "links": [{"href": format!("http://ironic.internal:6385/v1/nodes/{uuid}"), "rel": "self"}]
    })
}

fn site_config(url: &str) -> OpenstackSiteConfig {
    OpenstackSiteConfig {
        auth_url: format!("{url}/v3"),
        username: "fleet".into(),
        password: Credential {
            value: Secret::new(PASSWORD),
            ..Default::default()
        },
        project_name: "service".into(),
        region: "RegionOne".into(),
        maintenance_project_id: MAINT_PROJECT.into(),
        ..Default::default()
    }
}

fn openstack_config(site: OpenstackSiteConfig) -> fleet_connector_openstack::Config {
    let mut config = fleet_connector_openstack::Config::default();
    let c = &mut config;
    c.listen = "127.0.0.1:0".into();
    c.poll = fast_poll();
    c.page_size = 2;
    c.customer_ready_trait = TRAIT.into();
    c.sites.insert("s1".into(), site);
    config
}

fn run_openstack(env: &TestEnv, config: fleet_connector_openstack::Config) -> Running {
    Running::spawn(env, config, fleet_connector_openstack::run)
}

async fn statuses(env: &TestEnv, ids: &[(String, String)]) -> Vec<String> {
    let mut out = vec![];
    for (id, _) in ids {
        out.push(env.device_field(id, "operational_status").await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openstack_keystone_ironic_placement_through_the_hub_with_token_refresh_and_outage() {
    let env = TestEnv::new().await;
    let hub = HubTask::start(&env).await;
    let nodes = vec![
        node(
            "u1",
            "os-inuse",
            "active",
            None,
            Some("inst-1"),
            Some("customer-a"),
            &[],
        ),
        node("u2", "os-avail", "available", None, None, None, &[]),
        node("u3", "os-failed", "deploy failed", None, None, None, &[]),
        node(
            "u4",
            "os-maint",
            "active",
            Some("fan 3 failed"),
            Some("inst-4"),
            Some("customer-a"),
            &[],
        ),
        node(
            "u5",
            "os-pool",
            "manageable",
            None,
            None,
            Some(MAINT_PROJECT),
            &[],
        ),
    ];
    let mut ids = vec![];
    for n in &nodes {
        let name = n["name"].as_str().unwrap().to_string();
        ids.push((env.create_device("s1", &name).await, name));
    }
    let (control, fake) =
        openstack_fake(OpenstackFake::new(true, nodes, &["u1", "u2", "u4"])).await;
    let connector = run_openstack(&env, openstack_config(site_config(&control.url())));

    let want = ["in_use", "available", "failed", "quarantine", "quarantine"];
    eventually(&format!("operational statuses {want:?}"), || async {
        (statuses(&env, &ids).await == want).then_some(())
    })
    .await;
    // Every node's Placement binding is its resource provider (the node uuid).
    for (i, (id, _)) in ids.iter().enumerate() {
        let want = format!("u{}", i + 1);
        eventually("the placement binding stored", || async {
            let row: Option<(Option<String>, Option<chrono::DateTime<Utc>>)> = sqlx::query_as(
                "SELECT resource_id, failed_at FROM device_resource_bindings \
                 WHERE device_id = $1 AND resource = 'placement'",
            )
            .bind(id)
            .fetch_optional(&env.pool)
            .await
            .unwrap();
            (row == Some((Some(want.clone()), None))).then_some(())
        })
        .await;
    }
    let failed = &ids[2].0;
    assert_eq!(
        condition_row(&env, failed, "IronicProvisionHealthy")
            .await
            .unwrap(),
        (
            "False".into(),
            "DeployFailed".into(),
            "provision_state deploy failed: PXE boot timed out".into()
        )
    );
    assert_eq!(
        env.device_field(failed, "ironic_provision_state").await,
        "deploy failed"
    );
    let maint = &ids[3].0;
    assert_eq!(
        condition_row(&env, maint, "IronicMaintenance")
            .await
            .unwrap()
            .2,
        "fan 3 failed"
    );
    assert_eq!(
        condition_row(&env, &ids[4].0, "InMaintenancePool")
            .await
            .unwrap()
            .0,
        "True"
    );
    assert_eq!(
        env.device_field(&ids[0].0, "ironic_lessee").await,
        "customer-a"
    );
    assert_eq!(env.device_field(&ids[0].0, "power").await, "on");
    // Paginated by marker with the microversion; one Placement query per poll.
    let seen = control.seen().await;
    assert!(
        seen.iter().any(|s| s.uri.contains("marker=u4")),
        "third page read"
    );
    let polls = seen
        .iter()
        .filter(|s| s.uri.starts_with("/baremetal/v1/nodes?detail=true"))
        .count();
    // Two Placement queries per poll: the ready providers, and all of them
    // (the Placement bindings).
    let placement = |required: bool| {
        seen.iter()
            .filter(|s| s.uri.starts_with("/placement/") && s.uri.contains("required=") == required)
            .count()
    };
    for required in [true, false] {
        let n = placement(required);
        assert!(
            n <= polls && n + 1 >= polls,
            "{n} placement queries (required: {required}) for {polls} polls"
        );
    }
    assert_eq!(*fake.issued.lock().unwrap(), 1, "the token is cached");
    assert!(seen
        .iter()
        .filter(|s| s.uri == "/v3/auth/tokens")
        .all(|s| s.method == "POST"));

    // Keystone revokes the token: Ironic answers 401, the connector
    // re-authenticates and carries on with the new token.
    fake.revoke();
    eventually("a new token in use", || async {
        control
            .seen()
            .await
            .iter()
            .any(|s| {
                s.uri.starts_with("/baremetal/")
                    && s.headers.get("x-auth-token").map(String::as_str) == Some("tok-2")
            })
            .then_some(())
    })
    .await;
    let at = Utc::now();
    eventually("fresh observations after the refresh", || async {
        (observed_at(&env, &ids[0].0, "openstack").await > Some(at)).then_some(())
    })
    .await;
    assert_eq!(statuses(&env, &ids).await, want);
    assert_eq!(*fake.issued.lock().unwrap(), 2);

    // Ironic down: every openstack condition Unknown/IronicUnreachable; no
    // device failed or quarantined because of it; mirrors kept.
    control.fail(
        "/baremetal/",
        Fault::Status(503, "<html><body>503 Service Unavailable</body></html>"),
    );
    for (id, _) in &ids {
        eventually("IronicUnreachable", || async {
            let (s, r, _) = condition_row(&env, id, "IronicProvisionHealthy").await?;
            (s == "Unknown" && r == "IronicUnreachable").then_some(())
        })
        .await;
        for t in [
            "IronicMaintenance",
            "IronicAvailable",
            "InstanceAllocated",
            "CustomerReady",
            "InMaintenancePool",
        ] {
            let (s, r, m) = condition_row(&env, id, t).await.unwrap();
            assert_eq!(
                (s.as_str(), r.as_str()),
                ("Unknown", "IronicUnreachable"),
                "{t}"
            );
            assert!(m.contains("HTTP 503"), "{m}");
        }
    }
    eventually("all unknown", || async {
        (statuses(&env, &ids).await.iter().all(|s| s == "unknown")).then_some(())
    })
    .await;
    assert_eq!(
        env.device_field(failed, "ironic_provision_state").await,
        "deploy failed"
    );
    connector.assert_alive();

    hub.stop(connector, env).await;
}

/// A standalone Ironic without Keystone: customer-ready from the node's
/// traits, keys by node UUID; a malformed body and a timeout are outages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openstack_standalone_ironic_traits_uuid_keys_malformed_and_timeout() {
    let env = TestEnv::new().await;
    let reader = ObsReader::new(&env, "openstack").await;
    let (control, _fake) = openstack_fake(OpenstackFake::new(
        false,
        vec![
            node(
                "u1",
                "gpu-a",
                "available",
                None,
                None,
                None,
                &["HW_CPU_X86_AVX2", TRAIT],
            ),
            node(
                "u2",
                "gpu-b",
                "clean failed",
                None,
                None,
                Some(MAINT_PROJECT),
                &[],
            ),
            node("u3", "", "enroll", None, None, None, &[]),
        ],
        &[],
    ))
    .await;
    let mut config = openstack_config(OpenstackSiteConfig {
        ironic_url: format!("{}/baremetal", control.url()),
        placement_enabled: false,
        maintenance_project_id: MAINT_PROJECT.into(),
        ..Default::default()
    });
    config.key_by = "infrastructure_ref".into();
    let connector = run_openstack(&env, config);

    let a = reader.until("u1", |s| key_of(s) == "u1").await;
    assert_eq!(a.device.as_ref().unwrap().kind, "infrastructure_ref");
    let c = snap_cond(&a, "CustomerReady").unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "TraitPresent")
    );
    assert_eq!(snap_cond(&a, "IronicAvailable").unwrap().status, "True");
    let b = reader.until("u2", |s| key_of(s) == "u2").await;
    let h = snap_cond(&b, "IronicProvisionHealthy").unwrap();
    assert_eq!(
        (h.status.as_str(), h.reason.as_str()),
        ("False", "CleanFailed")
    );
    assert_eq!(snap_cond(&b, "InMaintenancePool").unwrap().status, "True");
    assert_eq!(
        snap_cond(&b, "CustomerReady").unwrap().reason,
        "TraitAbsent"
    );
    match &b.mirror {
        Some(Mirror::Ironic(m)) => assert_eq!(
            (m.provision_state.as_str(), m.lessee.as_str()),
            ("clean failed", MAINT_PROJECT)
        ),
        other => panic!("{other:?}"),
    }
    assert!(
        control
            .seen()
            .await
            .iter()
            .all(|s| !s.headers.contains_key("x-auth-token")),
        "noauth"
    );
    assert_eq!(
        control.count("/placement/").await,
        0,
        "standalone: no placement"
    );
    assert_eq!(control.count("/v3/").await, 0, "standalone: no keystone");

    let outages = Outages {
        http: &control,
        reader: &reader,
        connector: &connector,
    };
    for fault in [Fault::Malformed, Fault::Hang] {
        let fragment = fault.outage_fragment();
        let u2 = |s: &v1::ConditionSnapshot| -> Option<v1::Condition> {
            (key_of(s) == "u2").then(|| snap_cond(s, "IronicProvisionHealthy").cloned())?
        };
        let s = outages
            .cycle(
                "/baremetal/",
                fault,
                |s| {
                    u2(s).is_some_and(|c| {
                        c.reason == "IronicUnreachable" && c.message.contains(&fragment)
                    })
                },
                |s| u2(s).is_some_and(|c| c.status == "False"),
            )
            .await;
        assert_eq!(s.conditions.len(), 6);
        assert!(s
            .conditions
            .iter()
            .all(|c| c.status == "Unknown" && c.reason == "IronicUnreachable"));
        assert!(s.mirror.is_none(), "mirrors untouched");
    }
    connector.stop().await;
    env.cleanup().await;
}

/// Placement down while Ironic answers: only CustomerReady is Unknown; a
/// node Ironic stops listing is NoLongerObserved once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openstack_placement_outage_and_a_vanished_node() {
    let env = TestEnv::new().await;
    let reader = ObsReader::new(&env, "openstack").await;
    let (control, fake) = openstack_fake(OpenstackFake::new(
        true,
        vec![
            node(
                "u1",
                "gpu-a",
                "active",
                None,
                Some("i1"),
                Some("customer"),
                &[],
            ),
            node("u2", "gpu-b", "available", None, None, None, &[]),
        ],
        &["u1"],
    ))
    .await;
    let connector = run_openstack(&env, openstack_config(site_config(&control.url())));
    reader
        .until("gpu-a ready", |s| {
            key_of(s) == "gpu-a"
                && snap_cond(s, "CustomerReady").is_some_and(|c| c.status == "True")
        })
        .await;
    let resolved = reader
        .until("gpu-a bound to its resource provider", |s| {
            key_of(s) == "gpu-a" && !s.resource_bindings.is_empty()
        })
        .await;
    assert_eq!(
        (
            resolved.resource_bindings[0].resource.as_str(),
            resolved.resource_bindings[0].resource_id.as_str()
        ),
        ("placement", "u1")
    );
    control.fail("/placement/", Fault::Status(500, r#"{"errors": [{"status": 500, "title": "Internal Server Error", "detail": "database gone"}]}"#));
    let s = reader
        .until("CustomerReady unknown", |s| {
            key_of(s) == "gpu-a"
                && snap_cond(s, "CustomerReady").is_some_and(|c| c.reason == "PlacementUnreachable")
        })
        .await;
    assert!(snap_cond(&s, "CustomerReady")
        .unwrap()
        .message
        .contains("database gone"));
    // The binding fails with the same reason: the hub keeps its last-known
    // row, as stale.
    let b = &s.resource_bindings[0];
    assert_eq!(
        (
            b.resource.as_str(),
            b.resource_id.as_str(),
            b.reason.as_str()
        ),
        ("placement", "", "PlacementUnreachable")
    );
    assert_eq!(
        snap_cond(&s, "InstanceAllocated").unwrap().status,
        "True",
        "ironic was read"
    );
    assert_eq!(
        snap_cond(&s, "IronicProvisionHealthy").unwrap().status,
        "True"
    );
    assert!(matches!(s.mirror, Some(Mirror::Ironic(_))));
    control.heal();

    fake.nodes.lock().unwrap().retain(|n| n["uuid"] != "u2");
    let gone = reader
        .until("gpu-b no longer observed", |s| {
            key_of(s) == "gpu-b"
                && snap_cond(s, "IronicAvailable").is_some_and(|c| c.reason == "NoLongerObserved")
        })
        .await;
    assert!(gone.conditions.iter().all(|c| c.status == "Unknown"));
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert!(
        reader.drain().await.iter().all(|s| key_of(s) != "gpu-b"),
        "published once, then forgotten"
    );

    // Keystone refuses the password: an auth outage of the whole site.
    fake.lock_out();
    let s = reader
        .until("keystone auth outage", |s| {
            key_of(s) == "gpu-a"
                && snap_cond(s, "IronicProvisionHealthy")
                    .is_some_and(|c| c.reason == "IronicUnreachable")
        })
        .await;
    let m = &snap_cond(&s, "CustomerReady").unwrap().message;
    assert!(
        m.contains("/v3/auth/tokens refused the credentials (HTTP 401)")
            && m.contains("requires authentication"),
        "{m}"
    );
    assert!(!m.contains(PASSWORD));
    connector.assert_alive();
    connector.stop().await;
    env.cleanup().await;
}

/// Issue 19, "Matching across sources": Ironic nodes named `GPU-..` and
/// `gpu-...dc1.example.com` against NetBox's lower-case, unqualified names.
/// Without `poll.name_keys` they stay unresolved; with `lowercase` and
/// `strip_domain` both resolve to their devices (the real Ironic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ironic_names_are_folded_to_netbox_names_when_configured() {
    let ironic = fleet_testkit::ironic::RealIronic::connect().await;
    let env = TestEnv::new().await;
    let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
    let tag = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let upper = format!("gpu-up-{tag}");
    let fqdn = format!("gpu-fq-{tag}");
    let upper_uuid = ironic.available_node(&upper.to_uppercase()).await;
    let fqdn_uuid = ironic
        .available_node(&format!("{fqdn}.dc1.example.com"))
        .await;
    let a = env.create_device("s1", &upper).await;
    let b = env.create_device("s1", &fqdn).await;

    let mirrored = |id: String| {
        let env = &env;
        async move {
            env.device_field(&id, "coalesce(ironic_provision_state, '')")
                .await
        }
    };
    // Off (the default): both names are unresolved observations.
    let (trigger, task) = fleet_testkit::ironic::start_openstack_connector(&env, &ironic, 0.3);
    eventually("both nodes listed as unresolved", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM unresolved_observations WHERE source = 'openstack' AND (key ILIKE $1 OR key ILIKE $2)",
        )
        .bind(format!("%{upper}%"))
        .bind(format!("%{fqdn}%"))
        .fetch_one(&env.pool)
        .await
        .unwrap();
        (n == 2).then_some(())
    })
    .await;
    assert_eq!(mirrored(a.clone()).await, "");
    trigger.trigger();
    task.await.unwrap().unwrap();

    let (trigger, task) =
        fleet_testkit::ironic::start_openstack_connector_with(&env, &ironic, 0.3, |c, _| {
            c.poll.name_keys = fleet_connector::NameKeys {
                lowercase: true,
                strip_domain: true,
            };
        });
    for (id, uuid) in [(a, upper_uuid), (b, fqdn_uuid)] {
        eventually("the folded name resolves to its device", || async {
            (mirrored(id.clone()).await == "available").then_some(())
        })
        .await;
        // "Devices imported from NetBox get the Ironic node uuid as
        // infrastructure_ref once a unique match is seen."
        assert_eq!(
            env.device_field(&id, "coalesce(infrastructure_ref, '')")
                .await,
            uuid
        );
    }
    trigger.trigger();
    task.await.unwrap().unwrap();
    stop(hub_trigger, hub_task).await;
    ironic.cleanup().await;
    env.cleanup().await;
}
