//! The operator HTTP API (`spec/api.md`). Reads go to PostgreSQL; every
//! mutation is a hub command over NATS request/reply, and no answer in time
//! is 503, never a guess. Every route comes from one table
//! ([`routes::table`]) that names its scope; the router and the OpenAPI
//! document are both built from it.

pub mod allocations;
pub mod auth;
pub mod bindings;
pub mod call;
pub mod conditions;
mod config;
pub mod console;
pub mod db;
pub mod devices;
pub mod drift;
pub mod error;
pub mod failure_codes;
pub mod gateway;
pub mod hub;
pub mod impairment;
pub mod inventory;
pub mod jobs;
pub mod metrics;
pub mod model;
pub mod openapi;
pub mod page;
pub mod placer;
pub mod routes;
pub mod sites;
pub mod standup;

use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use fleet_bus::Subjects;
use fleet_runtime::config::FreshnessConfig;
use fleet_runtime::{Common, Shutdown};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

pub use auth::{create_token, Scope};
pub use config::{AcceptancePolicy, Config, GateConfig, PoolPolicy, StandupConfig};

pub struct Inner {
    pub config: Config,
    pub pool: PgPool,
    pub hub: hub::HubClient,
    /// Allocations and capacity; waits `api.hub_timeout` like the hub.
    pub placer: fleet_placer_client::PlacerClient,
    /// Jobs; waits `api.hub_timeout` like the hub.
    pub workflow: fleet_workflow_client::WorkflowClient,
    pub tokens: auth::TokenCache,
    pub ttls: TtlConfig,
    pub metrics: metrics::ApiMetrics,
    /// The console's live feed subscribes to STATUS through it.
    pub nats: async_nats::Client,
    pub subjects: Subjects,
}

/// The state every handler gets; cheap to clone.
#[derive(Clone)]
pub struct App(pub Arc<Inner>);

impl Deref for App {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

/// Freshness TTLs as the hub applies them (`freshness.default_ttl`,
/// `freshness.ttl.<source>`), in seconds, for `stale` at read time.
#[derive(Debug, Clone)]
pub struct TtlConfig {
    pub default_secs: i64,
    pub sources: Vec<String>,
    pub secs: Vec<i64>,
}

impl TtlConfig {
    pub fn new(freshness: &FreshnessConfig) -> Self {
        let secs = |d: &Duration| d.as_secs().min(i64::MAX as u64) as i64;
        TtlConfig {
            default_secs: secs(&freshness.default_ttl),
            sources: freshness.ttl.keys().cloned().collect(),
            secs: freshness.ttl.values().map(secs).collect(),
        }
    }
}

impl App {
    /// Connects lazily: the API starts while PostgreSQL or NATS are away
    /// and answers 503 for what needs them until they are back.
    pub async fn connect(common: &Common, config: &Config) -> anyhow::Result<App> {
        // Every list is a keyset page: walk an index in key order and stop
        // at the limit. The planner underestimates how often compound
        // filters (the schedulable predicate) match and would rather scan a
        // whole site and sort; with sorts and parallel workers discouraged it
        // walks the index, so a filtered page costs milliseconds at 100,000
        // devices. Filters vary per request, so no generic cached plans.
        let options = PgConnectOptions::from_str_url(&common.database.url)?;
        let role = common.database.set_role.then_some(fleet_store::Role::Api);
        let options = fleet_store::as_role(options, role).options([
            ("plan_cache_mode", "force_custom_plan"),
            ("enable_sort", "off"),
            ("max_parallel_workers_per_gather", "0"),
        ]);
        let pool = PgPoolOptions::new()
            .max_connections(common.database.max_connections)
            .acquire_timeout(config.db_timeout)
            .connect_lazy_with(options);
        let nats = fleet_bus::connect(&common.nats, "fleet-api").await?;
        Ok(App::new(common, config, pool, nats))
    }

    pub fn new(common: &Common, config: &Config, pool: PgPool, nats: async_nats::Client) -> App {
        let subjects = Subjects::new(&common.nats.subject_root, &common.nats.radar_root);
        App(Arc::new(Inner {
            config: config.clone(),
            pool,
            placer: fleet_placer_client::PlacerClient::new(
                nats.clone(),
                subjects.clone(),
                config.hub_timeout,
            ),
            workflow: fleet_workflow_client::WorkflowClient::new(
                nats.clone(),
                subjects.clone(),
                config.hub_timeout,
            ),
            hub: hub::HubClient {
                client: fleet_hub_client::HubClient::new(
                    nats.clone(),
                    subjects.clone(),
                    config.hub_timeout,
                ),
            },
            nats,
            subjects,
            tokens: auth::TokenCache::new(config.token_cache_ttl),
            ttls: TtlConfig::new(&common.freshness),
            metrics: metrics::ApiMetrics::new(),
        }))
    }

    async fn ready(&self) -> Result<(), String> {
        if !self.hub.connected() {
            return Err("nats disconnected".into());
        }
        fleet_store::ready(&self.pool).await
    }
}

trait FromStrUrl: Sized {
    fn from_str_url(url: &str) -> anyhow::Result<Self>;
}

impl FromStrUrl for PgConnectOptions {
    fn from_str_url(url: &str) -> anyhow::Result<Self> {
        use std::str::FromStr;
        PgConnectOptions::from_str(url)
            .with_context(|| format!("database.url {}", fleet_store::redact(url)))
    }
}

/// Binds `api.listen` and serves until shutdown; returns the bound address.
pub async fn serve(app: App, listen: &str, shutdown: Shutdown) -> anyhow::Result<SocketAddr> {
    let router = routes::router(app);
    fleet_runtime::http::serve(listen, router, shutdown)
        .await
        .with_context(|| format!("binding api.listen {listen}"))
}

/// Runs the API until shutdown. Refuses a schema that is behind.
pub async fn run(common: Common, config: Config, mut shutdown: Shutdown) -> anyhow::Result<()> {
    let app = App::connect(&common, &config).await?;
    fleet_store::check_schema(&app.pool).await?;
    let addr = serve(app, &config.listen, shutdown.clone()).await?;
    tracing::info!(%addr, "api running");
    shutdown.wait().await;
    tracing::info!("api stopped");
    Ok(())
}
