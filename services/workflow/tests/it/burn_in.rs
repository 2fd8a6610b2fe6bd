//! Burn-in (`single_node_test`, `multi_node_test`) against the real SLURM
//! 22.05 (`tests/peers/slurm.sh`, slurmrestd v0.0.38): each test's node
//! carries a feature naming it (`Feature=gpu04`), so a device's job runs on
//! its own node. The tests use `gpu04`..`gpu06`, which nothing else submits
//! to.

use std::time::Duration;

use fleet_proto::v1;

use crate::support::*;

const WITHIN: Duration = Duration::from_secs(120);

/// A hub and a workflow service whose `s1` reaches the real slurmrestd and
/// runs `script` as both stages' test.
struct BurnIn {
    env: TestEnv,
    slurm: fleet_slurm::Slurmrestd,
    stops: Services,
}

impl BurnIn {
    async fn start(script: &str) -> BurnIn {
        // Built first: it installs the TLS crypto provider every client needs.
        let http = fleet_connector::HttpClient::new(
            &fleet_connector::PollConfig::default(),
            fleet_connector::ConnectorMetrics::new(),
            "test",
        )
        .unwrap();
        let real = fleet_testkit::slurm::RealSlurm::connect().await;
        let env = TestEnv::new().await;
        let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
        let mut site = fleet_workflow::SiteConfig {
            slurm: real.site_config(),
            ..Default::default()
        };
        for t in [
            &mut site.burn_in.single_node_test,
            &mut site.burn_in.multi_node_test,
        ] {
            t.script = script.into();
            t.time_limit = Duration::from_secs(300);
        }
        let (_w, trigger, task) = start_workflow(&env, |c| {
            c.sites.insert("s1".into(), site);
        })
        .await;
        let slurm =
            fleet_slurm::Slurmrestd::new("s1", "test.slurm", &real.site_config(), http).unwrap();
        BurnIn {
            env,
            slurm,
            stops: vec![(trigger, task), (hub_trigger, hub_task)].into(),
        }
    }

    async fn device(&self, node: &str) -> String {
        device_for(&self.env, "s1", node, &unique(node)).await
    }

    /// A `workflow` job over `device`, once it ends.
    async fn run(&self, workflow: &str, device: &str) -> v1::Job {
        run_job(&self.env, workflow, &[device], WITHIN).await
    }

    /// The SLURM job the run submitted, from its step results.
    async fn slurm_job(&self, job: &str) -> (u64, v1::JobDevice) {
        let c = workflow_client(&self.env);
        eventually("the burn-in's SLURM job", || async {
            let j = c.get_job(job).await.ok()?;
            let d = j.devices.first()?.clone();
            let id = d
                .results
                .iter()
                .find_map(|r| r.target.strip_prefix("slurm:job/")?.parse().ok())?;
            Some((id, d))
        })
        .await
    }

    /// SLURM job `id`'s state once it is `want`, or after `tries` reads
    /// 100 ms apart.
    async fn slurm_state(&mut self, id: u64, want: &str, tries: u32) -> Vec<String> {
        let mut state = vec![];
        for _ in 0..tries {
            state = self
                .slurm
                .job(id)
                .await
                .unwrap()
                .expect("the job")
                .job_state;
            if state == [want] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        state
    }

    async fn stop(self) {
        self.stops.stop().await;
        self.env.cleanup().await;
    }
}

/// A test that exits 0 passes the stage; the job ran on the device's own
/// node and the run kept its state, not the device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burn_in_that_completes_passes_the_stage() {
    let mut b = BurnIn::start("#!/bin/bash\necho burn-in on $FLEET_DEVICE_NAME\nexit 0\n").await;
    let device = b.device("gpu04").await;
    let job = b.run("single_node_test", &device).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    let (id, d) = b.slurm_job(&job.id).await;
    assert!(
        d.results[0].detail.starts_with("COMPLETED on gpu04"),
        "{:?}",
        d.results
    );
    let read = b
        .slurm
        .job(id)
        .await
        .unwrap()
        .expect("slurmctld keeps the job");
    assert_eq!(read.job_state, vec!["COMPLETED"]);
    assert_eq!(read.nodes, "gpu04", "pinned to the device's node");
    assert_eq!(
        read.name,
        fleet_domain::burn_in::job_name("single_node_test", &job.id, &device)
    );
    b.stop().await;
}

/// A test that exits non-zero fails the stage with `BURN_IN_FAILED` and
/// SLURM's own words for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burn_in_that_fails_fails_the_stage_with_its_exit_status() {
    let b = BurnIn::start("#!/bin/bash\necho gpu 3 fell off the bus >&2\nexit 3\n").await;
    let device = b.device("gpu05").await;
    let job = b.run("multi_node_test", &device).await;
    assert_eq!(job.status, "failed", "{:?}", job.devices);
    assert_failed(&job, "BURN_IN_FAILED", "exit status 3");
    assert!(job.devices[0].failure_message.contains("FAILED"));
    b.stop().await;
}

/// Cancelling the job cancels its SLURM job: slurmctld reports it
/// CANCELLED and the device's run ends `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_burn_in_cancels_its_slurm_job() {
    let mut b = BurnIn::start("#!/bin/bash\nsleep 600\n").await;
    let device = b.device("gpu06").await;
    let job = create(&b.env, "single_node_test", std::slice::from_ref(&device))
        .await
        .expect("job created");
    let (id, _) = b.slurm_job(&job.id).await;
    let state = b.slurm_state(id, "RUNNING", 300).await;
    assert_eq!(state, vec!["RUNNING"], "SLURM job {id} never ran");
    workflow_client(&b.env)
        .cancel_job(&job.id, "test")
        .await
        .expect("cancel accepted");
    let done = job_terminal(&b.env, &job.id, WITHIN).await;
    assert_eq!(done.status, "cancelled", "{:?}", done.devices);
    // The job is COMPLETING until slurmd has ended its processes: when
    // the script's `sleep` outlives the SIGTERM, that is SLURM's KillWait
    // (30 s) before the SIGKILL (slurmd's log in one CI run: cancelled at
    // 04:46:27, done at 04:46:57).
    let state = b.slurm_state(id, "CANCELLED", 600).await;
    assert_eq!(state, vec!["CANCELLED"], "SLURM job {id}");
    b.stop().await;
}

/// A site without a test script refuses the run with a typed code rather
/// than submitting an empty job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_without_a_test_script_fails_with_site_not_configured() {
    let b = BurnIn::start("").await;
    let device = b.device("gpu04").await;
    let job = b.run("single_node_test", &device).await;
    assert_failed(
        &job,
        "SITE_NOT_CONFIGURED",
        "burn_in.single_node_test.script",
    );
    b.stop().await;
}
