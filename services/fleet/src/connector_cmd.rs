//! `fleet connector <netbox|openstack|slurm|health|borneo|fabric>`: one subcommand per connector
//! service, each a library crate with `run(config, shutdown)`.

use fleet_runtime::{FleetConfig, Shutdown};

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

pub async fn run(
    config: FleetConfig,
    which: ConnectorCommand,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    match which {
        ConnectorCommand::Netbox => fleet_connector_netbox::run(config, shutdown).await,
        ConnectorCommand::Openstack => fleet_connector_openstack::run(config, shutdown).await,
        ConnectorCommand::Slurm => fleet_connector_slurm::run(config, shutdown).await,
        ConnectorCommand::Health => fleet_connector_health::run(config, shutdown).await,
        ConnectorCommand::Borneo => fleet_connector_borneo::run(config, shutdown).await,
        ConnectorCommand::Fabric => fleet_connector_fabric::run(config, shutdown).await,
    }
}
