//! connector-slurm against the real slurmrestd (SLURM 22.05) that
//! `tests/peers/slurm.sh start` runs on 127.0.0.1:6820. This test
//! fails, with the command to start it, when slurmrestd is not reachable
//! (`fleet_testkit::slurm::RealSlurm`).

use fleet_testkit::slurm::RealSlurm;

use crate::slurm::slurm_config;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_connector_reads_the_real_slurmrestd() {
    let slurm = RealSlurm::connect().await;

    let env = TestEnv::new().await;
    let hub = HubTask::start(&env).await;
    let gpu01 = env.create_device("s1", "gpu01").await;
    let gpu02 = env.create_device("s1", "gpu02").await;
    // The version detected: 22.05 lists v0.0.36 to v0.0.38 in /openapi/v3.
    let site = slurm.site_config();
    let mut config = slurm_config(&slurm.url, site);
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
