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
    stops: Vec<(
        fleet_runtime::shutdown::ShutdownTrigger,
        tokio::task::JoinHandle<()>,
    )>,
}

impl Mesh {
    pub async fn start() -> (RealIronic, TestEnv, Mesh) {
        let ironic = RealIronic::connect().await;
        let env = TestEnv::new().await;
        standalone_site(&env).await;
        let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
        let (os_trigger, os_task) =
            fleet_testkit::ironic::start_openstack_connector(&env, &ironic, 0.3);
        let os_task = tokio::spawn(async move {
            os_task.await.unwrap().expect("connector-openstack runs");
        });
        let site = site_config(&ironic);
        let s = site.clone();
        let (_w, trigger, task) = start_workflow(&env, |c| {
            c.sites.insert("s1".into(), s);
        })
        .await;
        let stops = vec![
            (trigger, task),
            (os_trigger, os_task),
            (hub_trigger, hub_task),
        ];
        (ironic, env, Mesh { site, stops })
    }

    /// Stops the services (the workflow service first), removes the
    /// test's nodes and its environment.
    pub async fn stop(self, ironic: RealIronic, env: TestEnv) {
        for (trigger, task) in self.stops {
            trigger.trigger();
            task.await.unwrap();
        }
        ironic.cleanup().await;
        env.cleanup().await;
    }
}
