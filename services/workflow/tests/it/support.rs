pub use fleet_testkit::ironic::RealIronic;
pub use fleet_testkit::*;

use fleet_proto::v1;

/// The standalone-Ironic site the tests image at: `s1` with
/// `placement_enabled = false`, its Ironic the real one.
pub async fn standalone_site(env: &TestEnv) {
    sqlx::query("UPDATE sites SET placement_enabled = false WHERE id = 's1'")
        .execute(&env.pool)
        .await
        .unwrap();
}

/// The projects a node's lease moves between at the Nova site.
pub const ENROL_PROJECT: &str = "enrol-project";
pub const SLURM_PROJECT: &str = "slurm-project";

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
    let reply = env
        .command(
            "create_device",
            0,
            v1::hub_command::Command::CreateDevice(v1::CreateDevice {
                site: site.into(),
                name: name.into(),
                infrastructure_ref: uuid.into(),
                ..Default::default()
            }),
        )
        .await;
    assert!(reply.error.is_none(), "create_device: {:?}", reply.error);
    device_of(&reply).id
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
    let reply = env
        .command(
            "create_device",
            0,
            v1::hub_command::Command::CreateDevice(v1::CreateDevice {
                site: site.into(),
                name: name.into(),
                infrastructure_ref: uuid.into(),
                netbox_id,
                ..Default::default()
            }),
        )
        .await;
    assert!(reply.error.is_none(), "create_device: {:?}", reply.error);
    let device = device_of(&reply).id;
    let proof = env
        .command(
            "enrollment_proof",
            0,
            v1::hub_command::Command::EnrollmentProof(v1::EnrollmentProof {
                device_id: device.clone(),
                outcome: "enrolled".into(),
                result_ref: uuid.into(),
                proof_source: "enrollment:test".into(),
                pinned_infrastructure_ref: uuid.into(),
            }),
        )
        .await;
    assert!(proof.error.is_none(), "enrollment_proof: {:?}", proof.error);
    device
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", ulid::Ulid::new().to_string().to_lowercase())
}

pub async fn create(
    env: &TestEnv,
    workflow: &str,
    devices: &[String],
) -> Result<v1::Job, fleet_workflow_client::WorkflowError> {
    workflow_client(env)
        .create_job(&v1::CreateJobRequest {
            workflow: workflow.into(),
            device_ids: devices.to_vec(),
            created_by: "test".into(),
            ..Default::default()
        })
        .await
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
        site.nova = fleet_workflow::NovaArmConfig {
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
                    image: "slurm-gpu-image".into(),
                    flavor: "bm.gpu".into(),
                },
            )]
            .into_iter()
            .collect(),
        };
        Self::start_site(ironic, site, true).await
    }

    async fn start_site(
        ironic: RealIronic,
        site: fleet_workflow::SiteConfig,
        placement: bool,
    ) -> (RealIronic, TestEnv, Mesh) {
        let env = TestEnv::new().await;
        if !placement {
            standalone_site(&env).await;
        }
        let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
        let (os_trigger, os_task) =
            fleet_testkit::ironic::start_openstack_connector(&env, &ironic, 0.3);
        let os_task = tokio::spawn(async move {
            os_task.await.unwrap().expect("connector-openstack runs");
        });
        let s = site.clone();
        let (_w, trigger, task) = start_workflow(&env, |c| {
            c.sites.insert("s1".into(), s);
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
