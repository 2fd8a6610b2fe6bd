//! The connector runtime: one poll loop every connector uses. It owns the
//! schedule (resync interval with jitter), per-request timeouts, retries with
//! back-off, pagination, partitioned publishing with awaited PubAcks,
//! metrics, shutdown, and the outage rule: when a source cannot be read its
//! conditions are published `Unknown` for every device last seen, and the
//! mirrors are left alone. A connector supplies a [`Target`]: a client for
//! its system and a pure mapping from that system's JSON to snapshots.

pub mod backoff;
pub mod config;
pub mod error;
pub mod http;
pub mod metrics;
pub mod paginate;
pub mod poll;
pub mod publish;
pub mod recurring;
pub mod snapshot;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use async_nats::jetstream;
use fleet_bus::Subjects;
use fleet_domain::Source;
use fleet_runtime::http::Ops;
use fleet_runtime::{Common, Shutdown};

pub use config::{NameKeys, PollConfig};
pub use error::SourceError;
pub use fleet_runtime::Credential;
pub use http::HttpClient;
pub use metrics::ConnectorMetrics;
pub use poll::{PollContext, Scope, Target, Tracker};
pub use publish::Bus;
pub use recurring::Recurring;

/// A started connector: connected to NATS, streams ensured, `/healthz`,
/// `/readyz` and `/metrics` served.
pub struct Runtime {
    pub source: Source,
    /// The configuration section (`connectors.<name>`).
    pub name: String,
    pub bus: Bus,
    pub metrics: ConnectorMetrics,
    /// The bound ops address (`listen` may ask for port 0).
    pub ops_addr: SocketAddr,
}

/// One target per configured site, built by `target`; no site configured
/// is a configuration error naming `connectors.<name>.sites`.
pub fn per_site<S, T>(
    name: &str,
    sites: &std::collections::BTreeMap<String, S>,
    target: impl FnMut((&String, &S)) -> anyhow::Result<T>,
) -> anyhow::Result<Vec<T>> {
    anyhow::ensure!(
        !sites.is_empty(),
        "configuration key connectors.{name}.sites: no site is configured"
    );
    sites.iter().map(target).collect()
}

/// What names a connector: its source, its configuration section
/// (`connectors.<name>`), where its ops server listens and how it polls.
pub struct Section<'a> {
    pub source: Source,
    pub name: &'a str,
    pub listen: &'a str,
    pub poll: &'a PollConfig,
}

impl<'a> Section<'a> {
    pub fn new(source: Source, name: &'a str, listen: &'a str, poll: &'a PollConfig) -> Self {
        Section {
            source,
            name,
            listen,
            poll,
        }
    }
}

/// A connector's whole life: starts the runtime (ops server, NATS, the
/// hub's stream checked), builds its targets with an HTTP client made from
/// the section's poll settings, and polls them until shutdown.
pub async fn serve<T: Target>(
    common: &Common,
    section: Section<'_>,
    shutdown: Shutdown,
    targets: impl FnOnce(&HttpClient) -> anyhow::Result<Vec<T>>,
) -> anyhow::Result<()> {
    let Section {
        source,
        name,
        listen,
        poll,
    } = section;
    let rt = Runtime::start_named(common, source, name, listen, shutdown.clone())
        .await
        .with_context(|| format!("starting connector-{name}"))?;
    let http = rt.http(poll)?;
    let targets = targets(&http)?;
    rt.run(targets, poll, shutdown).await
}

impl Runtime {
    pub async fn start(
        common: &Common,
        source: Source,
        listen: &str,
        shutdown: Shutdown,
    ) -> anyhow::Result<Runtime> {
        Self::start_named(common, source, source.as_str(), listen, shutdown).await
    }

    /// [`Runtime::start`] for a connector whose configuration section is
    /// not named after its source (`fabric` publishes for three sources).
    pub async fn start_named(
        common: &Common,
        source: Source,
        name: &str,
        listen: &str,
        shutdown: Shutdown,
    ) -> anyhow::Result<Runtime> {
        let nats = fleet_bus::connect_now(&common.nats, &format!("fleet-connector-{name}")).await?;
        let js = jetstream::new(nats.clone());
        let subjects = Subjects::new(&common.nats.subject_root, &common.nats.radar_root);
        // The observation streams are the hub's: wait for them (or
        // shutdown) and check they were made for this connector's
        // partition count.
        let mut stop = shutdown.clone();
        if !fleet_bus::check_observations(&js, &common.nats, async move { stop.wait().await })
            .await?
        {
            anyhow::bail!("shut down while waiting for the observation streams");
        }
        let metrics = ConnectorMetrics::new();
        let ready_nats = nats.clone();
        let ops = Ops {
            registry: metrics.registry.clone(),
            ready: Arc::new(move || {
                let n = ready_nats.clone();
                Box::pin(async move {
                    if n.connection_state() == async_nats::connection::State::Connected {
                        Ok(())
                    } else {
                        Err("nats disconnected".to_string())
                    }
                })
            }),
        };
        let ops_addr =
            fleet_runtime::http::serve(listen, fleet_runtime::http::router(ops), shutdown)
                .await
                .with_context(|| format!("binding connectors.{name}.listen {listen}"))?;
        Ok(Runtime {
            source,
            name: name.to_string(),
            bus: Bus {
                nats,
                js,
                subjects,
                partitions: common.nats.partitions.max(1),
            },
            metrics,
            ops_addr,
        })
    }

    /// An HTTP client with the poll's timeouts and retries.
    pub fn http(&self, poll: &PollConfig) -> anyhow::Result<HttpClient> {
        Ok(HttpClient::new(
            poll,
            self.metrics.clone(),
            self.source.as_str(),
        )?)
    }

    /// Runs one poll loop per target until shutdown.
    pub async fn run<T: Target>(
        self,
        targets: Vec<T>,
        poll: &PollConfig,
        shutdown: Shutdown,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            !targets.is_empty(),
            "configuration key connectors.{}.sites: no site is configured",
            self.name
        );
        tracing::info!(source = %self.source, sites = targets.len(), ops = %self.ops_addr, "connector running");
        let mut tasks = tokio::task::JoinSet::new();
        for t in targets {
            tasks.spawn(poll::run_target(
                t,
                self.bus.clone(),
                self.metrics.clone(),
                poll.clone(),
                shutdown.clone(),
            ));
        }
        while let Some(r) = tasks.join_next().await {
            if let Err(e) = r {
                // A poll loop that panicked is a bug; the others keep going.
                tracing::error!(source = %self.source, error = %e, "poll loop ended abnormally");
            }
        }
        self.bus.nats.flush().await.ok();
        tracing::info!(source = %self.source, "connector stopped");
        Ok(())
    }
}
