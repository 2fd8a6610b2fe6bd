//! connector-slurm against a fake slurmrestd speaking v0.0.38 (22.05) and
//! v0.0.40 JSON.

use std::sync::{Arc, Mutex};

use chrono::Utc;
use fleet_connector_slurm::SiteConfig as SlurmSiteConfig;
use fleet_proto::v1::condition_snapshot::Mirror;
use fleet_runtime::config::Credential;
use wiremock::{Request, ResponseTemplate};

use crate::support::*;

const NODES_38: &str = include_str!("../../testdata/slurm-nodes.json");
const TOKEN: &str = "eyJhbGciOiJIUzI1NiJ9.fake.jwt";

pub struct SlurmFake {
    /// `v0.0.<version>` is the only version served.
    version: u32,
    /// Whether `/openapi/v3` is served (22.05 serves it).
    openapi: bool,
    /// `None`: no JWT required.
    token: Option<&'static str>,
    pub nodes: Mutex<serde_json::Value>,
}

fn meta(version: u32) -> serde_json::Value {
    serde_json::json!({"plugin": {"type": format!("openapi/v0.0.{version}"), "name": format!("Slurm OpenAPI v0.0.{version}")},
        "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"}})
}

fn not_found() -> ResponseTemplate {
    // slurmrestd's own 404 is plain text.
    ResponseTemplate::new(404)
        .set_body_string("Unable find requested URL. Please view /openapi/v3 for API reference.")
}

impl SlurmFake {
    /// `Err` is the answer to a request this slurmrestd refuses: another
    /// version than it serves, or without the JWT it requires.
    fn admit(&self, r: &Request, version: Option<&str>) -> Result<(), ResponseTemplate> {
        if version.is_some_and(|v| v != format!("v0.0.{}", self.version)) {
            return Err(not_found());
        }
        let authorised = match self.token {
            None => true,
            Some(t) => {
                header(r, "x-slurm-user-name") == "root" && header(r, "x-slurm-user-token") == t
            }
        };
        if !authorised {
            let body = serde_json::json!({"errors": [{"error": "Authentication failure"}]});
            return Err(json(401, body));
        }
        Ok(())
    }

    fn openapi(&self, r: &Request) -> ResponseTemplate {
        if !self.openapi {
            return not_found();
        }
        if let Err(refused) = self.admit(r, None) {
            return refused;
        }
        let mut paths = serde_json::Map::new();
        for v in 36..=self.version {
            paths.insert(format!("/slurm/v0.0.{v}/nodes"), serde_json::json!({}));
            paths.insert(format!("/slurm/v0.0.{v}/ping"), serde_json::json!({}));
        }
        json(200, serde_json::json!({"openapi": "3.0.2", "paths": paths}))
    }

    /// `/slurm/{version}/ping` and `/slurm/{version}/nodes`.
    fn slurm(&self, r: &Request) -> ResponseTemplate {
        let mut parts = r.url.path().trim_start_matches("/slurm/").split('/');
        let (version, what) = (parts.next(), parts.next());
        if let Err(refused) = self.admit(r, version) {
            return refused;
        }
        let meta = meta(self.version);
        match what {
            Some("ping") => json(
                200,
                serde_json::json!({"meta": meta, "errors": [], "pings": [{"hostname": "vm", "ping": "UP", "status": 0, "mode": "primary"}]}),
            ),
            _ => {
                let nodes = self.nodes.lock().unwrap().clone();
                json(
                    200,
                    serde_json::json!({"meta": meta, "errors": [], "warnings": [], "nodes": nodes}),
                )
            }
        }
    }
}

pub async fn slurm_fake(fake: SlurmFake) -> (FakeHttp, Arc<SlurmFake>) {
    let fake = Arc::new(fake);
    let http = FakeHttp::start().await;
    http.route("GET", "^/openapi/v3$", with(&fake, SlurmFake::openapi))
        .await;
    http.route(
        "GET",
        "^/slurm/[^/]+/(ping|nodes)$",
        with(&fake, SlurmFake::slurm),
    )
    .await;
    (http, fake)
}

pub fn slurm_config(url: &str, site: SlurmSiteConfig) -> fleet_connector_slurm::Config {
    let mut config = fleet_connector_slurm::Config::default();
    let c = &mut config;
    c.listen = "127.0.0.1:0".into();
    c.poll = fast_poll();
    c.sites.insert(
        "s1".into(),
        SlurmSiteConfig {
            url: url.into(),
            ..site
        },
    );
    config
}

fn run_slurm(env: &TestEnv, config: fleet_connector_slurm::Config) -> Running {
    Running::spawn(env, config, fleet_connector_slurm::run)
}

async fn status_of(env: &TestEnv, id: &str) -> String {
    env.device_field(id, "operational_status").await
}

async fn slurm_states(env: &TestEnv, id: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT slurm_states FROM devices WHERE id = $1")
        .bind(id)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

async fn expect_statuses(env: &TestEnv, ids: &[String], want: [&str; 3]) {
    eventually(&format!("operational statuses {want:?}"), || async {
        let mut got = vec![];
        for id in ids {
            got.push(status_of(env, id).await);
        }
        (got == want).then_some(())
    })
    .await
}

/// Three devices in the maintenance pool, so SLURM decides between
/// validation and quarantine (rules 5 to 7); gpu01 idle, gpu02 drained,
/// gpu03 down in the 22.05 sample.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_through_the_hub_outage_keeps_mirrors_and_vanished_nodes_clear_them() {
    let env = TestEnv::new().await;
    let hub = RunningHub::start(&env).await;
    let names = ["gpu01", "gpu02", "gpu03"];
    let mut ids = vec![];
    for n in names {
        let id = env.create_device("s1", n).await;
        env.publish_snapshot(&openstack_as(
            "s1",
            n,
            micros(Utc::now()),
            Node::MaintenancePool,
        ))
        .await;
        ids.push(id);
    }
    let sample: serde_json::Value = serde_json::from_str(NODES_38).unwrap();
    let (control, fake) = slurm_fake(SlurmFake {
        version: 38,
        openapi: true,
        token: Some(TOKEN),
        nodes: Mutex::new(sample["nodes"].clone()),
    })
    .await;
    let url = control.url();
    let token_file = std::env::temp_dir().join(format!("fleet-slurm-jwt-{}", env.db_name));
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let connector = run_slurm(
        &env,
        slurm_config(
            &url,
            SlurmSiteConfig {
                user_name: "root".into(),
                token: Credential {
                    file: token_file.display().to_string(),
                    ..Default::default()
                },
                ..Default::default()
            },
        ),
    );

    expect_statuses(&env, &ids, ["validation", "quarantine", "quarantine"]).await;
    assert_eq!(slurm_states(&env, &ids[1]).await, vec!["IDLE", "DRAIN"]);
    assert_eq!(
        condition_row(&env, &ids[1], "SlurmNodeHealthy")
            .await
            .unwrap(),
        (
            "False".into(),
            "Drain".into(),
            "IDLE+DRAIN: gpu xid 79".into()
        )
    );
    assert_eq!(
        condition_row(&env, &ids[2], "SlurmNodeHealthy")
            .await
            .unwrap()
            .1,
        "Down"
    );
    // Detected from /openapi/v3, JWT headers on every request.
    assert!(control.count("/openapi/v3").await >= 1);
    let reads: Vec<Seen> = control
        .seen()
        .await
        .into_iter()
        .filter(|s| s.uri == "/slurm/v0.0.38/nodes")
        .collect();
    assert!(!reads.is_empty());
    for r in &reads {
        assert_eq!(r.headers["x-slurm-user-name"], "root");
        assert_eq!(r.headers["x-slurm-user-token"], TOKEN);
    }
    assert_eq!(
        control.count("/slurm/v0.0.40").await,
        0,
        "the openapi answer was used, not probing"
    );

    // slurmrestd fails: SchedulerUnreachable, mirrors kept, and the
    // scheduler outage moves nobody to quarantine or failed (rule 6).
    control.fail(
        "/slurm/",
        Fault::Status(
            500,
            r#"{"errors": [{"error": "Unable to contact slurm controller (connect failure)"}]}"#,
        ),
    );
    for id in &ids {
        eventually("SchedulerUnreachable", || async {
            let (status, reason, message) = condition_row(&env, id, "SlurmRegistered").await?;
            (status == "Unknown" && reason == "SchedulerUnreachable").then_some(message)
        })
        .await;
        let (s, r, m) = condition_row(&env, id, "SlurmNodeHealthy").await.unwrap();
        assert_eq!(
            (s.as_str(), r.as_str()),
            ("Unknown", "SchedulerUnreachable")
        );
        assert!(
            m.contains("HTTP 500") && m.contains("slurm controller"),
            "{m}"
        );
    }
    expect_statuses(&env, &ids, ["validation", "validation", "validation"]).await;
    assert_eq!(
        slurm_states(&env, &ids[1]).await,
        vec!["IDLE", "DRAIN"],
        "mode keep"
    );
    connector.assert_alive();

    // Back, without gpu03: NoLongerObserved clears its mirror and, with
    // SlurmRegistered False, it is quarantined (rule 5).
    fake.nodes
        .lock()
        .unwrap()
        .as_array_mut()
        .unwrap()
        .retain(|n| n["name"] != "gpu03");
    control.heal();
    expect_statuses(&env, &ids, ["validation", "quarantine", "quarantine"]).await;
    assert_eq!(
        condition_row(&env, &ids[2], "SlurmRegistered")
            .await
            .unwrap(),
        (
            "False".into(),
            "NoLongerObserved".into(),
            "slurmrestd no longer lists the node".into()
        )
    );
    assert!(slurm_states(&env, &ids[2]).await.is_empty(), "mode clear");
    assert_eq!(slurm_states(&env, &ids[1]).await, vec!["IDLE", "DRAIN"]);

    // A token slurmrestd refuses is an auth outage; the token file is read
    // at every poll, so writing the right token back heals it.
    std::fs::write(&token_file, "not-the-token\n").unwrap();
    eventually("auth outage", || async {
        let (s, r, m) = condition_row(&env, &ids[0], "SlurmRegistered").await?;
        (s == "Unknown"
            && r == "SchedulerUnreachable"
            && m.contains("refused the credentials (HTTP 401)"))
        .then_some(())
    })
    .await;
    expect_statuses(&env, &ids, ["validation", "validation", "quarantine"]).await;
    std::fs::write(&token_file, TOKEN).unwrap();
    eventually("token accepted again", || async {
        let (s, _, _) = condition_row(&env, &ids[0], "SlurmRegistered").await?;
        (s == "True").then_some(())
    })
    .await;
    connector.assert_alive();

    connector.stop().await;
    let _ = std::fs::remove_file(token_file);
    hub.stop(env).await;
}

/// v0.0.40: `state` is a token list, no `/openapi/v3`, the version found by
/// probing ping; timeouts, malformed bodies and 5xx are outages, never
/// crashes, and are counted by kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_v0_0_40_probing_timeouts_malformed_bodies_and_5xx_are_outages() {
    let env = TestEnv::new().await;
    let reader = ObsReader::new(&env, "slurm").await;
    let (control, _fake) = slurm_fake(SlurmFake {
        version: 40,
        openapi: false,
        token: None,
        nodes: Mutex::new(serde_json::json!([
            {"name": "gpu01", "state": ["IDLE", "DRAIN"], "reason": "xid 79"},
            {"name": "gpu02", "state": ["MIXED", "BLOCKED_BY_SOMETHING_NEW"], "reason": ""},
            {"name": "", "state": ["IDLE"]}
        ])),
    })
    .await;
    let url = control.url();
    let port = free_port();
    let mut config = slurm_config(&url, SlurmSiteConfig::default());
    config.listen = format!("127.0.0.1:{port}");
    let connector = run_slurm(&env, config);

    let s = reader
        .until("gpu01 drained", |s| {
            key_of(s) == "gpu01"
                && snap_cond(s, "SlurmNodeHealthy").is_some_and(|c| c.reason == "Drain")
        })
        .await;
    match &s.mirror {
        Some(Mirror::Slurm(m)) => {
            assert_eq!(m.states, vec!["IDLE", "DRAIN"]);
            assert_eq!(m.mode, "observed");
        }
        other => panic!("{other:?}"),
    }
    let s = reader.until("gpu02", |s| key_of(s) == "gpu02").await;
    match &s.mirror {
        Some(Mirror::Slurm(m)) => {
            assert_eq!(m.states, vec!["MIXED"], "the unmodelled token is dropped")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(snap_cond(&s, "SlurmNodeHealthy").unwrap().status, "True");
    let probes: Vec<String> = control
        .seen()
        .await
        .into_iter()
        .map(|s| s.uri)
        .filter(|u| u.ends_with("/ping") || u.starts_with("/openapi"))
        .collect();
    assert_eq!(
        probes[..4],
        [
            "/openapi/v3",
            "/slurm/v0.0.42/ping",
            "/slurm/v0.0.41/ping",
            "/slurm/v0.0.40/ping"
        ],
        "probed newest first"
    );

    let outages = Outages {
        http: &control,
        reader: &reader,
        connector: &connector,
    };
    for fault in [
        Fault::Hang,
        Fault::Malformed,
        Fault::Status(503, "<html>Service Unavailable</html>"),
    ] {
        let fragment = fault.outage_fragment();
        let s = outages
            .cycle(
                "/slurm/v0.0.40/nodes",
                fault,
                |s| {
                    snap_cond(s, "SlurmRegistered").is_some_and(|c| {
                        c.reason == "SchedulerUnreachable" && c.message.contains(&fragment)
                    })
                },
                |s| {
                    key_of(s) == "gpu01"
                        && snap_cond(s, "SlurmRegistered").is_some_and(|c| c.status == "True")
                },
            )
            .await;
        assert_eq!(s.conditions.len(), 2);
        assert!(s.conditions.iter().all(|c| c.status == "Unknown"));
        match &s.mirror {
            Some(Mirror::Slurm(m)) => assert_eq!(m.mode, "keep"),
            other => panic!("{other:?}"),
        }
    }
    let m = metrics(port).await;
    assert_metrics(
        &m,
        &[
            r#"fleet_connector_errors_total{source="slurm",site="s1",kind="timeout"}"#,
            r#"fleet_connector_errors_total{source="slurm",site="s1",kind="malformed"}"#,
            r#"fleet_connector_errors_total{source="slurm",site="s1",kind="http_5xx"}"#,
            r#"fleet_connector_request_retries_total{source="slurm",kind="timeout"}"#,
            r#"fleet_connector_devices_seen{source="slurm",site="s1"} 2"#,
            r#"fleet_connector_mapping_warnings_total{source="slurm",kind="unmodelled_token"}"#,
            r#"fleet_connector_poll_duration_seconds_count{source="slurm",site="s1",outcome="outage"}"#,
            r#"fleet_connector_published_total{source="slurm",site="s1",kind="outage"}"#,
            r#"fleet_connector_publish_latency_seconds_count{source="slurm"}"#,
        ],
    );
    connector.stop().await;
    env.cleanup().await;
}

/// An unreachable slurmrestd at start: nothing was seen, so nothing is
/// published, and the connector keeps polling until it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_connection_refused_at_start_publishes_nothing_and_keeps_polling() {
    let env = TestEnv::new().await;
    let reader = ObsReader::new(&env, "slurm").await;
    let port = free_port();
    let connector = run_slurm(
        &env,
        slurm_config(
            &format!("http://127.0.0.1:{port}"),
            SlurmSiteConfig {
                api_version: "v0.0.38".into(),
                ..Default::default()
            },
        ),
    );
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    assert!(reader.drain().await.is_empty());
    connector.assert_alive();
    connector.stop().await;
    env.cleanup().await;
}
