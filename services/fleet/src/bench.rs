//! `fleet bench ...`: benchmarks against the local NATS and PostgreSQL.

use crate::config::FleetConfig;
use clap::Subcommand;

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

/// A benchmark's own database, subject root and stream prefix, removed at
/// the end unless the run is kept.
pub(crate) struct Fresh {
    pub config: FleetConfig,
    db_name: String,
    admin_url: String,
}

impl Fresh {
    /// `base` pointed at a new database `fleet_bench_<what>_<id>` (migrated)
    /// and a subject root and stream prefix of its own.
    pub async fn new(base: &FleetConfig, what: &str) -> anyhow::Result<Fresh> {
        let mut fresh = Fresh::isolated(base, &format!("fleet_bench_{what}"))?;
        let db = &mut fresh.config.database;
        db.max_connections = db.max_connections.max(24);
        crate::migrate(&fresh.config).await?;
        Ok(fresh)
    }

    /// `base` pointed at a new database `<db_prefix>_<id>` (not created
    /// yet) and a subject root and stream prefix of its own.
    pub fn isolated(base: &FleetConfig, db_prefix: &str) -> anyhow::Result<Fresh> {
        use anyhow::Context;
        let id = ulid::Ulid::new().to_string().to_lowercase();
        let mut config = base.clone();
        let db_name = format!("{db_prefix}_{id}");
        let (prefix, _) = base
            .database
            .url
            .rsplit_once('/')
            .context("database.url has no database name")?;
        config.database.url = format!("{prefix}/{db_name}");
        config.nats.subject_root = format!("bench{id}.fleet");
        config.nats.radar_root = format!("bench{id}.radar");
        config.nats.stream_prefix = format!("BENCH{}_", id.to_uppercase());
        Ok(Fresh {
            config,
            db_name,
            admin_url: format!("{prefix}/postgres"),
        })
    }

    /// Deletes the mesh's streams (and `extra`) and drops the database.
    pub async fn remove(&self, extra: &[String]) {
        if let Ok(nats) = fleet_bus::connect_now(&self.config.nats, "fleet-bench").await {
            let js = async_nats::jetstream::new(nats);
            let names = fleet_bus::StreamNames::new(&self.config.nats.stream_prefix);
            for s in names.mesh(self.config.nats.partitions).iter().chain(extra) {
                let _ = js.delete_stream(s).await;
            }
        }
        self.drop_database().await;
    }

    /// Drops the database (forcing its connections closed).
    pub async fn drop_database(&self) {
        if let Ok(admin) = fleet_store::connect(&self.admin_url, 1).await {
            let _ = sqlx::query(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.db_name
            ))
            .execute(&admin)
            .await;
        }
    }
}

pub async fn run(config: FleetConfig, what: BenchCommand) -> anyhow::Result<()> {
    match what {
        BenchCommand::Hub(b) => hub::run(config, b).await,
        BenchCommand::Placer(b) => placer::run(config, b).await,
        BenchCommand::Api(b) => api::run(config, b).await,
        BenchCommand::Workflow(b) => workflow::run(config, b).await,
    }
}
