//! Issue 16: the back-end VRF isolate and return (seed 002, "Back-end VRF
//! latch contract"), real only at a site that sets
//! `backend_vrf_flip_allowed` (the hub's `create_site`/`update_site`):
//! elsewhere every switch is simulated and nothing is written.

use fleet_proto::v1;

use crate::fabric_fakes::*;
use crate::support::*;

const LATCH: &str = "BackendPortsInMaintenanceVrf";

/// be01's and be02's NVUE and NetBox's cables.
struct Backend {
    be01: FakeNvue,
    be02: FakeNvue,
    _netbox: FakeNetbox,
}

type Rig = Fabric<Backend>;

impl Rig {
    /// A device cabled to `swp3` of be01 and of be02, both in the tenant's
    /// VRF, and a workflow service for them, on `env`, whose hub runs
    /// (`hub`).
    async fn start(env: TestEnv, hub: ServiceTask) -> Rig {
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
        let fakes = Backend {
            be01,
            be02,
            _netbox: netbox,
        };
        Fabric::new(env, hub, device, fakes, |c| fabric_config(c, &nb, site)).await
    }
}

/// Sends the hub site command `c`; asserts the site it answers with allows
/// the back-end flips.
async fn allows_backend_flips(env: &TestEnv, verb: &str, c: v1::hub_command::Command) {
    let reply = env.command(verb, 0, c).await;
    match reply.record {
        Some(v1::hub_reply::Record::Site(s)) => assert!(s.backend_vrf_flip_allowed, "{s:?}"),
        other => panic!("{verb}: {other:?} {:?}", reply.error),
    }
}

/// "a simulated run writes nothing": at a site without
/// `backend_vrf_flip_allowed` the isolate plans and reads both switches,
/// reports them simulated, writes neither and records no latch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_back_end_flip_at_a_site_without_backend_vrf_flip_allowed_is_simulated() {
    let env = TestEnv::new().await;
    let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
    let rig = Rig::start(env, (hub_trigger, hub_task)).await;
    let job = rig.run("backend_vrf_isolate", false, None).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(
        (rig.be01.state().writes(), rig.be02.state().writes()),
        (0, 0)
    );
    assert_eq!(rig.be01.vrf("swp3"), "tenant-be");
    assert_eq!(rig.latch(LATCH).await, None);
    let results = &job.devices[0].results;
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results.iter().all(|r| r.simulated), "{results:?}");
    rig.stop().await;
}

/// With the flag set through the hub (its Site reply shows it), the isolate
/// records `Unknown` `ApplyInProgress` before each switch it writes, then
/// `True` `IsolateVerified`; the return writes `False` `ReturnVerified`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_back_end_isolate_and_return_are_real_where_the_site_allows_them() {
    let env = TestEnv::new().await;
    let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
    // create_site carries the flag, update_site changes it.
    let create = v1::hub_command::Command::CreateSite(v1::Site {
        id: "s9".into(),
        name: "site nine".into(),
        backend_vrf_flip_allowed: true,
        ..Default::default()
    });
    allows_backend_flips(&env, "create_site", create).await;
    let update = v1::hub_command::Command::UpdateSite(v1::UpdateSite {
        id: "s1".into(),
        backend_vrf_flip_allowed: Some(true),
        ..Default::default()
    });
    allows_backend_flips(&env, "update_site", update).await;
    let rig = Rig::start(env, (hub_trigger, hub_task)).await;
    let (be01, be02) = (&rig.be01, &rig.be02);
    be02.state().hold_apply = true;
    let job = rig.flip("backend_vrf_isolate", false, None).await;
    until("be02's apply asked for", || {
        (be02.state().applies == 1).then_some(())
    })
    .await;
    // be01 verified, be02 applying: Unknown from be02's own apply.
    let at = rig.latch_is(LATCH, "Unknown", "ApplyInProgress").await;
    let be02_first = be02.state().first_write_at.unwrap();
    let be01_last = be01.state().first_write_at.unwrap();
    assert!(
        be01_last < at && at <= be02_first,
        "{be01_last} < {at} <= {be02_first}"
    );
    be02.state().hold_apply = false;
    let job = rig.ended(&job).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(
        (be01.vrf("swp3"), be02.vrf("swp3")),
        ("maint".into(), "maint".into())
    );
    rig.latch_is(LATCH, "True", "IsolateVerified").await;

    let job = rig.run("backend_vrf_return", false, None).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(be01.vrf("swp3"), "tenant-be");
    rig.latch_is(LATCH, "False", "ReturnVerified").await;
    rig.stop().await;
}
