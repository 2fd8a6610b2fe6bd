//! Issue 16: Move to Test Cluster (seed 002) at a standalone site against
//! the real Ironic: the customer-ready trait removed, a customer's instance
//! torn down only with `force_reclaim`, the maintenance (SLURM) lease, the
//! SLURM image deployed Ironic-direct, the SLURM node read (the real
//! slurmrestd, or a v0.0.40 one of the test's own where it must be drained
//! and resumed), then the hub's `validation`.
//!
//! The SLURM conditions the hub derives `validation` from are published by
//! the test as connector-slurm would (its own tests read the real
//! slurmrestd); the maintenance pool comes from connector-openstack
//! reading the lease the workflow wrote.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_proto::v1;
use serde_json::{json, Value};
use wiremock::matchers::path_regex;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::support::*;

const MAINT: &str = "slurm-project";
const SLURM_IMAGE: &str = "http://images.invalid/slurm-test-cluster.qcow2";
const WITHIN: Duration = Duration::from_secs(120);

struct Mtc {
    ironic: RealIronic,
    env: TestEnv,
    mesh: Mesh,
}

impl Mtc {
    /// The real Ironic read by connector-openstack, the hub, and the
    /// workflow service with the site's SLURM lease, image and slurmrestd
    /// (`None`: no slurmrestd configured).
    async fn start(slurm: Option<fleet_slurm::SiteConfig>) -> Mtc {
        Self::start_with(slurm, None).await
    }

    /// The same at a site with Nova and Placement: `nova` deploys on the
    /// real Ironic, `placement` holds the customer-ready trait.
    async fn start_nova(
        slurm: fleet_slurm::SiteConfig,
        nova: &fleet_testkit::nova::FakeNova,
        placement: &fleet_testkit::placement::FakePlacement,
    ) -> Mtc {
        Self::start_with(Some(slurm), Some((nova, placement))).await
    }

    async fn start_with(
        slurm: Option<fleet_slurm::SiteConfig>,
        nova: Option<(
            &fleet_testkit::nova::FakeNova,
            &fleet_testkit::placement::FakePlacement,
        )>,
    ) -> Mtc {
        let ironic = RealIronic::connect().await;
        let mut site = site_config(&ironic);
        site.openstack.maintenance_project_id = MAINT.into();
        site.slurm_image_source = SLURM_IMAGE.into();
        if let Some(s) = slurm {
            site.slurm = s;
        }
        let placement_enabled = nova.is_some();
        if let Some((nova, placement)) = nova {
            site.openstack.placement_enabled = true;
            site.openstack.placement_url = placement.url.clone();
            // The site's own (administrator's) credential reaches Nova too:
            // force_reclaim deletes a customer's server with it.
            site.openstack.nova_url = nova.url.clone();
            site.nova = nova_arm(nova, "slurm-test-cluster");
        }
        let reader = Reader {
            maintenance_project: MAINT,
            // Devices are named as SLURM names them, not as their
            // (shared, uniquely named) Ironic nodes.
            by_ref: true,
        };
        let (ironic, env, mesh) =
            Mesh::start_with(ironic, site, placement_enabled, reader, |_| {}).await;
        Mtc { ironic, env, mesh }
    }

    /// An available node carrying the customer-ready trait and its proven
    /// device named `name` (the SLURM node's name).
    async fn ready_device(&self, name: &str) -> (String, String) {
        let uuid = self.ironic.available_node(&unique(name)).await;
        self.ironic.add_trait(&uuid, READY).await;
        let device = proven_device(&self.env, "s1", name, &uuid, 0).await;
        mirrored(&self.env, &device, "available").await;
        (device, uuid)
    }

    /// What connector-slurm would publish of a registered, healthy node.
    async fn slurm_healthy(&self, name: &str) {
        slurm_healthy(&self.env, name).await;
    }

    async fn mtc(&self, devices: &[String], f: impl FnOnce(&mut v1::CreateJobRequest)) -> v1::Job {
        let job = create_with(&self.env, "move_to_test_cluster", devices, f)
            .await
            .expect("job created");
        job_terminal(&self.env, &job.id, WITHIN).await
    }

    async fn stop(self) {
        self.mesh.stop(self.ironic, self.env).await;
    }
}

/// The whole move against the real slurmrestd (SLURM 22.05, v0.0.38),
/// whose `gpu01` is idle: cordon, lease, image, registered, validation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_to_test_cluster_takes_a_proven_node_into_validation() {
    let slurm = fleet_testkit::slurm::RealSlurm::connect().await;
    let m = Mtc::start(Some(slurm.site_config())).await;
    let (device, uuid) = m.ready_device("gpu01").await;
    m.slurm_healthy("gpu01").await;

    let job = m.mtc(std::slice::from_ref(&device), |_| {}).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    let (lessee, traits) = m.ironic.lessee_and_traits(&uuid).await;
    assert_eq!(lessee, MAINT, "the SLURM lease");
    assert!(!traits.iter().any(|t| t == READY), "cordoned: {traits:?}");
    let n = m.ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "active", "{n}");
    assert_eq!(n["instance_info"]["image_source"], SLURM_IMAGE, "{n}");
    assert_eq!(n["instance_uuid"].as_str().map(str::len), Some(36), "{n}");
    assert_eq!(
        m.env.device_field(&device, "operational_status").await,
        "validation"
    );
    m.stop().await;
}

/// "cordon_only returns before the adopt and is exempt": an unproven
/// device is admitted, loses the trait, and nothing else is written (no
/// slurmrestd or SLURM image is needed). Without `cordon_only` the same
/// device is refused at admission for its missing proof.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordon_only_removes_the_trait_and_writes_nothing_else() {
    let m = Mtc::start(None).await;
    let uuid = m.ironic.available_node(&unique("cordon")).await;
    m.ironic.add_trait(&uuid, READY).await;
    let device = device_for(&m.env, "s1", "gpu-cordon", &uuid).await;
    mirrored(&m.env, &device, "available").await;

    let refused = create(
        &m.env,
        "move_to_test_cluster",
        std::slice::from_ref(&device),
    )
    .await
    .unwrap_err();
    let fleet_workflow_client::WorkflowError::Ineligible { refusals, .. } = &refused else {
        panic!("expected INELIGIBLE, got {refused:?}")
    };
    assert_eq!(
        refusals[0].refusal, "enrollment_proof_missing",
        "{refusals:?}"
    );

    let job = m
        .mtc(std::slice::from_ref(&device), |r| r.cordon_only = true)
        .await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    let (lessee, traits) = m.ironic.lessee_and_traits(&uuid).await;
    assert!(!traits.iter().any(|t| t == READY), "{traits:?}");
    assert!(lessee.is_null(), "no lease: {lessee}");
    let n = m.ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "available");
    assert!(n["instance_uuid"].is_null(), "{n}");
    m.stop().await;
}

/// A v0.0.40 slurmrestd of the test's own: nodes whose state the test
/// sets; a RESUME clears the drain (as slurmctld does), recorded.
#[derive(Clone, Default)]
struct Slurm40 {
    nodes: Arc<Mutex<Vec<(String, Vec<String>, String)>>>,
    updates: Arc<Mutex<Vec<(String, Value)>>>,
}

impl Slurm40 {
    async fn start(&self) -> (MockServer, fleet_slurm::SiteConfig) {
        let server = MockServer::start().await;
        Mock::given(path_regex(r"^/slurm/v0\.0\.40/node/[^/]+$"))
            .respond_with(self.clone())
            .mount(&server)
            .await;
        let config = fleet_slurm::SiteConfig {
            url: server.uri(),
            api_version: "v0.0.40".into(),
            ..Default::default()
        };
        (server, config)
    }

    fn set(&self, name: &str, states: &[&str], reason: &str) {
        let mut nodes = self.nodes.lock().unwrap();
        nodes.retain(|(n, _, _)| n != name);
        nodes.push((
            name.into(),
            states.iter().map(|s| s.to_string()).collect(),
            reason.into(),
        ));
    }

    fn updates_of(&self, name: &str) -> Vec<Value> {
        self.updates
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, b)| b.clone())
            .collect()
    }
}

impl Respond for Slurm40 {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let name = request
            .url
            .path()
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string();
        let mut nodes = self.nodes.lock().unwrap();
        let Some(node) = nodes.iter_mut().find(|(n, _, _)| *n == name) else {
            return ResponseTemplate::new(200).set_body_json(json!({
                "nodes": [],
                "errors": [{"error": "Invalid node name specified", "error_number": 2018}]
            }));
        };
        if request.method.as_str() == "POST" {
            let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
            if body["state"] == json!(["RESUME"]) {
                node.1.retain(|s| s != "DRAIN" && s != "DOWN");
                if node.1.is_empty() {
                    node.1.push("IDLE".into());
                }
                node.2.clear();
            }
            self.updates.lock().unwrap().push((name, body));
            return ResponseTemplate::new(200).set_body_json(json!({"errors": []}));
        }
        let (n, states, reason) = node.clone();
        ResponseTemplate::new(200).set_body_json(json!({
            "nodes": [{"name": n, "state": states, "reason": reason}],
            "errors": []
        }))
    }
}

/// "A 200 is never trusted": the workflow resumes a node drained for a
/// reason it owns (a `fleet:` comment), then reads it idle; a node an
/// operator drained ("bad dimm") is not the workflow's to clear and fails
/// closed with nothing sent to SLURM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_the_workflow_owns_is_resumed_and_an_operators_is_not() {
    let slurm = Slurm40::default();
    let (_server, config) = slurm.start().await;
    let m = Mtc::start(Some(config)).await;
    let (ours, _) = m.ready_device("gpu-ours").await;
    let (theirs, theirs_uuid) = m.ready_device("gpu-theirs").await;
    slurm.set(
        "gpu-ours",
        &["IDLE", "DRAIN"],
        "fleet:move_to_test_cluster:job_old",
    );
    slurm.set("gpu-theirs", &["IDLE", "DRAIN"], "bad dimm, ticket 42");
    m.slurm_healthy("gpu-ours").await;

    let job = m.mtc(&[ours.clone(), theirs.clone()], |_| {}).await;
    let by_id = |id: &str| job.devices.iter().find(|d| d.device_id == id).unwrap();
    assert_eq!(by_id(&ours).status, "succeeded", "{:?}", job.devices);
    let resumes = slurm.updates_of("gpu-ours");
    assert_eq!(resumes.len(), 1, "one RESUME: {resumes:?}");
    assert_eq!(resumes[0]["state"], json!(["RESUME"]));
    assert!(
        resumes[0]["comment"]
            .as_str()
            .is_some_and(|c| c.starts_with("fleet:move_to_test_cluster:")),
        "{resumes:?}"
    );
    assert_eq!(by_id(&theirs).status, "failed");
    assert_eq!(
        by_id(&theirs).failure_code,
        "SLURM_NODE_DRAINED_BY_OPERATOR"
    );
    assert!(slurm.updates_of("gpu-theirs").is_empty(), "nothing sent");
    // The operator's node was imaged (the adopt reads SLURM after the
    // image): its lease is the SLURM one, which a re-run keeps.
    let (lessee, _) = m.ironic.lessee_and_traits(&theirs_uuid).await;
    assert_eq!(lessee, MAINT);
    m.stop().await;
}

/// "force_reclaim ... deletes the customer instance before the adopt":
/// without it a node bound to a customer's instance fails with nothing
/// written; with it the instance is torn down and the move completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_instance_is_reclaimed_only_with_force_reclaim() {
    let slurm = Slurm40::default();
    let (_server, config) = slurm.start().await;
    let m = Mtc::start(Some(config)).await;
    let (device, uuid) = m.ready_device("gpu-cust").await;
    slurm.set("gpu-cust", &["IDLE"], "");
    m.slurm_healthy("gpu-cust").await;
    // A customer's instance, deployed outside the workflow.
    let customer = fleet_testkit::ironic::random_uuid();
    m.ironic
        .patch(
            &uuid,
            json!([
                {"op": "add", "path": "/instance_uuid", "value": customer},
                {"op": "add", "path": "/instance_info/image_source", "value": "http://images.invalid/customer.qcow2"},
            ]),
        )
        .await;
    provisioned(&m.ironic, &uuid, "active", "active").await;

    let job = m.mtc(std::slice::from_ref(&device), |_| {}).await;
    assert_eq!(job.status, "failed");
    assert_eq!(job.devices[0].failure_code, "MTC_CUSTOMER_INSTANCE_PRESENT");
    let n = m.ironic.node(&uuid).await;
    assert_eq!(n["instance_uuid"], customer.as_str(), "untouched: {n}");
    assert_eq!(n["provision_state"], "active");
    assert!(n["lessee"].is_null(), "no lease: {n}");

    let job = m
        .mtc(std::slice::from_ref(&device), |r| r.force_reclaim = true)
        .await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    let n = m.ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "active", "{n}");
    assert_ne!(n["instance_uuid"], customer.as_str(), "reclaimed: {n}");
    assert_eq!(n["instance_info"]["image_source"], SLURM_IMAGE, "{n}");
    assert_eq!(n["lessee"], MAINT);
    m.stop().await;
}

/// At a site with Nova and Placement: the customer-ready trait leaves the
/// node's Placement resource provider; `force_reclaim` deletes the
/// customer's Nova server (never Ironic behind Nova's back) and waits for
/// the node; the SLURM image is a Nova server created with the SLURM
/// credential on the node, with the proof re-read before each write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_nova_site_the_customer_server_is_deleted_and_the_slurm_image_is_a_nova_server() {
    let slurm = Slurm40::default();
    let (_server, config) = slurm.start().await;
    let nova = fleet_testkit::nova::FakeNova::start().await;
    let placement = fleet_testkit::placement::FakePlacement::start().await;
    let m = Mtc::start_nova(config, &nova, &placement).await;
    let uuid = m.ironic.available_node(&unique("nova-mtc")).await;
    placement.provider(&uuid, &[READY, "CUSTOM_GPU"]);
    let device = proven_device(&m.env, "s1", "gpu-nova-mtc", &uuid, 0).await;
    mirrored(&m.env, &device, "available").await;
    slurm.set("gpu-nova-mtc", &["IDLE"], "");
    m.slurm_healthy("gpu-nova-mtc").await;
    // A customer's server on the node, deployed by Nova.
    let customer = nova.place("customer-vm", &uuid, "BUILD");
    m.ironic.wait_state(&uuid, "active").await;
    assert_eq!(
        m.ironic.node(&uuid).await["instance_uuid"],
        customer.as_str()
    );

    let job = m
        .mtc(std::slice::from_ref(&device), |r| r.force_reclaim = true)
        .await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    assert_eq!(
        placement.traits(&uuid).unwrap(),
        vec!["CUSTOM_GPU".to_string()],
        "cordoned in Placement"
    );
    let servers = nova.servers();
    assert!(
        !servers.iter().any(|s| s.id == customer),
        "reclaimed: {servers:?}"
    );
    assert_eq!(nova.deletes(), 1);
    let ours: Vec<_> = servers
        .iter()
        .filter(|s| s.name == "gpu-nova-mtc")
        .collect();
    assert_eq!(ours.len(), 1, "{servers:?}");
    assert_eq!(
        (ours[0].image.as_str(), ours[0].status.as_str()),
        ("slurm-test-cluster", "ACTIVE")
    );
    let n = m.ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "active", "{n}");
    assert_eq!(n["instance_uuid"], ours[0].id.as_str(), "{n}");
    assert_eq!(n["lessee"], MAINT);
    assert_eq!(
        m.env.device_field(&device, "operational_status").await,
        "validation"
    );
    m.stop().await;
}
