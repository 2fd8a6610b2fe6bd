//! connector-health against the real Prometheus 2.42 that
//! `tests/peers/prometheus.sh start` runs on 127.0.0.1:9090,
//! scraping a textfile every second. The test appends its own series
//! (labelled with a unique `fleet_test`) to that textfile, reads them
//! through the connector and the hub, and removes them. It fails, with the
//! command to start Prometheus, when Prometheus is not reachable.
//! `PROMETHEUS_URL` and `PROMETHEUS_TEXTFILE` override the defaults.

use std::time::Duration;

use fleet_connector_health::SiteConfig as HealthSiteConfig;

use crate::support::*;

const START: &str =
    "bash tests/peers/prometheus.sh start (from the repository root; tests/run does it)";

fn prometheus_url() -> String {
    std::env::var("PROMETHEUS_URL").unwrap_or_else(|_| "http://127.0.0.1:9090".into())
}

fn textfile() -> String {
    std::env::var("PROMETHEUS_TEXTFILE")
        .unwrap_or_else(|_| "/tmp/peers/prometheus/textfile/metrics".into())
}

fn http() -> fleet_connector::HttpClient {
    fleet_connector::HttpClient::new(
        &fast_poll(),
        fleet_connector::ConnectorMetrics::new(),
        "health-status",
    )
    .unwrap()
}

/// The samples of an instant query on the real Prometheus.
async fn instant(url: &str, promql: &str) -> Result<Vec<serde_json::Value>, String> {
    let mut u =
        fleet_connector::paginate::base_url("PROMETHEUS_URL", &format!("{url}/api/v1/query"))
            .map_err(|e| e.to_string())?;
    u.query_pairs_mut().append_pair("query", promql);
    let v: serde_json::Value = http()
        .json(u.as_str(), |c| c.get(u.clone()))
        .await
        .map_err(|e| e.to_string())?;
    if v["status"] != "success" {
        return Err(format!("query failed: {v}"));
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

/// Fails with a clear message unless Prometheus answers and its textfile
/// is writable.
async fn require_prometheus(url: &str, file: &str) {
    if let Err(e) = instant(url, "up").await {
        panic!("Prometheus is not reachable at {url}: {e}. Start it with: {START}");
    }
    if let Err(e) = std::fs::metadata(file) {
        panic!("the Prometheus textfile {file} is not there ({e}): is the local Prometheus running? Start it with: {START}");
    }
}

/// Appended series, removed again when dropped (also when the test fails).
struct Series {
    file: String,
    marker: String,
}

impl Series {
    fn rewrite(file: &str, f: impl FnOnce(String) -> String) {
        let current =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {file}: {e}"));
        let tmp = format!("{file}.fleet-test-{}", std::process::id());
        std::fs::write(&tmp, f(current)).unwrap_or_else(|e| panic!("writing {tmp}: {e}"));
        // Atomic: a scrape never sees half a file.
        std::fs::rename(&tmp, file).unwrap_or_else(|e| panic!("replacing {file}: {e}"));
    }

    fn append(file: &str, marker: &str, lines: &[String]) -> Series {
        Series::rewrite(file, |mut s| {
            if !s.ends_with('\n') {
                s.push('\n');
            }
            for l in lines {
                s.push_str(l);
                s.push('\n');
            }
            s
        });
        Series {
            file: file.to_string(),
            marker: marker.to_string(),
        }
    }
}

impl Drop for Series {
    fn drop(&mut self) {
        let marker = self.marker.clone();
        Series::rewrite(&self.file, |s| {
            s.lines()
                .filter(|l| !l.contains(&marker))
                .map(|l| format!("{l}\n"))
                .collect()
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_connector_reads_the_real_prometheus() {
    let url = prometheus_url();
    let file = textfile();
    require_prometheus(&url, &file).await;

    let id = ulid::Ulid::new().to_string().to_lowercase();
    let marker = format!("fleet_test=\"{id}\"");
    let (a, b) = (format!("hr-{id}-a"), format!("hr-{id}-b"));
    let line = |metric: &str, host: &str, extra: &str, v: u8| {
        format!("{metric}{{host=\"{host}\",{marker}{extra}}} {v}")
    };
    let _series = Series::append(
        &file,
        &marker,
        &[
            line("chassis_health", &a, "", 2),
            line("chassis_health", &b, "", 1),
            line("redfish_fan_health", &a, ",fan=\"1\"", 0),
            line("redfish_fan_health", &a, ",fan=\"2\"", 2),
            line("nvidia_gpu_health", &b, "", 1),
        ],
    );
    let selector = format!("fleet_test=\"{id}\"");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let n = instant(&url, &format!("chassis_health{{{selector}}}"))
            .await
            .unwrap_or_default()
            .len();
        if n == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Prometheus at {url} did not scrape the test series from {file} within 30 s (is its textfile server on :9101 running? {START})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let env = TestEnv::new().await;
    let hub = HubTask::start(&env).await;
    let ida = env.create_device("s1", &a).await;
    let idb = env.create_device("s1", &b).await;
    let mut config = fleet_connector_health::Config::default();
    let c = &mut config;
    c.listen = "127.0.0.1:0".into();
    c.poll = fast_poll();
    c.poll.request_timeout = std::time::Duration::from_secs(5);
    c.sites.insert(
        "s1".into(),
        HealthSiteConfig {
            url: url.clone(),
            selector: selector.clone(),
            ..Default::default()
        },
    );
    let connector = Running::spawn(&env, config, fleet_connector_health::run);

    eventually("critical and degraded from the real Prometheus", || async {
        let sa = env.device_field(&ida, "health_status").await;
        let sb = env.device_field(&idb, "health_status").await;
        (sa == "critical" && sb == "degraded").then_some(())
    })
    .await;
    assert!(env
        .device_field(&ida, "no_schedule_reasons")
        .await
        .contains("health:critical"));
    assert!(!env
        .device_field(&idb, "no_schedule_reasons")
        .await
        .contains("health:critical"));
    assert_eq!(
        condition_row(&env, &ida, "ChassisHealth").await.unwrap(),
        (
            "False".into(),
            "RedfishHealthCritical".into(),
            format!("chassis_health{{host=\"{a}\",{selector}}} = 2 (Critical)")
        )
    );
    assert_eq!(
        condition_row(&env, &ida, "FanHealth").await.unwrap().2,
        format!("redfish_fan_health{{host=\"{a}\",{selector}}} = 2 (Critical), worst of 2 series")
    );
    assert_eq!(
        condition_row(&env, &idb, "GpuHealth").await.unwrap().1,
        "NvidiaGpuHealthDegraded"
    );
    assert_eq!(
        condition_row(&env, &idb, "MemoryHealth").await.unwrap().1,
        "RedfishTelemetryUnavailable"
    );
    connector.assert_alive();
    hub.stop(connector, env).await;
}
