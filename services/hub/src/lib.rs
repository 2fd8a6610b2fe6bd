//! The hub: the only writer of device status. It consumes condition
//! observations from `OBSERVATIONS`, applies them in batched transactions,
//! re-derives every derived axis, answers commands over request/reply, and
//! publishes status changes through a transactional outbox.

pub mod commands;
pub mod decode;
pub mod join;
pub mod metrics;
pub mod observations;
pub mod relay;
pub mod sweeper;
pub mod work;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, AckKind};
use fleet_bus::{StreamNames, Subjects};
use fleet_domain::state::Ttls;
use fleet_domain::Source;
use fleet_runtime::http::{self, Ops};
use fleet_runtime::{FleetConfig, Shutdown};
use futures::StreamExt;
use sqlx::PgPool;
use tokio::sync::Notify;

pub use metrics::HubMetrics;

pub struct Hub {
    pub config: FleetConfig,
    pub pool: PgPool,
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub subjects: Subjects,
    pub streams: StreamNames,
    pub ttls: Ttls,
    pub metrics: HubMetrics,
    pub relay_wake: Notify,
}

pub fn ttls(config: &FleetConfig) -> anyhow::Result<Ttls> {
    let mut t = Ttls::uniform(chrono::Duration::seconds(
        config.hub.default_ttl_secs as i64,
    ));
    for (source, secs) in &config.hub.ttl_secs {
        let s = Source::parse(source)
            .with_context(|| format!("configuration key hub.ttl_secs.{source}"))?;
        t.per_source
            .insert(s, chrono::Duration::seconds(*secs as i64));
    }
    Ok(t)
}

impl Hub {
    /// Connects, checks the schema and creates the streams.
    pub async fn connect(config: FleetConfig) -> anyhow::Result<Arc<Hub>> {
        let pool =
            fleet_store::connect(&config.database.url, config.database.max_connections).await?;
        fleet_store::check_schema(&pool).await?;
        let nats = fleet_bus::connect_now(&config.nats.url, "fleet-hub").await?;
        let js = jetstream::new(nats.clone());
        let subjects = Subjects::new(&config.nats.subject_root, &config.nats.radar_root);
        let streams = StreamNames::new(&config.nats.stream_prefix);
        fleet_bus::ensure_streams(&js, &streams, &subjects).await?;
        let ttls = ttls(&config)?;
        Ok(Arc::new(Hub {
            config,
            pool,
            nats,
            js,
            subjects,
            streams,
            ttls,
            metrics: HubMetrics::new(),
            relay_wake: Notify::new(),
        }))
    }

    /// The partitions this replica consumes.
    pub fn partitions(&self) -> Vec<u32> {
        if self.config.hub.partitions.is_empty() {
            (0..self.config.nats.partitions).collect()
        } else {
            self.config.hub.partitions.clone()
        }
    }

    /// Copies a message to `DLQ` with its reason, then terminates it. When
    /// the copy cannot be stored the message is left for redelivery: nothing
    /// is dropped.
    pub async fn dead_letter(&self, msg: &jetstream::Message, reason: &str, error: &str) {
        let mut headers = msg.headers.clone().unwrap_or_default();
        headers.insert(fleet_bus::HEADER_DLQ_REASON, reason);
        headers.insert(
            fleet_bus::HEADER_DLQ_ERROR,
            error.replace(['\r', '\n'], " ").as_str(),
        );
        headers.insert(fleet_bus::HEADER_DLQ_SUBJECT, msg.subject.as_str());
        let id = msg
            .info()
            .map(|i| format!("dlq-{}-{}", i.stream, i.stream_sequence))
            .unwrap_or_else(|_| format!("dlq-{}", ulid::Ulid::new()));
        let subject = self.subjects.dlq("observations", reason);
        match fleet_bus::publish_acked(&self.js, subject, &id, headers, msg.payload.clone()).await {
            Ok(()) => {
                tracing::warn!(subject = %msg.subject, reason, error, "dead-lettered");
                self.metrics.dead_letter(reason);
                let _ = msg.ack_with(AckKind::Term).await;
            }
            Err(e) => {
                tracing::error!(subject = %msg.subject, error = %e, "could not dead-letter; leaving for redelivery");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(5))))
                    .await;
            }
        }
    }

    /// One partition's consumer loop: fetch a batch, apply, ack; re-create
    /// the consumer when it vanishes (it can across a reconnect).
    async fn consume_partition(self: Arc<Self>, partition: u32, mut shutdown: Shutdown) {
        let durable = format!("hub-p{partition}");
        let filter = self.subjects.obs_partition(partition);
        let mut backoff = Duration::from_millis(200);
        while !shutdown.is_triggered() {
            let consumer = match fleet_bus::pull_consumer(
                &self.js,
                &self.streams.observations(),
                &durable,
                filter.clone(),
                Duration::from_secs(self.config.hub.ack_wait_secs),
            )
            .await
            {
                Ok(c) => {
                    backoff = Duration::from_millis(200);
                    c
                }
                Err(e) => {
                    tracing::warn!(partition, error = %e, "cannot bind consumer; retrying");
                    tokio::select! { _ = tokio::time::sleep(backoff) => {}, _ = shutdown.wait() => return }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            loop {
                if shutdown.is_triggered() {
                    return;
                }
                let batch = consumer
                    .batch()
                    .max_messages(self.config.hub.batch_size)
                    .expires(Duration::from_millis(self.config.hub.fetch_wait_ms.max(10)))
                    .messages()
                    .await;
                let mut batch = match batch {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(partition, error = %e, "fetch failed; re-binding consumer");
                        tokio::time::sleep(backoff).await;
                        break;
                    }
                };
                let mut items = Vec::new();
                let mut broken = false;
                while let Some(m) = batch.next().await {
                    match m {
                        Ok(m) => items.push(observations::parse(m)),
                        Err(e) => {
                            tracing::debug!(partition, error = %e, "batch ended with an error");
                            broken = true;
                            break;
                        }
                    }
                }
                if !items.is_empty() {
                    // The batch in hand is finished and acked even when
                    // shutdown arrives meanwhile.
                    self.handle_batch(items).await;
                }
                if broken {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn ready(self: Arc<Self>) -> Result<(), String> {
        if self.nats.connection_state() != async_nats::connection::State::Connected {
            return Err("nats disconnected".into());
        }
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(|e| format!("postgres: {e}"))?;
        Ok(())
    }
}

/// Runs the hub until shutdown: partition consumers, the command responder,
/// the outbox relay, the sweeper and the ops server.
pub async fn run(config: FleetConfig, shutdown: Shutdown) -> anyhow::Result<()> {
    let hub = Hub::connect(config).await?;
    run_with(hub, shutdown).await
}

pub async fn run_with(hub: Arc<Hub>, mut shutdown: Shutdown) -> anyhow::Result<()> {
    let ready_hub = hub.clone();
    let ops = Ops {
        registry: hub.metrics.registry.clone(),
        ready: Arc::new(move || {
            let h = ready_hub.clone();
            Box::pin(async move { h.ready().await })
        }),
    };
    let addr = http::serve(&hub.config.hub.listen, http::router(ops), shutdown.clone())
        .await
        .with_context(|| format!("binding hub.listen {}", hub.config.hub.listen))?;
    tracing::info!(%addr, partitions = ?hub.partitions(), "hub running");

    let mut tasks = tokio::task::JoinSet::new();
    for p in hub.partitions() {
        tasks.spawn(hub.clone().consume_partition(p, shutdown.clone()));
    }
    tasks.spawn(hub.clone().serve_commands(shutdown.clone()));
    tasks.spawn(hub.clone().sweep_loop(shutdown.clone()));
    let relay = tokio::spawn(hub.clone().relay_loop(shutdown.clone()));

    shutdown.wait().await;
    // Consumers finish the batch in hand; then the relay flushes.
    while tasks.join_next().await.is_some() {}
    hub.relay_wake.notify_one();
    let _ = relay.await;
    hub.nats.flush().await.ok();
    tracing::info!("hub stopped");
    Ok(())
}
