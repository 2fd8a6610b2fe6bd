pub use fleet_testkit::ironic::RealIronic;
pub use fleet_testkit::*;

use std::time::Duration;

use fleet_proto::v1;
use serde_json::json;

/// The standalone-Ironic site the tests image at: `s1` with
/// `placement_enabled = false`, its Ironic the real one.
pub async fn standalone_site(env: &TestEnv) {
    sqlx::query("UPDATE sites SET placement_enabled = false WHERE id = 's1'")
        .execute(&env.pool)
        .await
        .unwrap();
}

/// The customer-ready trait (the workflow service's default
/// `customer_ready_trait`).
pub const READY: &str = "CUSTOM_CUSTOMER_READY";

/// The projects a node's lease moves between at the Nova site.
pub const ENROL_PROJECT: &str = "enrol-project";
pub const SLURM_PROJECT: &str = "slurm-project";

/// The Nova arm's settings for `nova`: the enrol and SLURM projects' test
/// values, `image` the `gpu_compute` role's.
pub fn nova_arm(
    nova: &fleet_testkit::nova::FakeNova,
    image: &str,
) -> fleet_workflow::NovaArmConfig {
    fleet_workflow::NovaArmConfig {
        credential: fleet_openstack::SiteConfig {
            nova_url: nova.url.clone(),
            ..Default::default()
        },
        enrol_project_id: ENROL_PROJECT.into(),
        network_id: "slurm-net".into(),
        key_name: "slurm-key".into(),
        roles: [(
            "gpu_compute".to_string(),
            fleet_workflow::RoleImage {
                image: image.into(),
                flavor: "bm.gpu".into(),
            },
        )]
        .into_iter()
        .collect(),
    }
}

pub fn site_config(ironic: &RealIronic) -> fleet_workflow::SiteConfig {
    fleet_workflow::SiteConfig {
        openstack: fleet_openstack::SiteConfig {
            ironic_url: ironic.url.clone(),
            placement_enabled: false,
            ..Default::default()
        },
        image_source: "http://images.invalid/ubuntu-22.04.qcow2".into(),
        image_checksum: "0123456789abcdef0123456789abcdef".into(),
        config_drive_public_keys: vec![
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAItest fleet@test".into()
        ],
        ..Default::default()
    }
}

/// A device at `site` bound to Ironic node `uuid`.
pub async fn device_for(env: &TestEnv, site: &str, name: &str, uuid: &str) -> String {
    bound_device(env, site, name, uuid, 0, None).await
}

/// A device named `name` at `site` bound to node `uuid` (NetBox id
/// `netbox_id`, 0 for none), with the enrollment proof for that node.
pub async fn proven_device(
    env: &TestEnv,
    site: &str,
    name: &str,
    uuid: &str,
    netbox_id: i64,
) -> String {
    bound_device(env, site, name, uuid, netbox_id, Some("enrollment:test")).await
}

/// A device bound to node `uuid`, with the enrollment proof for that node
/// from `proof_source` (`None`: none).
async fn bound_device(
    env: &TestEnv,
    site: &str,
    name: &str,
    uuid: &str,
    netbox_id: i64,
    proof_source: Option<&str>,
) -> String {
    let device = env
        .create_device_with(v1::CreateDevice {
            site: site.into(),
            name: name.into(),
            infrastructure_ref: uuid.into(),
            netbox_id,
            ..Default::default()
        })
        .await;
    if let Some(source) = proof_source {
        prove(env, &device, uuid, source).await;
    }
    device
}

/// The hub's enrolled proof of `device` for `result_ref`, from `source`.
pub async fn prove(env: &TestEnv, device: &str, result_ref: &str, source: &str) {
    let proof = env
        .command(
            "enrollment_proof",
            0,
            v1::hub_command::Command::EnrollmentProof(v1::EnrollmentProof {
                device_id: device.into(),
                outcome: "enrolled".into(),
                result_ref: result_ref.into(),
                proof_source: source.into(),
                pinned_infrastructure_ref: result_ref.into(),
            }),
        )
        .await;
    assert!(proof.error.is_none(), "enrollment_proof: {:?}", proof.error);
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", ulid::Ulid::new().to_string().to_lowercase())
}

pub async fn create(
    env: &TestEnv,
    workflow: &str,
    devices: &[String],
) -> Result<v1::Job, fleet_workflow_client::WorkflowError> {
    create_with(env, workflow, devices, |_| {}).await
}

/// A `workflow` job over `devices`, its request as `f` leaves it.
pub async fn create_with(
    env: &TestEnv,
    workflow: &str,
    devices: &[String],
    f: impl FnOnce(&mut v1::CreateJobRequest),
) -> Result<v1::Job, fleet_workflow_client::WorkflowError> {
    let mut r = v1::CreateJobRequest {
        workflow: workflow.into(),
        device_ids: devices.to_vec(),
        created_by: "test".into(),
        ..Default::default()
    };
    f(&mut r);
    workflow_client(env).create_job(&r).await
}

/// A `workflow` job over `devices` created and waited for (up to
/// `within`) until it ends.
pub async fn run_job(
    env: &TestEnv,
    workflow: &str,
    devices: &[impl AsRef<str>],
    within: Duration,
) -> v1::Job {
    let devices: Vec<String> = devices.iter().map(|d| d.as_ref().to_string()).collect();
    let job = create(env, workflow, &devices)
        .await
        .unwrap_or_else(|e| panic!("{workflow} job created: {e}"));
    job_terminal(env, &job.id, within).await
}

/// Asserts the job's first device failed with `code`, its message saying
/// `words`.
pub fn assert_failed(job: &v1::Job, code: &str, words: &str) {
    let d = &job.devices[0];
    assert_eq!(d.failure_code, code, "{d:?}");
    assert!(d.failure_message.contains(words), "{}", d.failure_message);
}

/// Asks Ironic to move node `uuid` to `target` and waits until it rests in
/// `state`.
pub async fn provisioned(ironic: &RealIronic, uuid: &str, target: &str, state: &str) {
    let (s, v) = ironic.provision(uuid, json!({ "target": target })).await;
    assert_eq!(s, 202, "{v}");
    ironic.wait_state(uuid, state).await;
}

/// `SELECT count(*) ...` (`$1` is `id`, when given).
pub async fn count(env: &TestEnv, sql: &str, id: Option<&str>) -> i64 {
    let q = sqlx::query_scalar::<_, i64>(sql);
    let q = match id {
        Some(id) => q.bind(id),
        None => q,
    };
    q.fetch_one(&env.pool).await.unwrap()
}

/// What connector-slurm would publish of a registered, healthy node
/// named `name` at `s1`.
pub async fn slurm_healthy(env: &TestEnv, name: &str) {
    env.publish_snapshot(&snapshot(
        "slurm",
        "s1",
        "name",
        name,
        chrono::Utc::now(),
        vec![
            cond("SlurmRegistered", "True", "Registered"),
            cond("SlurmNodeHealthy", "True", "Healthy"),
        ],
    ))
    .await;
}

/// Waits until the hub mirrors `device`'s node in `state`, out of
/// maintenance.
pub async fn mirrored(env: &TestEnv, device: &str, state: &str) {
    let want = state.to_string();
    eventually(&format!("{device} mirrored as {state}"), || async {
        let s = env
            .device_field(device, "coalesce(ironic_provision_state, '')")
            .await;
        let m = env
            .device_field(device, "coalesce(ironic_maintenance::text, '')")
            .await;
        (s == want && m == "false").then_some(())
    })
    .await;
}

/// How a mesh's connector-openstack reads the real Ironic besides its URL.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reader {
    /// The project whose lease puts a node in the maintenance pool (empty:
    /// none).
    pub maintenance_project: &'static str,
    /// Devices keyed by their `infrastructure_ref`, not their node's name.
    pub by_ref: bool,
}

/// What every Ironic test runs: the real Ironic, a test environment whose
/// `s1` is a standalone-Ironic site, the hub, connector-openstack reading
/// that Ironic, and the workflow service configured for it.
pub struct Mesh {
    pub site: fleet_workflow::SiteConfig,
    stops: Services,
}

impl Mesh {
    pub async fn start() -> (RealIronic, TestEnv, Mesh) {
        let ironic = RealIronic::connect().await;
        let site = site_config(&ironic);
        Self::start_site(ironic, site, false).await
    }

    /// The same with the workflow service reaching Ironic at `ironic_url`
    /// (a proxy of the test's own in front of the real one);
    /// connector-openstack reads the real one.
    pub async fn start_via(ironic: RealIronic, ironic_url: &str) -> (RealIronic, TestEnv, Mesh) {
        let mut site = site_config(&ironic);
        site.openstack.ironic_url = ironic_url.into();
        Self::start_site(ironic, site, false).await
    }

    /// The same with `s1` a full-OpenStack site (`placement_enabled`)
    /// whose Nova is `nova`: Image and Unimage run their Nova arm.
    pub async fn start_nova(nova: &fleet_testkit::nova::FakeNova) -> (RealIronic, TestEnv, Mesh) {
        let ironic = RealIronic::connect().await;
        let mut site = site_config(&ironic);
        site.openstack.placement_enabled = true;
        site.openstack.maintenance_project_id = SLURM_PROJECT.into();
        site.nova = nova_arm(nova, "slurm-gpu-image");
        Self::start_site(ironic, site, true).await
    }

    async fn start_site(
        ironic: RealIronic,
        site: fleet_workflow::SiteConfig,
        placement: bool,
    ) -> (RealIronic, TestEnv, Mesh) {
        Self::start_with(ironic, site, placement, Reader::default(), |_| {}).await
    }

    /// The mesh for `site` (`s1` standalone unless `placement`), its
    /// connector-openstack reading as `reader` says, the workflow service
    /// with `f`'s settings besides.
    pub async fn start_with(
        ironic: RealIronic,
        site: fleet_workflow::SiteConfig,
        placement: bool,
        reader: Reader,
        f: impl FnOnce(&mut fleet_workflow::Config),
    ) -> (RealIronic, TestEnv, Mesh) {
        let env = TestEnv::new().await;
        if !placement {
            standalone_site(&env).await;
        }
        let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
        let (os_trigger, os_task) =
            fleet_testkit::ironic::start_openstack_connector_with(&env, &ironic, 0.3, |c, s| {
                if reader.by_ref {
                    c.key_by = "infrastructure_ref".into();
                }
                if !reader.maintenance_project.is_empty() {
                    s.maintenance_project_id = reader.maintenance_project.into();
                }
            });
        let os_task = tokio::spawn(async move {
            os_task.await.unwrap().expect("connector-openstack runs");
        });
        let s = site.clone();
        let (_w, trigger, task) = start_workflow(&env, |c| {
            c.sites.insert("s1".into(), s);
            f(c);
        })
        .await;
        let stops = vec![
            (trigger, task),
            (os_trigger, os_task),
            (hub_trigger, hub_task),
        ]
        .into();
        (ironic, env, Mesh { site, stops })
    }

    /// Stops the services (the workflow service first), removes the
    /// test's nodes and its environment.
    pub async fn stop(self, ironic: RealIronic, env: TestEnv) {
        self.stops.stop().await;
        ironic.cleanup().await;
        env.cleanup().await;
    }
}
