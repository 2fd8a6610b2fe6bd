#![recursion_limit = "256"]
//! The hub: the only writer of device status. It consumes condition
//! observations from the observation streams (one per partition and
//! queue), applies them in batched transactions, re-derives every derived axis, answers commands over request/reply, and
//! publishes status changes through a transactional outbox.

pub(crate) mod backlog;
pub(crate) mod commands;
mod config;
pub mod decode;
pub(crate) mod drift;
pub(crate) mod inventory;
pub(crate) mod join;
pub(crate) mod lane;
pub(crate) mod lease;
pub(crate) mod metrics;
pub(crate) mod observations;
pub(crate) mod relay;
mod reply;
pub mod store;
pub(crate) mod sweeper;
pub(crate) mod work;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream;
use fleet_bus::Queue;
use fleet_domain::state::{Deadlines, Ttls};
use fleet_domain::Source;
use fleet_runtime::config::FreshnessConfig;
use fleet_runtime::{Common, Shutdown};
use futures::StreamExt;
use tokio::sync::{mpsc, Notify};

pub use config::Config;
pub use metrics::HubMetrics;

pub struct Hub {
    pub common: Common,
    pub config: Config,
    /// PostgreSQL, NATS, JetStream, the subjects and stream names.
    pub deps: fleet_store::Deps,
    /// The freshness TTLs and liveness timeouts the hub derives and
    /// sweeps with.
    pub deadlines: Deadlines,
    /// `deadlines.fingerprint()`, once: the heartbeat carries it and the
    /// sweeper compares it (`sweeper.rs`).
    pub sweep_settings: String,
    pub metrics: HubMetrics,
    pub relay_wake: Notify,
    /// Outbox ids a lane is publishing itself.
    pub outbox_claims: std::sync::Mutex<std::collections::HashSet<i64>>,
    /// Outbox ids published and acked, for the relay to delete.
    pub outbox_acked: std::sync::Mutex<Vec<i64>>,
    /// Where `/healthz`, `/readyz` and `/metrics` listen once running.
    pub ops_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// This replica's name in the lease table (`hub.replica`).
    pub replica: String,
    /// Per partition: the lease epoch this replica holds it under, 0 when
    /// it does not hold it (`lease.rs`).
    pub(crate) leases: Vec<AtomicU64>,
    /// Per partition: its delivery epoch, bumped by `rewind`, and the
    /// signals that wake its fetchers, one per queue (`notify_one` keeps a
    /// permit for a fetcher that is not waiting, but wakes one waiter).
    epochs: Vec<(AtomicU64, [Notify; 2])>,
}

/// The freshness TTLs the hub derives with; a TTL naming no source is
/// refused by its key.
pub fn ttls(freshness: &FreshnessConfig) -> anyhow::Result<Ttls> {
    let mut t = Ttls::uniform(chrono_duration(freshness.default_ttl));
    for (source, ttl) in &freshness.ttl {
        let s = Source::parse(source)
            .with_context(|| format!("configuration key freshness.ttl.{source}"))?;
        t.per_source.insert(s, chrono_duration(*ttl));
    }
    Ok(t)
}

/// [`ttls`] and the liveness timeouts: what the hub derives and sweeps
/// with.
pub fn deadlines(freshness: &FreshnessConfig) -> anyhow::Result<Deadlines> {
    Ok(Deadlines {
        ttls: ttls(freshness)?,
        unreachable_after: chrono_duration(freshness.unreachable_after),
        lost_after: chrono_duration(freshness.lost_after),
    })
}

/// A configured duration for date arithmetic; one too long for it is a
/// century.
fn chrono_duration(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::days(36_500))
}

impl Hub {
    /// Connects, checks the schema and creates the streams.
    pub async fn connect(common: Common, config: Config) -> anyhow::Result<Arc<Hub>> {
        let deps = fleet_store::Deps::connect(&common, fleet_store::Role::Hub).await?;
        fleet_bus::ensure_owned(&deps.js, &common.nats, fleet_bus::Owner::Hub).await?;
        let deadlines = deadlines(&common.freshness)?;
        let config_partitions = common.nats.partitions;
        let replica = config.replica_name();
        let sweep_settings = deadlines.fingerprint();
        Ok(Arc::new(Hub {
            common,
            config,
            deps,
            deadlines,
            sweep_settings,
            metrics: HubMetrics::new(),
            relay_wake: Notify::new(),
            outbox_claims: Default::default(),
            outbox_acked: Default::default(),
            ops_addr: Default::default(),
            replica,
            leases: (0..config_partitions).map(|_| AtomicU64::new(0)).collect(),
            epochs: (0..config_partitions)
                .map(|_| (AtomicU64::new(0), [Notify::new(), Notify::new()]))
                .collect(),
        }))
    }

    /// The partitions this replica holds a lease on and consumes now.
    pub fn partitions(&self) -> Vec<u32> {
        (0..self.common.nats.partitions)
            .filter(|p| self.lease_epoch(*p) != 0)
            .collect()
    }

    /// Copies a message to `DLQ` with its reason (cut to fit the server's
    /// max payload), then terminates it; counted by reason. When the copy
    /// cannot be stored the message is left for redelivery.
    pub async fn dead_letter(&self, msg: &jetstream::Message, reason: &str, error: &str) {
        if fleet_bus::dlq::dead_letter(
            &self.deps.js,
            &self.deps.subjects,
            "observations",
            msg,
            reason,
            error,
        )
        .await
        {
            self.metrics.dead_letter(reason);
        }
    }

    /// The delivery epoch of a partition.
    pub fn epoch(&self, partition: u32) -> u64 {
        self.epochs
            .get(partition as usize)
            .map(|(e, _)| e.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    /// Asks the partition's fetcher to re-create its consumer, so that
    /// every message not acked comes again in stream order before anything
    /// newer (JetStream redelivers a nak'd or timed-out message after
    /// messages delivered since). Items of the old epoch are dropped unacked.
    pub fn rewind(&self, partition: u32) {
        if let Some((e, wakes)) = self.epochs.get(partition as usize) {
            e.fetch_add(1, Ordering::AcqRel);
            for wake in wakes {
                wake.notify_one();
            }
        }
    }

    /// Waits until PostgreSQL answers again (or shutdown: false).
    async fn database_back(&self, shutdown: &mut Shutdown) -> bool {
        loop {
            if fleet_store::ready(&self.deps.pool).await.is_ok() {
                return true;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = shutdown.wait() => return false,
            }
        }
    }

    /// The fetcher of one queue of a partition: a continuous pull from its
    /// durable consumer into the lane that owns the partition, so one
    /// device's messages of a source always go through the same lane in
    /// order. The consumer is re-created when it vanishes (it can across a
    /// reconnect).
    async fn fetch_partition(
        self: Arc<Self>,
        partition: u32,
        queue: Queue,
        lease: u64,
        lane: mpsc::Sender<observations::Item>,
        mut shutdown: Shutdown,
    ) {
        let held = |hub: &Hub| hub.lease_epoch(partition) == lease;
        let durable = queue.consumer(partition);
        let stream = self.deps.streams.observations(queue, partition);
        let mut backoff = Duration::from_millis(200);
        // At start, what an earlier process held unacked (it may have died
        // with it) comes again first, in stream order, instead of after
        // `ack_wait` behind newer messages.
        let mut rewound = true;
        while !shutdown.is_triggered() && held(&self) {
            let epoch = self.epoch(partition);
            if rewound {
                rewound = false;
                // A consumer that does not exist yet is the common case.
                match self
                    .deps
                    .js
                    .delete_consumer_from_stream(&durable, &stream)
                    .await
                {
                    Ok(_) => {
                        tracing::debug!(partition, "consumer rewound to the oldest unacked message")
                    }
                    Err(e) => tracing::debug!(partition, error = %e, "no consumer to rewind"),
                }
            }
            tracing::debug!(partition, ?queue, "binding the consumer");
            // The stream holds only this queue of this partition, so the
            // consumer needs no filter: nats-server then finds its next
            // message without matching subjects (`docs/benchmarks.md`,
            // "Streams per partition").
            let consumer = match fleet_bus::pull_consumer(
                &self.deps.js,
                &stream,
                &durable,
                String::new(),
                self.config.ack_wait,
            )
            .await
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(partition, error = %e, "cannot bind consumer; retrying");
                    tokio::select! { _ = tokio::time::sleep(backoff) => {}, _ = shutdown.wait() => return }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            tracing::debug!(partition, ?queue, "consumer bound");
            let messages = consumer
                .stream()
                .max_messages_per_batch(self.config.batch_size)
                .heartbeat(Duration::from_secs(5))
                .messages()
                .await;
            let mut messages = match messages {
                Ok(m) => {
                    backoff = Duration::from_millis(200);
                    m
                }
                Err(e) => {
                    tracing::warn!(partition, error = %e, "cannot start pulling; retrying");
                    tokio::select! { _ = tokio::time::sleep(backoff) => {}, _ = shutdown.wait() => return }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            let wake = &self.epochs[partition as usize].1[queue as usize];
            loop {
                let next = tokio::select! {
                    m = messages.next() => m,
                    _ = wake.notified() => None,
                    _ = shutdown.wait() => return,
                };
                if self.epoch(partition) != epoch {
                    drop(messages);
                    if !held(&self) {
                        // The lease is gone (handed back or taken over):
                        // its new owner consumes from what is unacked.
                        tracing::info!(partition, "partition lease gone; fetcher stops");
                        return;
                    }
                    // A batch of this partition failed for want of the
                    // database: rewind once it is back.
                    if !self.database_back(&mut shutdown).await {
                        return;
                    }
                    rewound = true;
                    break;
                }
                match next {
                    Some(Ok(m)) => {
                        let mut item = observations::parse(
                            m,
                            &self.deps.subjects,
                            self.common.nats.partitions,
                        );
                        item.partition = partition;
                        item.epoch = epoch;
                        if lane.send(item).await.is_err() {
                            return;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(partition, error = %e, "pull stream failed; re-binding the consumer");
                        break;
                    }
                    None => break,
                }
            }
        }
    }

    /// One lane: takes what its partitions fetched, session queues first,
    /// up to `batch_size` messages or `linger` after the first, and applies
    /// them in one transaction. It stops when its fetchers are gone and its
    /// inputs are empty, so the batch in hand is always finished and acked.
    async fn apply_lane(
        self: Arc<Self>,
        mut inputs: lane::Inputs<observations::Item>,
        _running: mpsc::Sender<()>,
    ) {
        let linger = self.config.linger;
        let max = self.config.batch_size;
        loop {
            // From taking the first message, not from the lane's idle wait
            // for it: a lane with nothing to do is not a batch waiting.
            let mut taken = None;
            // Up to `linger` after the first message was fetched: what
            // queued while the previous batch was applied closes at once.
            let Some(items) = inputs
                .batch(max, |first| {
                    taken = Some(std::time::Instant::now());
                    tokio::time::Instant::from_std(first.fetched + linger)
                })
                .await
            else {
                return;
            };
            self.metrics
                .stage("wait", taken.map_or(Duration::ZERO, |t| t.elapsed()));
            if let Some(age) = items.iter().filter_map(|i| stream_age(&i.msg)).max() {
                self.metrics.stage("age", age);
            }
            let n = items.len();
            self.handle_batch(items).await;
            tracing::trace!(messages = n, "batch done");
        }
    }
}

/// How long ago the stream stored `msg` (by the server's clock: a skewed
/// clock shows as a constant offset).
fn stream_age(msg: &async_nats::jetstream::Message) -> Option<Duration> {
    let stored = msg.info().ok()?.published.unix_timestamp_nanos();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos() as i128;
    u64::try_from(now - stored).ok().map(Duration::from_nanos)
}

/// Runs the hub until shutdown: partition consumers, the command responder,
/// the outbox relay, the sweeper and the ops server.
pub async fn run(common: Common, config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let hub = Hub::connect(common, config).await?;
    run_with(hub, shutdown).await
}

pub async fn run_with(hub: Arc<Hub>, shutdown: Shutdown) -> anyhow::Result<()> {
    let (mut shell, addr) = fleet_store::Shell::start(
        "hub",
        &hub.config.listen,
        hub.metrics.registry.clone(),
        &hub.deps,
        &shutdown,
    )
    .await?;
    let _ = hub.ops_addr.set(addr);
    tracing::info!(%addr, replica = %hub.replica, "hub running");

    let lanes = hub.config.lanes.max(1);
    let mut senders = Vec::with_capacity(lanes);
    // Closed once every lane has ended, so the leases are handed back only
    // after what the lanes held is applied and acked.
    let (running, lanes_done) = mpsc::channel::<()>(1);
    for _ in 0..lanes {
        let (tx, rx) = lane::channel(hub.config.batch_size * 2);
        senders.push(tx);
        // A lane ends once its fetchers are gone and its inputs are applied.
        shell.spawn(hub.clone().apply_lane(rx, running.clone()));
    }
    drop(running);
    // The lease loop claims partitions and starts their fetchers; it keeps
    // the lanes' senders until its fetchers are gone.
    shell.spawn(
        hub.clone()
            .lease_loop(senders, lanes_done, shutdown.clone()),
    );
    shell.respond_commands(
        hub.clone(),
        hub.deps.subjects.hub_cmd_all(),
        hub.command_limits(),
    );
    shell.spawn(hub.clone().sweep_loop(shutdown.clone()));
    shell.spawn(hub.clone().drift_loop(shutdown.clone()));
    shell.spawn(hub.clone().backlog_loop(shutdown.clone()));
    // Fetchers stop; lanes finish and ack what they hold; then the relay
    // flushes. A dependency that is gone must not hold the process: after
    // the grace period it exits, and redelivery covers what was in hand.
    let wake = hub.clone();
    shell.relay(hub.clone().relay_loop(shutdown.clone()), move || {
        wake.relay_wake.notify_one()
    });
    shell.run(hub.common.shutdown.grace).await
}
