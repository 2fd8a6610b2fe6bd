//! The gateway (`spec/consumers.md`, "gateway"): node agent sessions over
//! NATS. An agent joins with a join token and its hardware identifiers; the
//! gateway normalises them into the hardware key
//! (`fleet_domain::hardware`), asks the hub to create the device or
//! re-join it in place, issues a credential bound to the identity
//! generation, and runs acceptance against the pool's hardware profile.
//! Sessions get a new epoch on every open; opens, heartbeats and closes
//! become `ConnectivityObservation`s on the session streams (the hub writes
//! `connectivity` and applies the liveness timeouts). Commands are relayed
//! to the agent with a deadline and a typed result; a tenant-controlled
//! device never receives platform secrets or destructive commands. Live
//! sessions are checked against PostgreSQL for identity-generation bumps,
//! and the sessions of an earlier generation are closed.
//!
//! [`sim`] is a simulated agent speaking the same protocol.

mod config;
pub(crate) mod metrics;
pub(crate) mod policy;
pub mod store;

mod batched;
mod handlers;
mod sessions;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use fleet_domain::{ConnectivityEvent, Trust};
use fleet_proto::{timestamp, v1, ErrorCode, Message};
use fleet_runtime::{Common, Shutdown};
use fleet_store::Shell;
use sqlx::PgPool;

pub use config::Config;
pub use metrics::GatewayMetrics;
use policy::{Inventory, Profile};
use sessions::Session;

/// A typed failure, answered to the agent or operator as `AgentError`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str_name())]
pub struct GatewayError {
    pub code: ErrorCode,
    pub message: String,
}

impl GatewayError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        GatewayError {
            code,
            message: message.into(),
        }
    }
    pub fn invalid(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, m)
    }
    pub fn to_proto(&self) -> v1::AgentError {
        v1::AgentError {
            code: self.code as i32,
            message: self.message.clone(),
        }
    }
}

impl From<sqlx::Error> for GatewayError {
    fn from(e: sqlx::Error) -> Self {
        tracing::error!(error = %e, "gateway database error");
        GatewayError::new(
            ErrorCode::Unavailable,
            "the gateway's database is unavailable",
        )
    }
}

impl From<fleet_bus::BusError> for GatewayError {
    fn from(e: fleet_bus::BusError) -> Self {
        tracing::error!(error = %e, "gateway bus error");
        GatewayError::new(ErrorCode::Unavailable, "the gateway cannot publish")
    }
}

/// What the agent or operator is told of a hub command that did not apply.
fn hub_error(e: fleet_hub_client::HubCallError) -> GatewayError {
    match e {
        fleet_hub_client::HubCallError::Refused { code, message } => {
            let code = match code {
                ErrorCode::Conflict | ErrorCode::InvalidState => ErrorCode::Conflict,
                ErrorCode::NotFound => ErrorCode::NotFound,
                ErrorCode::InvalidArgument => ErrorCode::InvalidArgument,
                _ => ErrorCode::Unavailable,
            };
            GatewayError::new(code, message)
        }
        e => {
            tracing::warn!(error = %e, "hub command not answered");
            GatewayError::new(ErrorCode::Unavailable, "the hub is unavailable")
        }
    }
}

pub struct Gateway {
    pub common: Common,
    pub config: Config,
    /// PostgreSQL, NATS, JetStream, the subjects and stream names.
    pub deps: fleet_store::Deps,
    pub hub: fleet_hub_client::HubClient,
    /// Joins, gathered into batched hub commands.
    joins: batched::Joins,
    /// Session opens, gathered into batched statements.
    opens: batched::Opens,
    pub gateway_id: String,
    pub metrics: GatewayMetrics,
    sessions: Mutex<HashMap<String, Session>>,
}

impl Gateway {
    pub async fn connect(common: Common, config: Config) -> anyhow::Result<Arc<Gateway>> {
        let deps = fleet_store::Deps::connect(&common, fleet_store::Role::Gateway).await?;
        // The observation streams are the hub's: wait for them and check the
        // partition count.
        fleet_bus::check_observations(&deps.js, &common.nats, std::future::pending()).await?;
        let gateway_id = if config.gateway_id.trim().is_empty() {
            format!(
                "gw-{}",
                std::env::var("HOSTNAME").unwrap_or_else(|_| "local".into())
            )
        } else {
            config.gateway_id.clone()
        };
        let hub = fleet_hub_client::HubClient::new(
            deps.nats.clone(),
            deps.subjects.clone(),
            config.hub_timeout.max(Duration::from_secs(1)),
        );
        let joins = batched::joins(
            hub.clone(),
            deps.pool.clone(),
            format!("gateway:{gateway_id}"),
            &config,
        );
        let opens = batched::opens(deps.pool.clone(), gateway_id.clone(), &config);
        Ok(Arc::new(Gateway {
            common,
            config,
            deps,
            hub,
            joins,
            opens,
            gateway_id,
            metrics: GatewayMetrics::new(),
            sessions: Mutex::new(HashMap::new()),
        }))
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A hub command over request/reply.
    async fn hub(
        &self,
        expected_version: i64,
        command: v1::hub_command::Command,
    ) -> Result<fleet_hub_client::Applied, GatewayError> {
        let actor = format!("gateway:{}", self.gateway_id);
        self.hub
            .call(&actor, expected_version, command)
            .await
            .map_err(hub_error)
    }

    /// An agent's join through the join batcher: the hub's answer and the
    /// credential issued for it.
    async fn hub_join(&self, join: v1::JoinDevice) -> Result<batched::Issued, GatewayError> {
        self.joins.ask(join).await.map_err(hub_error)?
    }

    fn device_key(site: &str, device_id: &str) -> v1::DeviceKey {
        v1::DeviceKey {
            site: site.to_string(),
            kind: "device_id".into(),
            key: device_id.to_string(),
        }
    }

    /// A session event for the hub (source `gateway`, key kind `device_id`).
    async fn publish_connectivity(
        &self,
        site: &str,
        device_id: &str,
        epoch: i64,
        event: ConnectivityEvent,
        observed_generation: i64,
        identity_generation: i64,
    ) -> Result<(), GatewayError> {
        let now = Utc::now();
        let obs = v1::ConnectivityObservation {
            device_id: device_id.to_string(),
            epoch,
            gateway_id: self.gateway_id.clone(),
            event: event.as_str().to_string(),
            observed_at: Some(timestamp(now)),
            observed_generation,
            identity_generation,
        };
        self.publish(site, device_id, now, &obs, "connectivity")
            .await
    }

    /// The gateway's snapshot: `GpuCountMismatch`, the one type it owns.
    async fn publish_gpu_condition(
        &self,
        site: &str,
        device_id: &str,
        inv: &Inventory,
        profile: Option<&Profile>,
    ) -> Result<(), GatewayError> {
        let Some((status, reason, message)) = policy::gpu_count_mismatch(inv, profile) else {
            return Ok(());
        };
        let now = Utc::now();
        let snap = v1::ConditionSnapshot {
            resource_bindings: vec![],
            source: "gateway".into(),
            device: Some(Self::device_key(site, device_id)),
            observed_at: Some(timestamp(now)),
            conditions: vec![v1::Condition {
                r#type: "GpuCountMismatch".into(),
                status: status.as_str().into(),
                reason,
                message,
            }],
            mirror: None,
        };
        self.publish(site, device_id, now, &snap, "snapshot").await
    }

    /// Publishes one observation of the device (source `gateway`) and
    /// waits for its ack; `what` names it in the error.
    async fn publish<M: Message + fleet_proto::Name>(
        &self,
        site: &str,
        device_id: &str,
        observed_at: chrono::DateTime<Utc>,
        message: &M,
        what: &str,
    ) -> Result<(), GatewayError> {
        fleet_bus::publish_observation(
            &self.deps.js,
            &self.deps.subjects,
            self.common.nats.partitions,
            "gateway",
            &Self::device_key(site, device_id),
            observed_at.timestamp_nanos_opt().unwrap_or_default(),
            &fleet_proto::schema::<M>(),
            fleet_runtime::telemetry::traceparent_of(&tracing::Span::current()).as_deref(),
            message.encode_to_vec().into(),
        )
        .await?
        .await
        .map_err(|e| GatewayError::new(ErrorCode::Unavailable, format!("{what} publish: {e}")))?;
        Ok(())
    }

    /// How long a session may be silent before the gateway forgets it (the
    /// hub has called it `lost` by then).
    fn forget_after(&self) -> Duration {
        self.common.freshness.lost_after.max(Duration::from_secs(1))
    }

    async fn identity_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        let every = self
            .config
            .identity_check_interval
            .max(Duration::from_millis(50));
        let mut pause = every;
        loop {
            tokio::select! { _ = tokio::time::sleep(pause) => {}, _ = shutdown.wait() => return }
            let started = Instant::now();
            if let Err(e) = self.check_identities().await {
                tracing::warn!(error = %e, "identity check failed; next interval retries");
            }
            // A check reads the device row of every live session, which grows
            // with the fleet: at most a tenth of the time.
            pause = fleet_runtime::pace::pause_after(every, started.elapsed(), 10);
        }
    }

    async fn resync_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        let every = self
            .config
            .snapshot_resync_interval
            .max(Duration::from_secs(1));
        let mut pause = every;
        loop {
            tokio::select! { _ = tokio::time::sleep(pause) => {}, _ = shutdown.wait() => return }
            let started = Instant::now();
            // Spread over half the interval, as the connectors spread
            // theirs; the spreading counts toward the interval.
            if let Err(e) = self.resync_conditions(every / 2, &mut shutdown).await {
                tracing::warn!(error = %e, "condition resync failed; next interval retries");
            }
            pause = every.saturating_sub(started.elapsed());
        }
    }
}

/// Runs the gateway until shutdown.
pub async fn run(common: Common, config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let gw = Gateway::connect(common, config).await?;
    run_with(gw, shutdown).await
}

pub async fn run_with(gw: Arc<Gateway>, shutdown: Shutdown) -> anyhow::Result<()> {
    let (mut shell, addr) = Shell::start(
        "gateway",
        &gw.config.listen,
        gw.metrics.registry.clone(),
        &gw.deps,
        &shutdown,
    )
    .await?;
    tracing::info!(%addr, gateway_id = %gw.gateway_id, "gateway running");
    for route in handlers::Route::ALL {
        shell.respond(
            gw.clone(),
            fleet_bus::Route {
                name: route.name(),
                subject: route.subject(&gw.deps.subjects),
                queue: route.queue(),
            },
            fleet_bus::Limits {
                concurrency: gw.config.concurrency.max(1),
                deadline: gw.config.hub_timeout.max(Duration::from_secs(1)) * 2,
            },
        );
    }
    shell.spawn(gw.clone().identity_loop(shutdown.clone()));
    shell.spawn(gw.clone().resync_loop(shutdown.clone()));
    shell.run(gw.common.shutdown.grace).await
}

/// Issues a join token for a site (and pool); the token is shown once.
pub async fn issue_join_token(
    pool: &PgPool,
    site_id: &str,
    pool_id: Option<&str>,
    trust: Trust,
    owner_tenant_id: Option<&str>,
    description: &str,
) -> Result<String, sqlx::Error> {
    store::issue_join_token(
        pool,
        site_id,
        pool_id,
        trust,
        owner_tenant_id,
        description,
        None,
    )
    .await
}
