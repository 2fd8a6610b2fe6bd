//! Issue 16: the NVLink repair-partition move and return (seed 002, "NVLink
//! repair-partition latch contract") against the real hub and a fake
//! NMX-M: `Unknown` `MoveInProgress` immediately before the first NMX-M
//! write, the latch after the membership reads back, nothing written by a
//! simulated run or for a tray in customer custody.

use crate::fabric_fakes::*;
use crate::support::*;

const LATCH: &str = "NvLinkGpusInRepairPartition";

/// NMX-M, and the host whose GPUs it moves.
struct Nvlink {
    host: String,
    nmx: FakeNmx,
}

type Rig = Fabric<Nvlink>;

impl Rig {
    /// A host with four GPUs in NMX-M's `default` partition, another
    /// host's GPU already in repair, the hub and a workflow service for
    /// them.
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
        let hub = (hub_trigger, hub_task);
        Fabric::new(env, hub, device, Nvlink { host, nmx }, |c| {
            site_fabric(c, site)
        })
        .await
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
    let job = rig.flip("nvlink_repair_move", false, None).await;
    until("the first partition update", || {
        (rig.nmx.state().puts == 1).then_some(())
    })
    .await;
    // A latch row before the operation completes.
    let at = rig.latch_is(LATCH, "Unknown", "MoveInProgress").await;
    let put_at = rig.nmx.state().first_put_at.unwrap();
    assert!(at <= put_at, "Unknown at {at}, first PUT at {put_at}");
    rig.nmx.state().hold = false;
    let job = rig.ended(&job).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(rig.nmx.in_partition(&rig.host, 7), 4);
    assert_eq!(rig.nmx.in_partition("gpu-other", 7), 1);
    assert_eq!(rig.nmx.state().puts, 2, "out of default, then into repair");
    let verified_at = rig.latch_is(LATCH, "True", "MoveVerified").await;
    assert!(verified_at > at);

    // A re-run converges from live membership: no PUT, the latch again.
    let job = rig.run("nvlink_repair_move", false, None).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(rig.nmx.state().puts, 2);

    let job = rig.run("nvlink_repair_return", false, None).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(rig.nmx.in_partition(&rig.host, 7), 0);
    assert_eq!(rig.nmx.in_partition("gpu-other", 7), 1);
    rig.latch_is(LATCH, "False", "ReturnVerified").await;
    rig.stop().await;
}

/// "Simulated runs write nothing"; a tray in customer custody is refused at
/// the custody check with no Unknown row ("a pre-write refusal cannot leave
/// a false latch").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_move_and_a_custody_refusal_write_nothing() {
    let rig = Rig::start().await;
    let job = rig.run("nvlink_repair_move", true, None).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(rig.nmx.state().puts, 0);
    assert!(job.devices[0].results.iter().all(|r| r.simulated));
    assert_eq!(rig.latch(LATCH).await, None);

    sqlx::query("UPDATE devices SET custody = 'GOOGLE_OWNED' WHERE id = $1")
        .bind(&rig.device)
        .execute(&rig.env.pool)
        .await
        .unwrap();
    let job = rig.run("nvlink_repair_move", false, None).await;
    assert_eq!(job.status, "failed");
    assert_eq!(job.devices[0].failure_code, "NVLINK_CUSTODY_REFUSED");
    assert_eq!(rig.nmx.state().puts, 0);
    assert_eq!(rig.latch(LATCH).await, None);
    rig.stop().await;
}
