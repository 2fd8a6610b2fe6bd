//! Issue 16: Enrolment (seed 002, "Enrollment identity proof") against the
//! real Ironic with fake hardware: `enroll` through `manageable`, a real
//! (fake-interface) inspection and `provide` to `available`, and the
//! enrolled proof recorded by the hub for the node the run operated.

use std::time::Duration;

use fleet_proto::v1;
use serde_json::json;

use crate::support::*;

const WITHIN: Duration = Duration::from_secs(120);

async fn proof(env: &TestEnv, device: &str) -> (String, String) {
    let v = env
        .device_field(device, "coalesce(enrollment_validated_ref, '')")
        .await;
    let s = env
        .device_field(device, "coalesce(enrollment_proof_source, '')")
        .await;
    (v, s)
}

async fn enrol(env: &TestEnv, devices: &[String], run_inspection: Option<bool>) -> v1::Job {
    let job = create_with(env, "enrollment", devices, |r| {
        r.run_inspection = run_inspection
    })
    .await
    .expect("enrolment job created");
    job_terminal(env, &job.id, WITHIN).await
}

/// A node left in `enroll` (with `extra` fields) and its device.
async fn enrolling(
    ironic: &RealIronic,
    env: &TestEnv,
    prefix: &str,
    extra: serde_json::Value,
) -> (String, String) {
    let name = unique(prefix);
    let uuid = ironic.enroll_node(&name, extra).await;
    let device = device_for(env, "s1", &name, &uuid).await;
    (uuid, device)
}

/// "A qualifying typed completion establishes enrolled proof for its result
/// reference": the node goes enroll -> manageable -> inspected -> available
/// and the hub records the proof for its uuid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrolment_inspects_provides_and_records_the_proof() {
    let (ironic, env, mesh) = Mesh::start().await;
    let (uuid, device) = enrolling(&ironic, &env, "enr", json!({})).await;
    assert_eq!(proof(&env, &device).await.0, "");

    let job = enrol(&env, std::slice::from_ref(&device), None).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    let d = &job.devices[0];
    assert_eq!(d.step, "proof_written");
    let n = ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "available", "{n}");
    assert!(n["inspection_finished_at"].is_string(), "inspected: {n}");
    let (validated, source) = proof(&env, &device).await;
    assert_eq!(validated, uuid);
    assert_eq!(source, format!("enrollment:{}", job.id));
    mesh.stop(ironic, env).await;
}

/// "Diagnostic success (run_inspection=false) ... make[s] no proof write".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diagnostic_enrolment_provides_without_proving() {
    let (ironic, env, mesh) = Mesh::start().await;
    let (uuid, device) = enrolling(&ironic, &env, "diag", json!({})).await;
    let job = enrol(&env, std::slice::from_ref(&device), Some(false)).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    let n = ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "available", "{n}");
    assert!(n["inspection_finished_at"].is_null(), "not inspected: {n}");
    assert_eq!(proof(&env, &device).await.0, "", "no proof written");
    // run_inspection belongs to Enrolment alone.
    let refused = create_with(&env, "image_node", std::slice::from_ref(&device), |r| {
        r.run_inspection = Some(false)
    })
    .await
    .unwrap_err();
    assert!(refused.to_string().contains("run_inspection"), "{refused}");
    mesh.stop(ironic, env).await;
}

/// "IRONIC_DRIVER_MISMATCH: an Ironic power cycle was requested for a node
/// that does not use the required ipmi driver": refused before any power
/// call, the node untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cycle_on_a_node_without_the_required_driver_is_refused() {
    let ironic = RealIronic::connect().await;
    let env = TestEnv::new().await;
    standalone_site(&env).await;
    let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
    let mut site = site_config(&ironic);
    site.enrolment.power_cycle_before_inspect = true;
    site.enrolment.required_driver = "ipmi".into();
    let (_w, w_trigger, w_task) = start_workflow(&env, |c| {
        c.sites.insert("s1".into(), site);
    })
    .await;
    let name = unique("drv");
    let uuid = ironic.available_node(&name).await;
    provisioned(&ironic, &uuid, "manage", "manageable").await;
    let before = ironic.node(&uuid).await;
    let device = device_for(&env, "s1", &name, &uuid).await;
    let job = enrol(&env, std::slice::from_ref(&device), None).await;
    assert_eq!(job.status, "failed");
    assert_failed(&job, "IRONIC_DRIVER_MISMATCH", "fake-hardware");
    let after = ironic.node(&uuid).await;
    for field in [
        "power_state",
        "provision_state",
        "provision_updated_at",
        "inspection_finished_at",
    ] {
        assert_eq!(before[field], after[field], "{field} unchanged");
    }
    stop(w_trigger, w_task).await;
    stop(hub_trigger, hub_task).await;
    ironic.cleanup().await;
    env.cleanup().await;
}

/// "A started non-success submits a non-revoking failure write guarded by
/// the identity pinned in the workflow ... Stale proof metadata is cleared
/// when the operated identity still matches." A node in maintenance fails
/// the run after its identity is pinned: stale proof is cleared, and a
/// device whose proof matches keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_enrolment_clears_stale_proof_and_keeps_matching_proof() {
    let (ironic, env, mesh) = Mesh::start().await;
    let mut devices = vec![];
    for (prefix, proven) in [
        ("stale", "0f0f0f0f-0000-4000-8000-000000000000"),
        ("kept", ""),
    ] {
        let (uuid, device) = enrolling(&ironic, &env, prefix, json!({"maintenance": true})).await;
        let result_ref = if proven.is_empty() {
            uuid.as_str()
        } else {
            proven
        };
        prove(&env, &device, result_ref, "enrollment:earlier").await;
        devices.push((device, uuid));
    }
    let ids: Vec<String> = devices.iter().map(|(d, _)| d.clone()).collect();
    let job = enrol(&env, &ids, None).await;
    assert_eq!(job.status, "failed", "{:?}", job.devices);
    assert!(job
        .devices
        .iter()
        .all(|d| d.failure_code == "IRONIC_NODE_IN_MAINTENANCE"));
    // The stale proof (for another identity) is cleared...
    assert_eq!(
        proof(&env, &devices[0].0).await,
        (String::new(), String::new())
    );
    // ...the matching one is preserved.
    assert_eq!(
        proof(&env, &devices[1].0).await,
        (devices[1].1.clone(), "enrollment:earlier".to_string())
    );
    mesh.stop(ironic, env).await;
}

/// A deployed node is not enrolled; a job over it fails closed and proves
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_node_is_not_enrolled() {
    let (ironic, env, mesh) = Mesh::start().await;
    let name = unique("act");
    let uuid = ironic.available_node(&name).await;
    provisioned(&ironic, &uuid, "active", "active").await;
    let device = device_for(&env, "s1", &name, &uuid).await;
    let job = enrol(&env, std::slice::from_ref(&device), None).await;
    assert_eq!(job.status, "failed");
    assert_eq!(job.devices[0].failure_code, "IRONIC_NODE_NOT_AVAILABLE");
    assert_eq!(proof(&env, &device).await.0, "");
    mesh.stop(ironic, env).await;
}
