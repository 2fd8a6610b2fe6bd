//! Issue 16: the Nova arm of Image Node and Unimage Node (seed 002) at a
//! full-OpenStack site: the real Ironic (fake hardware) and a Nova of the
//! test's own whose driver deploys and tears down on that Ironic.

use std::time::Duration;

use fleet_testkit::nova::FakeNova;
use serde_json::json;

use crate::support::*;

/// How long a job that deploys or tears a node down may take.
const DEPLOY: Duration = Duration::from_secs(120);
/// How long any other job may take.
const WITHIN: Duration = Duration::from_secs(60);

/// A node available and leased to the enrol project, a device for it at
/// the Nova site, mirrored by the hub.
async fn enrolled(env: &TestEnv, ironic: &RealIronic, prefix: &str) -> (String, String, String) {
    let name = unique(prefix);
    let uuid = ironic.available_node(&name).await;
    ironic
        .patch(
            &uuid,
            json!([{"op": "add", "path": "/lessee", "value": ENROL_PROJECT}]),
        )
        .await;
    let device = device_for(env, "s1", &name, &uuid).await;
    mirrored(env, &device, "available").await;
    (name, uuid, device)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_then_unimage_at_a_nova_site_end_to_end() {
    let nova = FakeNova::start().await;
    let (ironic, env, mesh) = Mesh::start_nova(&nova).await;
    let (name, uuid, device) = enrolled(&env, &ironic, "nova").await;

    let job = run_job(&env, "image_node", &[&device], DEPLOY).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    // "Before Nova creation it moves the Ironic lease from the enrol
    // project to the SLURM project, then creates the server through the
    // dedicated SLURM credential using the configured SLURM network and
    // keypair."
    let servers = nova.servers();
    assert_eq!(servers.len(), 1, "{servers:?}");
    let s = &servers[0];
    assert_eq!(
        (s.name.as_str(), s.node.as_str(), s.status.as_str()),
        (name.as_str(), uuid.as_str(), "ACTIVE")
    );
    assert_eq!(
        (
            s.image.as_str(),
            s.flavor.as_str(),
            s.network.as_str(),
            s.key_name.as_str()
        ),
        ("slurm-gpu-image", "bm.gpu", "slurm-net", "slurm-key")
    );
    let n = ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "active", "{n}");
    assert_eq!(n["instance_uuid"], s.id.as_str(), "{n}");
    assert_eq!(n["lessee"], SLURM_PROJECT, "{n}");

    // "UnimageNodeWorkflow only deletes the Nova server identified by
    // Ironic's instance_uuid ... waits for the server to disappear and
    // Ironic to return to AVAILABLE, then returns the lease to the enrol
    // project."
    mirrored(&env, &device, "active").await;
    let job = run_job(&env, "unimage_node", &[&device], DEPLOY).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert!(nova.servers().is_empty(), "{:?}", nova.servers());
    assert_eq!(nova.deletes(), 1);
    let n = ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "available", "{n}");
    assert!(n["instance_uuid"].is_null(), "{n}");
    assert_eq!(n["lessee"], ENROL_PROJECT, "{n}");

    // "A retry accepts that already-completed enrol-leased state."
    mirrored(&env, &device, "available").await;
    let job = run_job(&env, "unimage_node", &[&device], WITHIN).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(nova.deletes(), 1, "nothing deleted again");
    assert_eq!(nova.created().len(), 1, "nothing created");

    mesh.stop(ironic, env).await;
}

/// "A retry recovers the server ... from a sole exact host-name match in
/// the SLURM Nova project before Ironic has recorded that binding.
/// Multiple exact-name matches fail closed. Terminal Nova states also fail
/// without automatically deleting the discovered server."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_match_is_recovered_several_fail_closed_and_a_failed_build_is_kept() {
    let nova = FakeNova::start().await;
    let (ironic, env, mesh) = Mesh::start_nova(&nova).await;
    let (one_name, one_uuid, one) = enrolled(&env, &ironic, "sole").await;
    let (two_name, two_uuid, two) = enrolled(&env, &ironic, "twice").await;
    let (_, three_uuid, three) = enrolled(&env, &ironic, "error").await;

    // A server named as the first host on its node, which Ironic has not
    // bound yet (an earlier run's create whose id was never recorded).
    let sole = nova.place(&one_name, &one_uuid, "BUILD");
    // Two for the second host.
    nova.place(&two_name, "", "BUILD");
    nova.place(&two_name, "", "ACTIVE");

    let job = run_job(&env, "image_node", &[&one, &two], DEPLOY).await;
    let by = |id: &str| {
        job.devices
            .iter()
            .find(|d| d.device_id == id)
            .unwrap()
            .clone()
    };
    // The sole match is the run's server: recovered, not created again.
    let first = by(&one);
    assert_eq!(first.status, "succeeded", "{first:?}");
    let n = ironic.node(&one_uuid).await;
    assert_eq!(n["instance_uuid"], sole.as_str(), "{n}");
    assert_eq!(n["provision_state"], "active", "{n}");
    let second = by(&two);
    assert_eq!(second.status, "failed");
    assert_eq!(second.failure_code, "NOVA_SERVER_AMBIGUOUS", "{second:?}");
    assert!(
        nova.created().is_empty(),
        "nothing created: {:?}",
        nova.created()
    );
    let n = ironic.node(&two_uuid).await;
    assert_eq!(n["provision_state"], "available", "{n}");
    assert!(n["instance_uuid"].is_null(), "{n}");

    // A build that fails in Nova: NOVA_SERVER_FAILED with Nova's fault,
    // and the server is left for diagnosis.
    nova.fail_next_build();
    let job = run_job(&env, "image_node", &[&three], DEPLOY).await;
    assert_failed(&job, "NOVA_SERVER_FAILED", "No valid host");
    assert_eq!(nova.created().len(), 1);
    assert_eq!(nova.deletes(), 0, "the failed server is not deleted");
    assert!(nova
        .servers()
        .iter()
        .any(|s| s.node == three_uuid && s.status == "ERROR"));

    mesh.stop(ironic, env).await;
}

/// "a bound UUID whose Nova server is missing, fails for explicit operator
/// repair": a node deployed outside Nova is not torn down by Unimage's
/// Nova arm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unimage_of_a_binding_nova_does_not_have_fails_and_touches_nothing() {
    let nova = FakeNova::start().await;
    let (ironic, env, mesh) = Mesh::start_nova(&nova).await;
    let (_, uuid, device) = enrolled(&env, &ironic, "orphan").await;
    let orphan = fleet_testkit::ironic::random_uuid();
    ironic
        .patch(
            &uuid,
            json!([
                {"op": "add", "path": "/instance_uuid", "value": orphan},
                {"op": "add", "path": "/instance_info", "value": {
                    "image_source": "http://images.invalid/x.qcow2",
                    "image_checksum": "0123456789abcdef0123456789abcdef"}},
            ]),
        )
        .await;
    provisioned(&ironic, &uuid, "active", "active").await;
    mirrored(&env, &device, "active").await;

    let job = run_job(&env, "unimage_node", &[&device], WITHIN).await;
    assert_eq!(job.devices[0].status, "failed");
    assert_failed(&job, "NOVA_SERVER_MISSING", &orphan);
    let n = ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "active", "not torn down: {n}");
    assert_eq!(n["instance_uuid"], orphan.as_str(), "{n}");
    assert_eq!(nova.deletes(), 0);

    mesh.stop(ironic, env).await;
}

/// Nova away is retried, then fails retryable (`NOVA_UNAVAILABLE`); a
/// create Nova refuses (403) fails at once (`NOVA_REQUEST_REFUSED`); a CPU
/// hypervisor is rejected at runtime ("Undercloud/CPU-hypervisor routing
/// remains out of scope"), with nothing written to Nova or Ironic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nova_outages_refusals_and_hypervisors_fail_with_their_codes() {
    let nova = FakeNova::start().await;
    let (ironic, env, mesh) = Mesh::start_nova(&nova).await;
    let (_, _, down) = enrolled(&env, &ironic, "down").await;

    nova.unavailable(1_000);
    let job = run_job(&env, "image_node", &[&down], WITHIN).await;
    assert_failed(&job, "NOVA_UNAVAILABLE", "after");
    nova.unavailable(0);

    nova.refuse_creates(
        "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances",
    );
    let job = run_job(&env, "image_node", &[&down], WITHIN).await;
    assert_failed(&job, "NOVA_REQUEST_REFUSED", "Quota exceeded");
    assert!(nova.created().is_empty());

    let name = unique("hyp");
    let uuid = ironic.available_node(&name).await;
    let hypervisor = env
        .create_device_with(fleet_proto::v1::CreateDevice {
            site: "s1".into(),
            name: name.clone(),
            infrastructure_ref: uuid.clone(),
            device_class: "cpu_hypervisor".into(),
            ..Default::default()
        })
        .await;
    mirrored(&env, &hypervisor, "available").await;
    let job = run_job(&env, "image_node", &[&hypervisor], WITHIN).await;
    assert_failed(&job, "IMAGE_ROLE_UNSUPPORTED", "out of scope");
    let n = ironic.node(&uuid).await;
    assert!(n["lessee"].is_null(), "nothing written: {n}");

    mesh.stop(ironic, env).await;
}
