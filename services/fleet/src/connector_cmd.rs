//! `fleet connector <netbox|openstack|slurm|health|borneo|fabric>`: one subcommand per connector
//! service, each a library crate with `run(common, config, shutdown)`.

use crate::config::FleetConfig;
use fleet_runtime::Shutdown;

#[derive(clap::Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectorCommand {
    /// NetBox devices: inventory status, provisioning tags, device creation.
    Netbox,
    /// Keystone, Ironic and Placement: the six openstack conditions.
    Openstack,
    /// slurmrestd nodes: SlurmRegistered, SlurmNodeHealthy, state tokens.
    Slurm,
    /// Prometheus/Mimir health series: chassis_health and the ten health conditions.
    Health,
    /// The Borneo partner custody API: custody snapshots by serial.
    Borneo,
    /// Switch VRFs (NVUE), NetBox cables and NMX-M partitions: the live-fabric observations.
    Fabric,
}

impl ConnectorCommand {
    /// Every connector, each with the name `fleet dev` gives its task.
    pub const ALL: [(ConnectorCommand, &'static str); 6] = [
        (ConnectorCommand::Netbox, "connector-netbox"),
        (ConnectorCommand::Openstack, "connector-openstack"),
        (ConnectorCommand::Slurm, "connector-slurm"),
        (ConnectorCommand::Health, "connector-health"),
        (ConnectorCommand::Borneo, "connector-borneo"),
        (ConnectorCommand::Fabric, "connector-fabric"),
    ];
}

pub async fn run(
    config: FleetConfig,
    which: ConnectorCommand,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let common = config.common();
    let c = config.connectors;
    match which {
        ConnectorCommand::Netbox => fleet_connector_netbox::run(common, c.netbox, shutdown).await,
        ConnectorCommand::Openstack => {
            fleet_connector_openstack::run(common, c.openstack, shutdown).await
        }
        ConnectorCommand::Slurm => fleet_connector_slurm::run(common, c.slurm, shutdown).await,
        ConnectorCommand::Health => fleet_connector_health::run(common, c.health, shutdown).await,
        ConnectorCommand::Borneo => fleet_connector_borneo::run(common, c.borneo, shutdown).await,
        ConnectorCommand::Fabric => fleet_connector_fabric::run(common, c.fabric, shutdown).await,
    }
}
