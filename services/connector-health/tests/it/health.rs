//! connector-health against a fake Mimir (the Prometheus query API under
//! `/prometheus`, the tenant in `X-Scope-OrgID`), through the hub.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use fleet_connector_health::mapping::SERIES;
use fleet_connector_health::SiteConfig as HealthSiteConfig;
use fleet_proto::v1;
use fleet_proto::v1::condition_snapshot::Mirror;
use wiremock::{Request, ResponseTemplate};

use crate::support::*;

const TENANT: &str = "fleet-prod";

pub struct MimirFake {
    /// metric -> (host, value) samples.
    pub series: Mutex<BTreeMap<String, Vec<(String, String)>>>,
    /// Answer every query with a range result instead of a vector.
    pub matrix: Mutex<bool>,
}

impl MimirFake {
    pub fn new() -> Self {
        MimirFake {
            series: Mutex::new(BTreeMap::new()),
            matrix: Mutex::new(false),
        }
    }

    pub fn set(&self, metric: &str, host: &str, value: &str) {
        let mut s = self.series.lock().unwrap();
        let v = s.entry(metric.to_string()).or_default();
        v.retain(|(h, _)| h != host);
        v.push((host.to_string(), value.to_string()));
    }

    /// `/prometheus/api/v1/query?query=`.
    fn query(&self, r: &Request) -> ResponseTemplate {
        if header(r, "x-scope-orgid") != TENANT {
            // Mimir's own answer without a tenant.
            return ResponseTemplate::new(401).set_body_string("no org id\n");
        }
        let Some(promql) = param(r, "query") else {
            return json(
                400,
                serde_json::json!({"status": "error", "errorType": "bad_data", "error": "query is missing"}),
            );
        };
        if *self.matrix.lock().unwrap() {
            return json(
                200,
                serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": []}}),
            );
        }
        let metric = promql.split('{').next().unwrap_or_default();
        let result: Vec<serde_json::Value> = self
            .series
            .lock()
            .unwrap()
            .get(metric)
            .into_iter()
            .flatten()
            .map(|(host, value)| {
                serde_json::json!({
                    "metric": {"__name__": metric, "host": host, "job": "redfish-exporter", "instance": "10.0.0.9:9610"},
                    "value": [1795966954.619, value]
                })
            })
            .collect();
        json(
            200,
            serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}}),
        )
    }
}

pub async fn mimir_fake(fake: MimirFake) -> (FakeHttp, Arc<MimirFake>) {
    let fake = Arc::new(fake);
    let http = FakeHttp::start().await;
    http.route(
        "GET",
        "^/prometheus/api/v1/query$",
        with(&fake, MimirFake::query),
    )
    .await;
    (http, fake)
}

fn health_config(url: &str, tenant: &str) -> fleet_connector_health::Config {
    let mut config = fleet_connector_health::Config::default();
    let c = &mut config;
    c.listen = "127.0.0.1:0".into();
    c.poll = fast_poll();
    c.sites.insert(
        "s1".into(),
        HealthSiteConfig {
            url: format!("{url}/prometheus"),
            tenant: tenant.into(),
            ..Default::default()
        },
    );
    config
}

fn run_health(env: &TestEnv, config: fleet_connector_health::Config) -> Running {
    Running::spawn(env, config, fleet_connector_health::run)
}

/// [`run_health`] with the ops server on a free port (returned, for
/// `/metrics`).
fn run_health_on_a_port(
    env: &TestEnv,
    mut config: fleet_connector_health::Config,
) -> (Running, u16) {
    let port = free_port();
    config.listen = format!("127.0.0.1:{port}");
    (run_health(env, config), port)
}

async fn health_of(env: &TestEnv, id: &str) -> (String, String) {
    (
        env.device_field(id, "health_status").await,
        env.device_field(id, "no_schedule_reasons").await,
    )
}

/// critical, warning and ok chassis through the hub; every host carries
/// the ten rows; one query per series for all hosts; a Mimir outage makes
/// the rows Unknown and health unknown, never critical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_through_the_hub_critical_degraded_healthy_and_mimir_down_is_unknown() {
    let env = TestEnv::new().await;
    let hub = HubTask::start(&env).await;
    let hosts = ["gpu-a1-01", "gpu-a1-02", "gpu-a1-03"];
    let mut ids = vec![];
    for h in hosts {
        ids.push(env.create_device("s1", h).await);
    }
    let fake = MimirFake::new();
    for (host, chassis) in hosts.iter().zip(["2", "1", "0"]) {
        fake.set("chassis_health", host, chassis);
        for s in &SERIES[1..] {
            fake.set(s.metric, host, "0");
        }
    }
    // gpu-a1-02's warning is explained by a degraded GPU.
    fake.set("nvidia_gpu_health", "gpu-a1-02", "1");
    let (control, fake) = mimir_fake(fake).await;
    let url = control.url();
    let connector = run_health(&env, health_config(&url, TENANT));

    eventually("health statuses", || async {
        let mut got = vec![];
        for id in &ids {
            got.push(env.device_field(id, "health_status").await);
        }
        (got == ["critical", "degraded", "healthy"]).then_some(())
    })
    .await;
    let (_, reasons) = health_of(&env, &ids[0]).await;
    assert!(reasons.contains("health:critical"), "{reasons}");
    for id in &ids[1..] {
        let (_, reasons) = health_of(&env, id).await;
        assert!(!reasons.contains("health:critical"), "{reasons}");
    }
    assert_eq!(
        condition_row(&env, &ids[0], "ChassisHealth").await.unwrap(),
        (
            "False".into(),
            "RedfishHealthCritical".into(),
            r#"chassis_health{host="gpu-a1-01"} = 2 (Critical)"#.into()
        )
    );
    assert_eq!(
        condition_row(&env, &ids[1], "GpuHealth").await.unwrap(),
        (
            "False".into(),
            "NvidiaGpuHealthDegraded".into(),
            r#"nvidia_gpu_health{host="gpu-a1-02"} = 1 (Warning)"#.into()
        )
    );
    for id in &ids {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT type, source, message FROM device_conditions WHERE device_id = $1 AND condition_of = 'health' ORDER BY type",
        )
        .bind(id)
        .fetch_all(&env.pool)
        .await
        .unwrap();
        assert_eq!(rows.len(), 10, "ten health rows: {rows:?}");
        for (t, source, message) in rows {
            assert_eq!(source, "health-status");
            let metric = SERIES
                .iter()
                .find(|s| s.condition.as_str() == t)
                .unwrap()
                .metric;
            assert!(
                message.starts_with(&format!("{metric}{{host=")),
                "{message}"
            );
        }
    }
    // One query per series for the whole site, each with the tenant.
    let seen = control.seen().await;
    let queries: BTreeSet<String> = seen
        .iter()
        .filter(|s| s.uri.starts_with("/prometheus/api/v1/query"))
        .map(|s| {
            assert_eq!(s.headers["x-scope-orgid"], TENANT);
            let q = s.uri.split_once("query=").unwrap().1.to_string();
            assert!(!q.contains("host"), "never a query per host: {q}");
            q
        })
        .collect();
    let metrics: BTreeSet<String> = SERIES.iter().map(|s| s.metric.to_string()).collect();
    assert_eq!(queries, metrics);

    // Mimir down: Unknown MimirUnreachable, health unknown, never critical.
    control.fail("/prometheus/", Fault::Status(503, "upstream connect error"));
    for id in &ids {
        eventually("MimirUnreachable", || async {
            let (s, r, m) = condition_row(&env, id, "ChassisHealth").await?;
            (s == "Unknown" && r == "MimirUnreachable").then_some(m)
        })
        .await;
    }
    let (_, _, m) = condition_row(&env, &ids[0], "ChassisHealth").await.unwrap();
    assert!(
        m.starts_with(r#"chassis_health{host="gpu-a1-01"}: "#) && m.contains("HTTP 503"),
        "{m}"
    );
    let (_, _, m) = condition_row(&env, &ids[0], "FpgaHealth").await.unwrap();
    assert!(
        m.starts_with(r#"nvidia_fpga_health{host="gpu-a1-01"}: "#),
        "{m}"
    );
    for id in &ids {
        eventually("health unknown", || async {
            (env.device_field(id, "health_status").await == "unknown").then_some(())
        })
        .await;
        let (_, reasons) = health_of(&env, id).await;
        assert!(!reasons.contains("health:critical"), "{reasons}");
    }
    connector.assert_alive();

    // Back, and a host that leaves every series is unavailable, once.
    fake.series
        .lock()
        .unwrap()
        .values_mut()
        .for_each(|v| v.retain(|(h, _)| h != "gpu-a1-03"));
    control.heal();
    eventually("critical again", || async {
        (env.device_field(&ids[0], "health_status").await == "critical").then_some(())
    })
    .await;
    eventually("gpu-a1-03 telemetry unavailable", || async {
        let (s, r, _) = condition_row(&env, &ids[2], "ChassisHealth").await?;
        (s == "Unknown" && r == "RedfishTelemetryUnavailable").then_some(())
    })
    .await;
    assert_eq!(env.device_field(&ids[2], "health_status").await, "unknown");

    hub.stop(connector, env).await;
}

/// Without the tenant Mimir refuses (an auth outage); timeouts, malformed
/// bodies, range answers and 5xx are outages too, never crashes: each
/// publishes the ten rows Unknown with the composite emptied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_outages_of_every_kind_publish_unknown_with_the_composite_emptied() {
    let env = TestEnv::new().await;
    let reader = ObsReader::new(&env, "health-status").await;
    let fake = MimirFake::new();
    fake.set("chassis_health", "gpu01", "2");
    let (control, fake) = mimir_fake(fake).await;
    let url = control.url();
    let (connector, port) = run_health_on_a_port(&env, health_config(&url, TENANT));

    let s = reader
        .until("gpu01 critical", |s| {
            key_of(s) == "gpu01"
                && snap_cond(s, "ChassisHealth")
                    .is_some_and(|c| c.reason == "RedfishHealthCritical")
        })
        .await;
    assert_eq!(s.conditions.len(), 10);
    assert_eq!(
        s.mirror,
        Some(Mirror::Health(v1::HealthMirror {
            chassis_health: "Critical".into()
        }))
    );
    assert_eq!(
        snap_cond(&s, "PowerSupplyHealth").unwrap().reason,
        "RedfishTelemetryUnavailable"
    );

    let unreachable = |fragment: String| {
        move |s: &v1::ConditionSnapshot| {
            snap_cond(s, "ChassisHealth")
                .is_some_and(|c| c.reason == "MimirUnreachable" && c.message.contains(&fragment))
        }
    };
    let assert_outage = |s: &v1::ConditionSnapshot| {
        assert_eq!(s.conditions.len(), 10);
        assert!(s
            .conditions
            .iter()
            .all(|c| c.status == "Unknown" && c.reason == "MimirUnreachable"));
        assert_eq!(
            s.mirror,
            Some(Mirror::Health(v1::HealthMirror::default())),
            "the composite is emptied, so health reads unknown"
        );
    };
    let chassis_read = |s: &v1::ConditionSnapshot| {
        snap_cond(s, "ChassisHealth").is_some_and(|c| c.status == "False")
    };
    let outages = Outages {
        http: &control,
        reader: &reader,
        connector: &connector,
    };
    for fault in [
        Fault::Hang,
        Fault::Malformed,
        Fault::Status(502, "<html>Bad Gateway</html>"),
    ] {
        let fragment = fault.outage_fragment();
        let s = outages
            .cycle("/prometheus/", fault, unreachable(fragment), chassis_read)
            .await;
        assert_outage(&s);
    }
    *fake.matrix.lock().unwrap() = true;
    let s = reader
        .until(
            "a range answer",
            unreachable("resultType \"matrix\"".into()),
        )
        .await;
    assert_outage(&s);
    *fake.matrix.lock().unwrap() = false;
    reader.until("readable again", chassis_read).await;
    let m = metrics(port).await;
    for kind in ["timeout", "malformed", "http_5xx", "protocol"] {
        let line = format!(
            r#"fleet_connector_errors_total{{source="health-status",site="s1",kind="{kind}"}}"#
        );
        assert!(m.contains(&line), "metrics lack {line}:\n{m}");
    }
    assert!(m.contains(
        r#"fleet_connector_published_total{source="health-status",site="s1",kind="outage"}"#
    ));
    connector.stop().await;
    // What it published after the read above is not the next one's.
    reader.drain().await;

    // The wrong tenant: Mimir's 401 is an auth outage.
    let (connector, port) = run_health_on_a_port(&env, health_config(&url, "someone-else"));
    // A restarted connector knows no hosts until a good read: it publishes
    // nothing that pretends to know.
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    assert!(reader.drain().await.is_empty());
    let m = metrics(port).await;
    assert!(
        m.contains(r#"fleet_connector_errors_total{source="health-status",site="s1",kind="auth"}"#),
        "{m}"
    );
    connector.assert_alive();
    connector.stop().await;
    env.cleanup().await;
}
