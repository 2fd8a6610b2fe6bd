//! Issue 16: the back-end VRF isolate and return (seed 002, "Back-end VRF
//! latch contract"), real only at a site that sets
//! `backend_vrf_flip_allowed` (the hub's `create_site`/`update_site`):
//! elsewhere every switch is simulated and nothing is written.

use std::time::Duration;

use fleet_proto::v1;

use crate::fabric_fakes::*;
use crate::support::*;

const WITHIN: Duration = Duration::from_secs(60);
const LATCH: &str = "BackendPortsInMaintenanceVrf";

async fn set_up(
    env: &TestEnv,
) -> (
    String,
    FakeNvue,
    FakeNvue,
    FakeNetbox,
    fleet_runtime::shutdown::ShutdownTrigger,
    tokio::task::JoinHandle<()>,
) {
    let name = unique("gpu");
    let device = env.create_device("s1", &name).await;
    let be01 = FakeNvue::start("be01", &[("swp3", "tenant-be")]).await;
    let be02 = FakeNvue::start("be02", &[("swp3", "tenant-be")]).await;
    let netbox = FakeNetbox::start(&[
        (&name, "ens1f0", "be01", "swp3"),
        (&name, "ens1f1", "be02", "swp3"),
        (&name, "eth0", "leaf01", "swp1"),
    ])
    .await;
    let site = fleet_workflow::SiteFabricConfig {
        netbox_site: "dc1".into(),
        backend_switches: switches(&[&be01, &be02]),
        maintenance_vrf: "maint".into(),
        tenant_backend_vrf: "tenant-be".into(),
        ..Default::default()
    };
    let nb = netbox.clone();
    let (_w, trigger, task) = start_workflow(env, |c| fabric_config(c, &nb, site)).await;
    (device, be01, be02, netbox, trigger, task)
}

/// "a simulated run writes nothing": at a site without
/// `backend_vrf_flip_allowed` the isolate plans and reads both switches,
/// reports them simulated, writes neither and records no latch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_back_end_flip_at_a_site_without_backend_vrf_flip_allowed_is_simulated() {
    let env = TestEnv::new().await;
    let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
    let (device, be01, be02, _nb, trigger, task) = set_up(&env).await;
    let job = flip(
        &env,
        "backend_vrf_isolate",
        std::slice::from_ref(&device),
        false,
        None,
    )
    .await;
    let job = job_terminal(&env, &job.id, WITHIN).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!((be01.state().writes(), be02.state().writes()), (0, 0));
    assert_eq!(be01.vrf("swp3"), "tenant-be");
    assert_eq!(latch(&env, &device, LATCH).await, None);
    let results = &job.devices[0].results;
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results.iter().all(|r| r.simulated), "{results:?}");
    for (t, tr) in [(trigger, task), (hub_trigger, hub_task)] {
        stop(t, tr).await;
    }
    env.cleanup().await;
}

/// With the flag set through the hub (its Site reply shows it), the isolate
/// records `Unknown` `ApplyInProgress` before each switch it writes, then
/// `True` `IsolateVerified`; the return writes `False` `ReturnVerified`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_back_end_isolate_and_return_are_real_where_the_site_allows_them() {
    let env = TestEnv::new().await;
    let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
    // create_site carries the flag, update_site changes it.
    let reply = env
        .command(
            "create_site",
            0,
            v1::hub_command::Command::CreateSite(v1::Site {
                id: "s9".into(),
                name: "site nine".into(),
                backend_vrf_flip_allowed: true,
                ..Default::default()
            }),
        )
        .await;
    match reply.record {
        Some(v1::hub_reply::Record::Site(s)) => assert!(s.backend_vrf_flip_allowed, "{s:?}"),
        other => panic!("create_site: {other:?} {:?}", reply.error),
    }
    let reply = env
        .command(
            "update_site",
            0,
            v1::hub_command::Command::UpdateSite(v1::UpdateSite {
                id: "s1".into(),
                backend_vrf_flip_allowed: Some(true),
                ..Default::default()
            }),
        )
        .await;
    match reply.record {
        Some(v1::hub_reply::Record::Site(s)) => {
            assert!(s.backend_vrf_flip_allowed, "{s:?}")
        }
        other => panic!("update_site: {other:?} {:?}", reply.error),
    }
    let (device, be01, be02, _nb, trigger, task) = set_up(&env).await;
    be02.state().hold_apply = true;
    let job = flip(
        &env,
        "backend_vrf_isolate",
        std::slice::from_ref(&device),
        false,
        None,
    )
    .await;
    until("be02's apply asked for", || {
        (be02.state().applies == 1).then_some(())
    })
    .await;
    // be01 verified, be02 applying: Unknown from be02's own apply.
    let (status, reason, at) = latch(&env, &device, LATCH).await.unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("Unknown", "ApplyInProgress")
    );
    let be02_first = be02.state().first_write_at.unwrap();
    let be01_last = be01.state().first_write_at.unwrap();
    assert!(
        be01_last < at && at <= be02_first,
        "{be01_last} < {at} <= {be02_first}"
    );
    be02.state().hold_apply = false;
    let job = job_terminal(&env, &job.id, WITHIN).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(
        (be01.vrf("swp3"), be02.vrf("swp3")),
        ("maint".into(), "maint".into())
    );
    let (status, reason, _) = latch(&env, &device, LATCH).await.unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "IsolateVerified")
    );

    let job = flip(
        &env,
        "backend_vrf_return",
        std::slice::from_ref(&device),
        false,
        None,
    )
    .await;
    let job = job_terminal(&env, &job.id, WITHIN).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(be01.vrf("swp3"), "tenant-be");
    let (status, reason, _) = latch(&env, &device, LATCH).await.unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ReturnVerified")
    );
    for (t, tr) in [(trigger, task), (hub_trigger, hub_task)] {
        stop(t, tr).await;
    }
    env.cleanup().await;
}
