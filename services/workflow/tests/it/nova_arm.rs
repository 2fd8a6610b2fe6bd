//! Issue 16: the Nova arm of Image Node and Unimage Node (seed 002) at a
//! full-OpenStack site: the real Ironic (fake hardware) and a Nova of the
//! test's own whose driver deploys and tears down on that Ironic.

use std::time::Duration;

use fleet_testkit::nova::FakeNova;
use serde_json::json;

use crate::support::*;

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

    let job = create(&env, "image_node", std::slice::from_ref(&device))
        .await
        .expect("image job created");
    let job = job_terminal(&env, &job.id, Duration::from_secs(120)).await;
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
    let job = create(&env, "unimage_node", std::slice::from_ref(&device))
        .await
        .expect("unimage job created");
    let job = job_terminal(&env, &job.id, Duration::from_secs(120)).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert!(nova.servers().is_empty(), "{:?}", nova.servers());
    assert_eq!(nova.deletes(), 1);
    let n = ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "available", "{n}");
    assert!(n["instance_uuid"].is_null(), "{n}");
    assert_eq!(n["lessee"], ENROL_PROJECT, "{n}");

    // "A retry accepts that already-completed enrol-leased state."
    mirrored(&env, &device, "available").await;
    let job = create(&env, "unimage_node", std::slice::from_ref(&device))
        .await
        .expect("created");
    let job = job_terminal(&env, &job.id, Duration::from_secs(60)).await;
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

    let job = create(&env, "image_node", &[one.clone(), two.clone()])
        .await
        .expect("created");
    let job = job_terminal(&env, &job.id, Duration::from_secs(120)).await;
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
    let job = create(&env, "image_node", std::slice::from_ref(&three))
        .await
        .expect("created");
    let job = job_terminal(&env, &job.id, Duration::from_secs(120)).await;
    let d = &job.devices[0];
    assert_eq!(d.failure_code, "NOVA_SERVER_FAILED", "{d:?}");
    assert!(
        d.failure_message.contains("No valid host"),
        "{}",
        d.failure_message
    );
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
    let (s, v) = ironic.provision(&uuid, json!({"target": "active"})).await;
    assert_eq!(s, 202, "{v}");
    ironic.wait_state(&uuid, "active").await;
    mirrored(&env, &device, "active").await;

    let job = create(&env, "unimage_node", std::slice::from_ref(&device))
        .await
        .expect("created");
    let job = job_terminal(&env, &job.id, Duration::from_secs(60)).await;
    let d = &job.devices[0];
    assert_eq!(d.status, "failed");
    assert_eq!(d.failure_code, "NOVA_SERVER_MISSING", "{d:?}");
    assert!(d.failure_message.contains(&orphan), "{}", d.failure_message);
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
    let job = create(&env, "image_node", std::slice::from_ref(&down))
        .await
        .expect("created");
    let job = job_terminal(&env, &job.id, Duration::from_secs(60)).await;
    let d = &job.devices[0];
    assert_eq!(d.failure_code, "NOVA_UNAVAILABLE", "{d:?}");
    assert!(d.failure_message.contains("after"), "{}", d.failure_message);
    nova.unavailable(0);

    nova.refuse_creates(
        "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances",
    );
    let job = create(&env, "image_node", std::slice::from_ref(&down))
        .await
        .expect("created");
    let job = job_terminal(&env, &job.id, Duration::from_secs(60)).await;
    let d = &job.devices[0];
    assert_eq!(d.failure_code, "NOVA_REQUEST_REFUSED", "{d:?}");
    assert!(
        d.failure_message.contains("Quota exceeded"),
        "{}",
        d.failure_message
    );
    assert!(nova.created().is_empty());

    let name = unique("hyp");
    let uuid = ironic.available_node(&name).await;
    let reply = env
        .command(
            "create_device",
            0,
            fleet_proto::v1::hub_command::Command::CreateDevice(fleet_proto::v1::CreateDevice {
                site: "s1".into(),
                name: name.clone(),
                infrastructure_ref: uuid.clone(),
                device_class: "cpu_hypervisor".into(),
                ..Default::default()
            }),
        )
        .await;
    assert!(reply.error.is_none(), "{:?}", reply.error);
    let hypervisor = device_of(&reply).id;
    mirrored(&env, &hypervisor, "available").await;
    let job = create(&env, "image_node", std::slice::from_ref(&hypervisor))
        .await
        .expect("created");
    let job = job_terminal(&env, &job.id, Duration::from_secs(60)).await;
    let d = &job.devices[0];
    assert_eq!(d.failure_code, "IMAGE_ROLE_UNSUPPORTED", "{d:?}");
    assert!(
        d.failure_message.contains("out of scope"),
        "{}",
        d.failure_message
    );
    let n = ironic.node(&uuid).await;
    assert!(n["lessee"].is_null(), "nothing written: {n}");

    mesh.stop(ironic, env).await;
}
