//! `fleet bench ...`: benchmarks against the local NATS and PostgreSQL.

use clap::Subcommand;
use fleet_runtime::FleetConfig;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// The hub: sustained snapshots/s, publish-to-StatusChanged latency,
    /// peak RSS, rows per snapshot, and the naive and raw references.
    Hub(crate::bench::hub::HubBench),
    /// The placer: allocations/s with concurrent requesters, double bookings (must be 0).
    Placer(crate::bench::placer::PlacerBench),
    /// The operator API: filtered device pages and details under load.
    Api(crate::bench::api::ApiBench),
    /// The workflow service: an impairment cordon and release over N
    /// devices against the simulated Placement (devices/s each way).
    Workflow(crate::bench::workflow::WorkflowBench),
}

pub mod api;
pub mod hub;
pub mod placer;
pub mod workflow;

pub async fn run(config: FleetConfig, what: BenchCommand) -> anyhow::Result<()> {
    match what {
        BenchCommand::Hub(b) => hub::run(config, b).await,
        BenchCommand::Placer(b) => placer::run(config, b).await,
        BenchCommand::Api(b) => api::run(config, b).await,
        BenchCommand::Workflow(b) => workflow::run(config, b).await,
    }
}
