//! The workflow service (`spec/consumers.md`, "workflow"; seed 002, "Job
//! status", "Job device status", "Failure codes"): jobs over many devices,
//! each device running one workflow of idempotent activities against the
//! real external systems.
//!
//! - A job is created over `<root>.workflow.cmd.create_job` after one
//!   eligibility pass over every device (`fleet_domain::eligibility`); a
//!   refusal refuses the whole job and writes nothing.
//! - The job, its devices and each device's last completed step are rows
//!   in PostgreSQL owned by this service's role; each device's work is one
//!   message on the `JOBS` work queue, written to `workflow_outbox` in the
//!   job's transaction.
//! - A worker that dies leaves its message unacknowledged; it is delivered
//!   again after `workflow.ack_wait` and the next worker resumes the
//!   device from a fresh read of the external system (every decision is
//!   taken on a read, so no write the system already shows is repeated).
//!
//! - Impairment events (`impairment`): the cordon and release of seed 002,
//!   each device one unit of work on `JOBS` like a job's.
//!
//! The API calls it through `fleet_workflow_client::WorkflowClient`.

pub(crate) mod activities;
mod config;
pub(crate) mod fabric;
pub(crate) mod flows;
pub(crate) mod holds;
pub(crate) mod impairment;
pub(crate) mod impairment_store;
pub(crate) mod metrics;
pub(crate) mod service;
pub(crate) mod store;
pub(crate) mod storm;
pub(crate) mod waits;
pub(crate) mod worker;

use std::sync::Arc;

use fleet_runtime::Common;
use tokio::sync::Notify;

pub use config::{
    Config, FabricConfig, NovaArmConfig, RoleImage, SiteConfig, SiteFabricConfig, StormGuardConfig,
};
pub use service::{run, run_with};

/// The service's outbox: device work to `JOBS`.
pub(crate) const OUTBOX: fleet_outbox::Outbox = fleet_outbox::Outbox {
    table: "workflow_outbox",
    msg_id_prefix: "workflow-",
    span: |subject| tracing::info_span!("workflow.relay", subject = %subject),
};

pub struct Workflow {
    pub common: Common,
    pub config: Config,
    /// PostgreSQL, NATS, JetStream, the subjects and stream names.
    pub(crate) deps: fleet_store::Deps,
    pub(crate) metrics: metrics::WorkflowMetrics,
    pub(crate) sites: activities::Sites,
    /// Impairment holds through the hub's `impairment_holds`, batched.
    pub(crate) holds: holds::Holds,
    /// Every other write the workflows make to device state (proofs,
    /// latches) goes through the hub's commands.
    pub(crate) hub: fleet_hub_client::HubClient,
    /// Runs waiting on what the hub derives, woken from STATUS.
    pub(crate) waits: waits::Waits,
    /// `workflow.netbox`, for Release's re-read.
    pub(crate) netbox: Option<activities::NetboxClient>,
    relay_wake: Notify,
}

impl Workflow {
    /// Connects, checks the schema and the site configuration, and waits
    /// for the hub's `JOBS` stream.
    pub async fn connect(common: Common, config: Config) -> anyhow::Result<Arc<Workflow>> {
        let sites = activities::Sites::new(&config)?;
        let netbox = activities::NetboxClient::new(&config.netbox, &config)?;
        let deps = fleet_store::Deps::connect(&common, fleet_store::Role::Workflow).await?;
        fleet_bus::await_streams(&deps.js, &[deps.streams.jobs()], std::future::pending()).await;
        let hub = fleet_hub_client::HubClient::new(
            deps.nats.clone(),
            deps.subjects.clone(),
            config.hub_timeout.max(std::time::Duration::from_secs(1)),
        );
        let holds =
            holds::Holds::start(hub.clone(), config.hold_batch_max, config.hold_batch_linger);
        Ok(Arc::new(Workflow {
            common,
            config,
            deps,
            metrics: metrics::WorkflowMetrics::new(),
            sites,
            holds,
            hub,
            waits: Default::default(),
            netbox,
            relay_wake: Notify::new(),
        }))
    }

    /// The relay publishes what a transaction just queued.
    pub(crate) fn wake_relay(&self) {
        self.relay_wake.notify_one();
    }
}
