//! Issue 16: the front-end VRF isolate and return (seed 002, "Front-end VRF
//! custody latch contract") against the real hub, PostgreSQL and NATS and
//! fakes of two leaves' NVUE and NetBox's cables: the latch is written only
//! for a verified, wholly real flip, `Unknown` (`FlipInProgress`) before the
//! first switch write, `SWITCH_VRF_FLIP_FAILED` against
//! `SWITCH_VRF_LATCH_WRITE_FAILED`, and a re-run converges without writing
//! a switch again.

use std::time::Duration;

use chrono::Utc;
use fleet_proto::v1;

use crate::fabric_fakes::*;
use crate::support::*;

const LATCH: &str = "FrontendPortsInCustomerVrf";
const CUST: &str = "cust-0042";

/// leaf01's and leaf02's NVUE and NetBox's cables.
struct Leaves {
    leaf01: FakeNvue,
    leaf02: FakeNvue,
    _netbox: FakeNetbox,
}

type Rig = Fabric<Leaves>;

impl Rig {
    /// A device cabled to `swp1` of leaf01 and of leaf02, both in `CUST`;
    /// the hub and a workflow service for them (`simulated` leaves listed).
    async fn start(simulated: &[&str]) -> Rig {
        let env = TestEnv::new().await;
        let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
        let name = unique("gpu");
        let device = env.create_device("s1", &name).await;
        let leaf01 = FakeNvue::start("leaf01", &[("swp1", CUST), ("swp2", CUST)]).await;
        let leaf02 = FakeNvue::start("leaf02", &[("swp1", CUST)]).await;
        let netbox = FakeNetbox::start(&[
            (&name, "eth0", "leaf01", "swp1"),
            (&name, "eth1", "leaf02", "swp1"),
            (&name, "ens1f0", "be01", "swp9"),
        ])
        .await;
        let site = fleet_workflow::SiteFabricConfig {
            netbox_site: "dc1".into(),
            frontend_switches: switches(&[&leaf01, &leaf02]),
            simulated_switches: simulated.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let nb = netbox.clone();
        let leaves = Leaves {
            leaf01,
            leaf02,
            _netbox: netbox,
        };
        Fabric::new(env, (hub_trigger, hub_task), device, leaves, |c| {
            fabric_config(c, &nb, site);
            c.max_attempts = 2;
        })
        .await
    }

    fn writes(&self) -> (u32, u32) {
        (self.leaf01.state().writes(), self.leaf02.state().writes())
    }
}

/// An isolate moves both leaves' ports out of the customer VRF, the latch
/// reading `Unknown` `FlipInProgress` from before the first switch write
/// until the read-back, then `False` `IsolateFlipVerified`; the return puts
/// them back and writes `True` `CustomerVrfFlipVerified`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_end_isolate_then_return_end_to_end() {
    let rig = Rig::start(&[]).await;
    rig.leaf01.state().hold_apply = true;
    let job = rig.flip("frontend_vrf_isolate", false, None).await;
    until("leaf01's apply asked for", || {
        (rig.leaf01.state().applies == 1).then_some(())
    })
    .await;
    // A latch row mid-flip.
    let at = rig.latch_is(LATCH, "Unknown", "FlipInProgress").await;
    let first_write = rig.leaf01.state().first_write_at.unwrap();
    assert!(
        at <= first_write,
        "Unknown at {at}, first switch write at {first_write}"
    );
    assert_eq!(rig.writes().1, 0, "leaf02 waits for leaf01");
    rig.leaf01.state().hold_apply = false;
    let job = rig.ended(&job).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(rig.leaf01.vrf("swp1"), "isolate");
    assert_eq!(rig.leaf02.vrf("swp1"), "isolate");
    assert_eq!(rig.leaf01.vrf("swp2"), CUST, "not the device's port");
    // One revision, one stage, one apply per leaf.
    assert_eq!(rig.writes(), (3, 3));
    rig.latch_is(LATCH, "False", "IsolateFlipVerified").await;
    let d = &job.devices[0];
    assert_eq!(d.step, "latch_written");
    assert_eq!(d.results.len(), 2, "{:?}", d.results);
    assert!(
        d.results.iter().all(|r| r.applied && !r.simulated),
        "{:?}",
        d.results
    );

    let job = rig.run("frontend_vrf_return", false, Some(CUST)).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(rig.leaf01.vrf("swp1"), CUST);
    assert_eq!(rig.leaf02.vrf("swp1"), CUST);
    rig.latch_is(LATCH, "True", "CustomerVrfFlipVerified").await;
    // The return needs each device's customer VRF.
    let refused = create(
        &rig.env,
        "frontend_vrf_return",
        std::slice::from_ref(&rig.device),
    )
    .await
    .unwrap_err();
    assert!(refused.to_string().contains("customer VRF"), "{refused}");
    rig.stop().await;
}

/// `simulate`: every switch planned and read, reported `simulated`, and
/// nothing written, not even the in-progress Unknown: no latch at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_flip_writes_nothing_and_no_latch() {
    let rig = Rig::start(&[]).await;
    let job = rig.run("frontend_vrf_isolate", true, None).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(rig.writes(), (0, 0));
    assert_eq!(rig.leaf01.vrf("swp1"), CUST);
    assert_eq!(rig.latch(LATCH).await, None);
    let results = &job.devices[0].results;
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(
        results.iter().all(|r| r.simulated && !r.applied),
        "{results:?}"
    );
    assert!(results[0].detail.contains(CUST), "{results:?}");
    rig.stop().await;
}

/// One leaf real, one simulated: the real one is flipped (the Unknown
/// first), the simulated one is not written, and the run fails closed with
/// `FABRIC_FLIP_PARTIALLY_SIMULATED`, the latch left Unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_real_and_simulated_flip_fails_closed_leaving_unknown() {
    let rig = Rig::start(&["leaf02"]).await;
    let job = rig.run("frontend_vrf_isolate", false, None).await;
    assert_eq!(job.status, "failed");
    let d = &job.devices[0];
    assert_eq!(
        d.failure_code, "FABRIC_FLIP_PARTIALLY_SIMULATED",
        "{}",
        d.failure_message
    );
    assert_eq!(rig.writes(), (3, 0));
    assert_eq!(rig.leaf02.vrf("swp1"), CUST);
    rig.latch_is(LATCH, "Unknown", "FlipInProgress").await;
    let simulated: Vec<bool> = d.results.iter().map(|r| r.simulated).collect();
    assert_eq!(simulated, vec![false, true], "{:?}", d.results);
    rig.stop().await;
}

/// The revision's apply fails on the switch: `SWITCH_VRF_FLIP_FAILED` (the
/// ports did not move) and the latch stays Unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_that_fails_gives_switch_vrf_flip_failed_and_leaves_unknown() {
    let rig = Rig::start(&[]).await;
    rig.leaf01.state().fail_apply = true;
    let job = rig.run("frontend_vrf_isolate", false, None).await;
    assert_eq!(job.status, "failed");
    assert_failed(&job, "SWITCH_VRF_FLIP_FAILED", "apply_fail");
    assert_eq!(rig.leaf01.vrf("swp1"), CUST);
    assert_eq!(rig.writes().1, 0, "leaf02 never written");
    let (status, _, _) = rig.latch(LATCH).await.unwrap();
    assert_eq!(status, "Unknown");
    rig.stop().await;
}

/// The ports moved, but the hub keeps a later observation than the flip's
/// read-back: `SWITCH_VRF_LATCH_WRITE_FAILED`, not a flip failure. Re-running
/// the same flip no-ops on the applied switches (no switch write at all)
/// and writes the latch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_latch_write_fails_the_flip_and_a_rerun_converges() {
    let rig = Rig::start(&[]).await;
    rig.leaf02.state().hold_apply = true;
    let job = rig.flip("frontend_vrf_isolate", false, None).await;
    until("leaf02's apply asked for", || {
        (rig.leaf02.state().applies == 1).then_some(())
    })
    .await;
    // A later observation on record: the flip's verified write is
    // stale-rejected by the hub.
    let later = Utc::now() + chrono::Duration::seconds(3);
    let reply = rig
        .env
        .command(
            "write_condition",
            0,
            v1::hub_command::Command::WriteCondition(v1::ConditionWrite {
                source: "frontend-fabric".into(),
                device: Some(v1::DeviceKey {
                    site: String::new(),
                    kind: "device_id".into(),
                    key: rig.device.clone(),
                }),
                condition: Some(cond(LATCH, "Unknown", "FlipInProgress")),
                observed_at: Some(fleet_proto::timestamp(later)),
                hub_ordered: false,
            }),
        )
        .await;
    assert!(reply.error.is_none(), "{:?}", reply.error);
    rig.leaf02.state().hold_apply = false;
    let job = rig.ended(&job).await;
    assert_eq!(job.status, "failed");
    assert_failed(&job, "SWITCH_VRF_LATCH_WRITE_FAILED", "stale-rejected");
    assert_eq!(rig.leaf01.vrf("swp1"), "isolate", "the ports did move");
    assert_eq!(rig.leaf02.vrf("swp1"), "isolate");
    let before = rig.writes();
    assert_eq!(before, (3, 3));

    // Once the hub's later row is in the past, the same flip again.
    let wait = (later - Utc::now()).to_std().unwrap_or_default() + Duration::from_millis(300);
    tokio::time::sleep(wait).await;
    let job = rig.run("frontend_vrf_isolate", false, None).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(rig.writes(), before, "no switch written again");
    rig.latch_is(LATCH, "False", "IsolateFlipVerified").await;
    rig.stop().await;
}
