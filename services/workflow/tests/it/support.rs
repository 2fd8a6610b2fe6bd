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

pub fn site_config(ironic: &RealIronic) -> fleet_runtime::config::WorkflowSiteConfig {
    fleet_runtime::config::WorkflowSiteConfig {
        openstack: fleet_runtime::connectors::OpenstackSiteConfig {
            ironic_url: ironic.url.clone(),
            placement_enabled: false,
            ..Default::default()
        },
        image_source: "http://images.invalid/ubuntu-22.04.qcow2".into(),
        image_checksum: "0123456789abcdef0123456789abcdef".into(),
        config_drive_public_keys: vec![
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAItest fleet@test".into()
        ],
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
            cordon_only: false,
        })
        .await
}

/// connector-openstack reading the real Ironic for site `s1` (keyed by node
/// name), so the devices' Ironic mirror reaches the hub as in production.
pub fn start_openstack_connector(
    env: &TestEnv,
    ironic: &RealIronic,
) -> (
    fleet_runtime::shutdown::ShutdownTrigger,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let mut config = env.config.clone();
    let c = &mut config.connectors.openstack;
    c.listen = "127.0.0.1:0".into();
    c.poll.resync_interval_secs = 0.3;
    c.poll.jitter = 0.0;
    c.poll.resync_spread = 0.0;
    c.sites.insert(
        "s1".into(),
        fleet_runtime::connectors::OpenstackSiteConfig {
            ironic_url: ironic.url.clone(),
            placement_enabled: false,
            ..Default::default()
        },
    );
    let (trigger, shutdown) = fleet_runtime::Shutdown::new();
    let task = tokio::spawn(fleet_connector_openstack::run(config, shutdown));
    (trigger, task)
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
