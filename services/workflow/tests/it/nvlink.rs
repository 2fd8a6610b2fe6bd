//! Issue 16: the NVLink repair-partition move and return (seed 002, "NVLink
//! repair-partition latch contract") against the real hub and a fake
//! NMX-M: `Unknown` `MoveInProgress` immediately before the first NMX-M
//! write, the latch after the membership reads back, nothing written by a
//! simulated run or for a tray in customer custody.

use std::time::Duration;

use crate::fabric_fakes::*;
use crate::support::*;

const WITHIN: Duration = Duration::from_secs(60);
const LATCH: &str = "NvLinkGpusInRepairPartition";

struct Rig {
    env: TestEnv,
    device: String,
    host: String,
    nmx: FakeNmx,
    stops: Services,
}

impl Rig {
    async fn start() -> Rig {
        let env = TestEnv::new().await;
        let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
        let host = unique("gpu");
        let device = env.create_device("s1", &host).await;
        let other: &[&str] = &["GPU-other-0"];
        let mine: Vec<String> = (0..4).map(|k| format!("GPU-{host}-{k}")).collect();
        let mine_ref: Vec<&str> = mine.iter().map(String::as_str).collect();
        let nmx = FakeNmx::start(&[(&host, &mine_ref), ("gpu-other", other)]).await;
        // Another host already in repair: its GPU must stay there.
        nmx.state().gpus.insert("GPU-other-0".into(), Some(7));
        let site = fleet_workflow::SiteFabricConfig {
            nmx_url: nmx.url.clone(),
            nmx_username: "rw-user".into(),
            nmx_password: fleet_runtime::Credential {
                value: fleet_runtime::config::Secret::new("rw-password"),
                ..Default::default()
            },
            repair_partition: "repair".into(),
            ..Default::default()
        };
        let (_w, trigger, task) = start_workflow(&env, |c| {
            c.sites.insert(
                "s1".into(),
                fleet_workflow::SiteConfig {
                    fabric: site,
                    ..Default::default()
                },
            );
        })
        .await;
        Rig {
            env,
            device,
            host,
            nmx,
            stops: vec![(trigger, task), (hub_trigger, hub_task)].into(),
        }
    }

    async fn stop(self) {
        self.stops.stop().await;
        self.env.cleanup().await;
    }
}

/// The move takes the host's GPUs out of `default`, then puts the repair
/// partition's members plus them; the latch reads `Unknown`
/// `MoveInProgress` from before the first PUT and `True` `MoveVerified`
/// once every GPU reads back in repair. The return clears it (`False`
/// `ReturnVerified`) and leaves the other host's GPU in repair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nvlink_move_writes_unknown_before_the_nmx_m_write_and_the_latch_after_verification() {
    let rig = Rig::start().await;
    rig.nmx.state().hold = true;
    let job = flip(
        &rig.env,
        "nvlink_repair_move",
        std::slice::from_ref(&rig.device),
        false,
        None,
    )
    .await;
    until("the first partition update", || {
        (rig.nmx.state().puts == 1).then_some(())
    })
    .await;
    let (status, reason, at) = latch(&rig.env, &rig.device, LATCH)
        .await
        .expect("a latch row before the operation completes");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("Unknown", "MoveInProgress")
    );
    let put_at = rig.nmx.state().first_put_at.unwrap();
    assert!(at <= put_at, "Unknown at {at}, first PUT at {put_at}");
    rig.nmx.state().hold = false;
    let job = job_terminal(&rig.env, &job.id, WITHIN).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(rig.nmx.in_partition(&rig.host, 7), 4);
    assert_eq!(rig.nmx.in_partition("gpu-other", 7), 1);
    assert_eq!(rig.nmx.state().puts, 2, "out of default, then into repair");
    let (status, reason, verified_at) = latch(&rig.env, &rig.device, LATCH).await.unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "MoveVerified"));
    assert!(verified_at > at);

    // A re-run converges from live membership: no PUT, the latch again.
    let job = flip(
        &rig.env,
        "nvlink_repair_move",
        std::slice::from_ref(&rig.device),
        false,
        None,
    )
    .await;
    let job = job_terminal(&rig.env, &job.id, WITHIN).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(rig.nmx.state().puts, 2);

    let job = flip(
        &rig.env,
        "nvlink_repair_return",
        std::slice::from_ref(&rig.device),
        false,
        None,
    )
    .await;
    let job = job_terminal(&rig.env, &job.id, WITHIN).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(rig.nmx.in_partition(&rig.host, 7), 0);
    assert_eq!(rig.nmx.in_partition("gpu-other", 7), 1);
    let (status, reason, _) = latch(&rig.env, &rig.device, LATCH).await.unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ReturnVerified")
    );
    rig.stop().await;
}

/// "Simulated runs write nothing"; a tray in customer custody is refused at
/// the custody check with no Unknown row ("a pre-write refusal cannot leave
/// a false latch").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_move_and_a_custody_refusal_write_nothing() {
    let rig = Rig::start().await;
    let job = flip(
        &rig.env,
        "nvlink_repair_move",
        std::slice::from_ref(&rig.device),
        true,
        None,
    )
    .await;
    let job = job_terminal(&rig.env, &job.id, WITHIN).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(rig.nmx.state().puts, 0);
    assert!(job.devices[0].results.iter().all(|r| r.simulated));
    assert_eq!(latch(&rig.env, &rig.device, LATCH).await, None);

    sqlx::query("UPDATE devices SET custody = 'GOOGLE_OWNED' WHERE id = $1")
        .bind(&rig.device)
        .execute(&rig.env.pool)
        .await
        .unwrap();
    let job = flip(
        &rig.env,
        "nvlink_repair_move",
        std::slice::from_ref(&rig.device),
        false,
        None,
    )
    .await;
    let job = job_terminal(&rig.env, &job.id, WITHIN).await;
    assert_eq!(job.status, "failed");
    assert_eq!(job.devices[0].failure_code, "NVLINK_CUSTODY_REFUSED");
    assert_eq!(rig.nmx.state().puts, 0);
    assert_eq!(latch(&rig.env, &rig.device, LATCH).await, None);
    rig.stop().await;
}
