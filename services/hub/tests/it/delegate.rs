//! Release's Metal hand-back through the hub's `delegate` command: the
//! re-check with the device locked (a typed refusal changes nothing), the
//! front-end latch's custody-entry rule, the retried no-op, and Borneo's
//! later custody entry not writing the latch twice.

use chrono::Utc;
use fleet_proto::v1;
use v1::hub_command::Command as C;

use crate::support::*;

fn delegate(id: &str, pinned: &str, netbox: &str) -> C {
    C::Delegate(v1::Delegate {
        device_id: id.into(),
        pinned_infrastructure_ref: pinned.into(),
        netbox_status: netbox.into(),
        job_id: "job_test".into(),
    })
}

/// Back-end fabric writes its latch on the device `id` (keyed by its id
/// alone, no site), observed now; the write must succeed.
async fn backend_latch(env: &TestEnv, id: &str, status: &str, reason: &str) {
    let w = env
        .command(
            "write_condition",
            0,
            C::WriteCondition(v1::ConditionWrite {
                device: Some(v1::DeviceKey {
                    site: String::new(),
                    kind: "device_id".into(),
                    key: id.into(),
                }),
                source: "backend-fabric".into(),
                condition: Some(cond("BackendPortsInMaintenanceVrf", status, reason)),
                observed_at: Some(fleet_proto::timestamp(micros(Utc::now()))),
                ..Default::default()
            }),
        )
        .await;
    assert!(w.error.is_none(), "{:?}", w.error);
}

async fn latch(env: &TestEnv, id: &str) -> Option<(String, String)> {
    optional_row(
        env,
        "SELECT status, reason FROM device_conditions WHERE device_id = $1 AND type = 'FrontendPortsInCustomerVrf'",
        id,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegate_refuses_typed_then_enters_delegated_once() {
    let (env, hub) = start().await;
    let reply = env
        .command(
            "create_device",
            0,
            C::CreateDevice(v1::CreateDevice {
                site: "s1".into(),
                name: "gpu-metal-01".into(),
                infrastructure_ref: "uuid-metal-1".into(),
                ..Default::default()
            }),
        )
        .await;
    let id = device_of(&reply).id;

    // Refusals: typed INVALID_STATE, nothing written.
    for (pinned, netbox, why) in [
        ("uuid-metal-1", "rma", "NetBox"),
        ("uuid-other", "active", "infrastructure_ref"),
        ("", "active", "infrastructure_ref"),
    ] {
        let r = env
            .command("delegate", 0, delegate(&id, pinned, netbox))
            .await;
        let e = refusal(r, fleet_proto::ErrorCode::InvalidState);
        assert!(e.message.contains(why), "{}", e.message);
    }
    // The back-end latch True (an isolate verified) refuses too.
    backend_latch(&env, &id, "True", "IsolateVerified").await;
    let version = env.device_field(&id, "version").await;
    let r = env
        .command("delegate", 0, delegate(&id, "uuid-metal-1", "active"))
        .await;
    assert!(
        r.error
            .as_ref()
            .is_some_and(|e| e.message.contains("BackendPortsInMaintenanceVrf")),
        "{:?}",
        r.error
    );
    assert_eq!(
        env.device_field(&id, "version").await,
        version,
        "nothing written"
    );
    assert_eq!(latch(&env, &id).await, None);

    // The back-end return clears it; the hand-back enters delegated and
    // writes the front-end latch Unknown (no verified flip on record).
    backend_latch(&env, &id, "False", "ReturnVerified").await;
    let r = env
        .command("delegate", 0, delegate(&id, "uuid-metal-1", "active"))
        .await;
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(device_of(&r).operational_status, "delegated");
    assert_eq!(
        latch(&env, &id).await,
        Some(("Unknown".into(), "HandoverBreach".into()))
    );
    let lifecycle: i64 = scalar(
        &env,
        "SELECT count(*) FROM device_lifecycle_events WHERE device_id = $1 AND kind = 'operational' AND value = 'delegated'",
        &id,
    )
    .await;
    assert_eq!(lifecycle, 1);

    // A retried hand-back is a no-op.
    let version = env.device_field(&id, "version").await;
    let r = env
        .command("delegate", 0, delegate(&id, "uuid-metal-1", "active"))
        .await;
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(env.device_field(&id, "version").await, version);

    hub.stop(env).await;
}
