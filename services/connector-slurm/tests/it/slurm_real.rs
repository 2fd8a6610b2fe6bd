//! connector-slurm against the real slurmrestd (SLURM 22.05) that
//! `tests/peers/slurm.sh start` runs on 127.0.0.1:6820. This test
//! fails, with the command to start it, when slurmrestd is not reachable.
//! `SLURM_REST_URL` and `SLURM_JWT_FILE` override the defaults.

use fleet_connector_slurm::SiteConfig as SlurmSiteConfig;
use fleet_runtime::config::Credential;

use crate::slurm::slurm_config;
use crate::support::*;

const START: &str = "bash tests/peers/slurm.sh start (from the repository root; tests/run does it)";

fn rest_url() -> String {
    std::env::var("SLURM_REST_URL").unwrap_or_else(|_| "http://127.0.0.1:6820".into())
}

fn jwt_file() -> String {
    std::env::var("SLURM_JWT_FILE").unwrap_or_else(|_| "/tmp/peers/slurm/jwt.token".into())
}

/// Fails with a clear message unless slurmrestd answers a ping with the
/// JWT; returns the token.
async fn require_slurmrestd(url: &str, file: &str) -> String {
    let token = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("the slurmrestd JWT is not readable at {file} ({e}): is the local SLURM running? Start it with: {START}"))
        .trim()
        .to_string();
    let http = fleet_connector::HttpClient::new(
        &fast_poll(),
        fleet_connector::ConnectorMetrics::new(),
        "slurm",
    )
    .unwrap();
    let ping = format!("{url}/slurm/v0.0.38/ping");
    let r: Result<serde_json::Value, _> = http
        .json(&ping, |c| {
            c.get(&ping)
                .header("X-SLURM-USER-NAME", "root")
                .header("X-SLURM-USER-TOKEN", &token)
        })
        .await;
    match r {
        Ok(v) if v["pings"][0]["ping"] == "UP" => token,
        Ok(v) => panic!(
            "slurmrestd at {url} answers but slurmctld is not UP: {v}. Restart it with: {START}"
        ),
        Err(e) => panic!("slurmrestd is not reachable at {url}: {e}. Start it with: {START}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_connector_reads_the_real_slurmrestd() {
    let url = rest_url();
    let file = jwt_file();
    require_slurmrestd(&url, &file).await;

    let env = TestEnv::new().await;
    let hub = HubTask::start(&env).await;
    let gpu01 = env.create_device("s1", "gpu01").await;
    let gpu02 = env.create_device("s1", "gpu02").await;
    let site = SlurmSiteConfig {
        // Detected: 22.05 lists v0.0.36 to v0.0.38 in /openapi/v3.
        api_version: String::new(),
        user_name: "root".into(),
        token: Credential {
            file: file.clone(),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut config = slurm_config(&url, site);
    config.poll.request_timeout = std::time::Duration::from_secs(5);
    let connector = Running::spawn(&env, config, fleet_connector_slurm::run);

    for id in [&gpu01, &gpu02] {
        let (status, reason, _) =
            eventually("SlurmRegistered from the real slurmrestd", || async {
                condition_row(&env, id, "SlurmRegistered").await
            })
            .await;
        assert_eq!((status.as_str(), reason.as_str()), ("True", "NodeListed"));
        let healthy = condition_row(&env, id, "SlurmNodeHealthy").await.unwrap();
        assert_ne!(
            healthy.0, "Unknown",
            "a registered node has a modelled state: {healthy:?}"
        );
        let states: Vec<String> =
            sqlx::query_scalar("SELECT slurm_states FROM devices WHERE id = $1")
                .bind(id)
                .fetch_one(&env.pool)
                .await
                .unwrap();
        assert!(!states.is_empty(), "normalised tokens mirrored");
        assert!(
            states.iter().all(|s| s == &s.to_ascii_uppercase()),
            "{states:?}"
        );
    }
    // The cluster's other nodes are unknown to inventory: kept, not dropped.
    let unresolved: i64 = eventually("unresolved slurm nodes", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM unresolved_observations WHERE source = 'slurm' AND site = 's1' AND key_kind = 'name'",
        )
        .fetch_one(&env.pool)
        .await
        .unwrap();
        (n >= 1).then_some(n)
    })
    .await;
    assert!(unresolved >= 1);
    connector.assert_alive();
    hub.stop(connector, env).await;
}
