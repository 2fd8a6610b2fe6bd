//! Applying observation batches: one transaction per batch, devices locked
//! in id order, ack only after commit. A batch that fails is retried one
//! message at a time so one bad message cannot hold the others back.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::store::devices::{self, HeldRows};
use async_nats::jetstream::{self, AckKind};
use chrono::Utc;
use fleet_bus::subjects::{self, ObsSubject};
use fleet_bus::Subjects;
use fleet_domain::state::{Confirmation, Outcome};
use fleet_domain::{DomainError, KeyKind, Source};
use fleet_store::StoreError;

use crate::decode::{self, Key, Observation};
use crate::lease::Fenced;
use crate::work::{Summary, Work};
use crate::Hub;

/// One fetched message and what decoding made of it.
pub struct Item {
    pub msg: jetstream::Message,
    pub parsed: Result<Observation, DomainError>,
    /// The trace context the status events of this observation carry: the
    /// hub span's own when spans are exported, else a child of the
    /// publisher's `traceparent`.
    pub trace: Option<String>,
    /// `hub.observation`, a child of the publisher's span; it ends when the
    /// item is dropped, after its batch committed.
    pub span: tracing::Span,
    /// The partition it was fetched from and that partition's delivery
    /// epoch then (see `Hub::rewind`).
    pub partition: u32,
    pub epoch: u64,
    /// When it was fetched: `hub.linger` runs from here, so a message that
    /// already waited in its lane's queue does not wait again.
    pub fetched: std::time::Instant,
}

/// Decodes one message. The subject must be exactly
/// `<root>.obs.<source>.<partition>.<device>`: the source is read at its
/// fixed position (what NATS permissions guard) and must be the message's
/// own; the device and partition tokens must be the message's key's.
pub fn parse(msg: jetstream::Message, subjects: &Subjects, partitions: u32) -> Item {
    let now = Utc::now();
    let headers = msg.headers.as_ref();
    let schema = headers
        .and_then(|h| h.get(fleet_bus::HEADER_SCHEMA))
        .map(|v| v.as_str().to_string());
    let span = tracing::info_span!("hub.observation", subject = %msg.subject);
    fleet_runtime::telemetry::set_parent_from(&span, headers);
    let trace = Some(fleet_runtime::telemetry::downstream_traceparent(
        &span, headers,
    ));
    let parsed = match subjects.parse_obs(msg.subject.as_str(), partitions) {
        Err(e) => Err(DomainError::InvalidSubject(format!(
            "{e}: {}",
            msg.subject.as_str()
        ))),
        Ok(subject) => decode::observation(schema.as_deref(), subject.source, &msg.payload, now)
            .and_then(|o| routed(&o, &subject, partitions).map(|()| o)),
    };
    Item {
        msg,
        parsed,
        trace,
        span,
        partition: 0,
        epoch: 0,
        fetched: std::time::Instant::now(),
    }
}

/// The subject's device and partition tokens are the ones the publisher
/// computes from the message's own key (`fleet_bus::publish_observation`).
fn routed(o: &Observation, subject: &ObsSubject<'_>, partitions: u32) -> Result<(), DomainError> {
    let key = o.key();
    let device = subjects::token(&format!("{}-{}", key.kind.as_str(), key.key));
    if subject.device != device {
        return Err(DomainError::InvalidSubject(format!(
            "device token {} is not the message's device {device}",
            subject.device
        )));
    }
    // A connectivity observation carries no site, which its partition hashes.
    if !matches!(o, Observation::Connectivity { .. }) {
        let p = fleet_bus::partition(
            &format!("{}/{}/{}", key.site, key.kind.as_str(), key.key),
            partitions,
        );
        if p != subject.partition {
            return Err(DomainError::InvalidSubject(format!(
                "partition {} is not the message's partition {p}",
                subject.partition
            )));
        }
    }
    Ok(())
}

/// What one batch did, for metrics and the benchmark.
#[derive(Debug, Default, Clone, Copy)]
pub struct BatchStats {
    pub applied: u64,
    /// Of `applied`, the snapshots the fast path confirmed.
    pub confirmed: u64,
    pub stale: u64,
    pub duplicate: u64,
    pub unresolved: u64,
    pub rejected: u64,
    /// Items whose device another transaction held at the first pass,
    /// applied in the second (counted in the outcomes above too).
    pub deferred: u64,
    pub summary: Summary,
}

impl Hub {
    /// Applies a batch and acks it; dead-letters what cannot be applied.
    ///
    /// Two passes: the first locks the batch's devices with `SKIP LOCKED`
    /// and applies, commits and acks everything whose device it got; the
    /// devices another transaction held (another lane's batch, since a
    /// device's sources key it differently and so land in different
    /// partitions, or a command) are applied right after, in a second
    /// transaction that waits for them. A lane thus never holds a whole
    /// batch's locks while it waits, and the batches of the lanes no longer
    /// queue behind one another. A device's messages are all in one pass,
    /// and the lane takes no newer message before the second pass is done,
    /// so per-device order holds.
    pub async fn handle_batch(&self, items: Vec<Item>) -> BatchStats {
        let mut stats = BatchStats::default();
        // Items fetched before their partition was rewound come again, in
        // order, from the new consumer: drop these copies unacked.
        let items: Vec<Item> = items
            .into_iter()
            .filter(|i| i.epoch == self.epoch(i.partition))
            .collect();
        let (good, bad): (Vec<Item>, Vec<Item>) = items.into_iter().partition(|i| i.parsed.is_ok());
        for item in bad {
            let err = item
                .parsed
                .as_ref()
                .err()
                .cloned()
                .expect("partitioned on error");
            self.dead_letter(&item.msg, err.dlq_reason(), &err.to_string())
                .await;
            stats.rejected += 1;
        }
        let held = self.settle(good, HeldRows::Skip, &mut stats).await;
        if !held.is_empty() {
            stats.deferred += held.len() as u64;
            let left = self.settle(held, HeldRows::Wait, &mut stats).await;
            debug_assert!(left.is_empty(), "a waiting pass defers nothing");
        }
        self.relay_wake.notify_one();
        self.metrics.record_batch(&stats);
        stats
    }

    /// One pass over `good`: applies, publishes and acks; returns the items
    /// whose devices were held elsewhere (only with [`HeldRows::Skip`]),
    /// unacked and in their order.
    async fn settle(&self, good: Vec<Item>, held: HeldRows, stats: &mut BatchStats) -> Vec<Item> {
        if good.is_empty() {
            return vec![];
        }
        let started = std::time::Instant::now();
        let applied = self.apply(&good, held).await;
        self.metrics.stage("apply", started.elapsed());
        match applied {
            Ok(Err(Fenced(lost))) => {
                // Not acked: the partitions' next owner gets them again.
                let batch: BTreeSet<u32> = good.iter().map(|i| i.partition).collect();
                self.fenced(&lost, &batch);
            }
            Ok(Ok(done)) => {
                merge(stats, done.stats);
                let started = std::time::Instant::now();
                // The status changes first: they are what consumers wait
                // for, while an ack only tells the stream what it may drop
                // (a crash in between redelivers, and a redelivery is a
                // duplicate the hub recognises).
                self.publish_committed(done.outbox).await;
                let mut held = Vec::with_capacity(done.held.len());
                for (k, item) in good.into_iter().enumerate() {
                    if done.held.contains(&k) {
                        held.push(item);
                    } else {
                        self.ack(&item.msg).await;
                    }
                }
                self.metrics.stage("publish", started.elapsed());
                return held;
            }
            Err(e) if e.is_unavailable() => {
                tracing::warn!(error = %e, batch = good.len(), "database unavailable; the batch's partitions are rewound and redelivered in stream order");
                // Not nak'd: a nak'd message comes back after newer ones of
                // its device. Leaving them unacked and rewinding their
                // partitions redelivers them first, in order.
                let partitions: BTreeSet<u32> = good.iter().map(|i| i.partition).collect();
                for p in partitions {
                    self.rewind(p);
                }
                // Do not spin against a database that is away.
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) if good.len() > 1 => {
                tracing::warn!(error = %e, batch = good.len(), "batch failed; retrying its messages one at a time");
                for item in good {
                    if item.epoch != self.epoch(item.partition) {
                        // Its partition was let go or rewound meanwhile.
                        continue;
                    }
                    match self
                        .apply(std::slice::from_ref(&item), HeldRows::Wait)
                        .await
                    {
                        Ok(Err(Fenced(lost))) => {
                            self.fenced(&lost, &BTreeSet::from([item.partition]));
                        }
                        Ok(Ok(done)) => {
                            merge(stats, done.stats);
                            self.ack(&item.msg).await;
                            self.publish_committed(done.outbox).await;
                        }
                        Err(e) => self.failed(&item.msg, &e).await,
                    }
                }
            }
            Err(e) => self.failed(&good[0].msg, &e).await,
        }
        vec![]
    }

    async fn ack(&self, msg: &jetstream::Message) {
        if let Err(e) = msg.ack().await {
            // The commit stands; a redelivery is a duplicate and a no-op.
            tracing::warn!(error = %e, subject = %msg.subject, "ack failed after commit");
        }
    }

    async fn failed(&self, msg: &jetstream::Message, e: &StoreError) {
        if e.is_unavailable() {
            // PostgreSQL is away: the message is not at fault, so it never
            // counts toward the DLQ; it comes back when the database does.
            let _ = msg
                .ack_with(AckKind::Nak(Some(std::time::Duration::from_secs(2))))
                .await;
            return;
        }
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1) as u64;
        if delivered >= self.config.max_deliver {
            tracing::error!(error = %e, subject = %msg.subject, delivered, "giving up on a message that cannot be applied");
            self.dead_letter(msg, "apply_failed", &e.to_string()).await;
        } else {
            tracing::warn!(error = %e, subject = %msg.subject, delivered, "apply failed; will be redelivered");
            let _ = msg
                .ack_with(AckKind::Nak(Some(std::time::Duration::from_secs(1))))
                .await;
        }
    }

    /// One transaction for the whole slice; returns the outbox rows it
    /// committed, claimed for the caller to publish, and (with
    /// [`HeldRows::Skip`]) which items it left alone because another
    /// transaction held their device.
    pub async fn apply(
        &self,
        items: &[Item],
        held: HeldRows,
    ) -> Result<Result<Applied, Fenced>, StoreError> {
        let now = Utc::now();
        let mut stats = BatchStats::default();
        let mut obs: Vec<(&Item, &Observation)> = items
            .iter()
            .map(|i| (i, i.parsed.as_ref().expect("only parsed items")))
            .collect();
        let mut tx = self.deps.pool.begin().await?;
        // First, and held to the commit: the batch's partitions are still
        // this replica's (lease.rs).
        let partitions: BTreeSet<u32> = items.iter().map(|i| i.partition).collect();
        if let Err(f) = self.fence(&mut tx, &partitions).await? {
            return Ok(Err(f));
        }

        let mut by_kind: BTreeMap<KeyKind, HashSet<(String, String)>> = BTreeMap::new();
        for (_, o) in &obs {
            let k = o.key();
            by_kind.entry(k.kind).or_default().insert((k.site, k.key));
        }
        let mut sources: Vec<&str> = obs.iter().map(|(_, o)| o.source().as_str()).collect();
        sources.sort();
        sources.dedup();
        // Every device of the batch is locked here, in id order; only the
        // ones the fast path cannot confirm are loaded in full.
        let (resolved, heads) = resolve_and_lock(&mut tx, by_kind, &sources, held).await?;
        let mut ids: Vec<String> = resolved.values().cloned().collect();
        ids.sort();
        ids.dedup();
        // A device left out was held elsewhere: none of its items is
        // touched here (the caller applies them after this commit).
        let mut left = BTreeSet::new();
        if heads.len() < ids.len() {
            let mut kept = Vec::with_capacity(obs.len());
            for (k, (item, o)) in obs.into_iter().enumerate() {
                match resolved.get(&o.key()) {
                    Some(id) if !heads.contains_key(id) => {
                        left.insert(k);
                    }
                    _ => kept.push((item, o)),
                }
            }
            obs = kept;
        }
        let plan = plan(&obs, &resolved, &heads, now, &self.deadlines.ttls);
        stats.stale += plan.stale;
        stats.duplicate += plan.duplicate;
        stats.applied += plan.applied;
        stats.confirmed += plan.applied;
        let refreshed = devices::refresh_freshness(&mut tx, &plan.refreshed, now).await?;
        let seen = devices::refresh_last_seen(&mut tx, &plan.seen).await?;

        let load: Vec<String> = plan.load.iter().cloned().collect();
        let mut work = Work::load_locked(&mut tx, &load).await?;
        let keys: Vec<_> = obs.iter().map(|(_, o)| o.key()).collect();
        let unresolved: Vec<devices::Unresolved<'_>> = obs
            .iter()
            .zip(&keys)
            .filter(|(_, key)| !resolved.contains_key(*key))
            .map(|((item, o), key)| devices::Unresolved {
                source: o.source().as_str(),
                site: &key.site,
                key_kind: key.kind.as_str(),
                key: &key.key,
                observed_at: o.observed_at(),
                payload: &item.msg.payload,
            })
            .collect();
        devices::record_unresolved(&mut tx, &unresolved).await?;
        stats.unresolved += unresolved.len() as u64;
        let claims: Vec<(String, i64)> = obs
            .iter()
            .filter_map(|(_, o)| match o {
                Observation::Snapshot { snapshot, key } => {
                    Some((resolved.get(key)?.clone(), snapshot.netbox_id_claim()?))
                }
                _ => None,
            })
            .collect();
        let refused = work.refused_netbox_ids(&mut tx, &claims).await?;
        for (item, o) in &obs {
            let key = o.key();
            let Some(id) = resolved.get(&key) else {
                continue;
            };
            if !plan.load.contains(id) {
                continue;
            }
            let cause = format!("source:{}", o.source());
            let Some(state) = work.step(
                id,
                &cause,
                item.trace.as_ref(),
                now,
                &self.deadlines.ttls,
                &self.deps.subjects,
            ) else {
                stats.unresolved += 1;
                continue;
            };
            let outcome = match o {
                Observation::Snapshot { snapshot, .. } => {
                    let keeping;
                    let snapshot = match snapshot.netbox_id_claim() {
                        Some(n) if refused.contains(&(id.clone(), n)) => {
                            keeping = snapshot.keeping_netbox_id();
                            &keeping
                        }
                        _ => snapshot,
                    };
                    let (outcome, notes) = state.apply_snapshot(snapshot, now);
                    if notes.handover_breach {
                        tracing::error!(device_id = %id, "HandoverBreach: custody entry with no verified front-end VRF flip on record");
                    }
                    outcome
                }
                Observation::Write { write, .. } => {
                    match state.apply_condition_write(
                        write.source,
                        &write.input,
                        write.observed_at,
                        write.hub_ordered,
                        now,
                    ) {
                        Ok((outcome, _)) => outcome,
                        Err(e) => {
                            // Checked at decode; kept as a guard.
                            tracing::warn!(device_id = %id, error = %e, "condition write refused");
                            Outcome::Stale
                        }
                    }
                }
                Observation::Connectivity {
                    epoch,
                    gateway_id,
                    event,
                    observed_at,
                    observed_generation,
                    identity_generation,
                    ..
                } => {
                    let outcome = state.apply_connectivity_of(
                        *epoch,
                        gateway_id,
                        *event,
                        *observed_at,
                        *identity_generation,
                    );
                    if outcome == Outcome::Applied {
                        state.report_generation(*observed_generation);
                    }
                    outcome
                }
            };
            match outcome {
                Outcome::Applied => stats.applied += 1,
                Outcome::Stale => stats.stale += 1,
                Outcome::Duplicate => stats.duplicate += 1,
            }
        }
        let (mut summary, work) = work
            .finish(&mut tx, now, &self.deadlines, &self.deps.subjects)
            .await?;
        summary.written.freshness += refreshed;
        summary.written.devices += seen;
        self.claim(&work.outbox);
        if let Err(e) = tx.commit().await {
            self.unclaim(work.outbox.iter().map(|r| r.id));
            return Err(e.into());
        }
        stats.summary = summary;
        Ok(Ok(Applied {
            stats,
            outbox: work.outbox,
            held: left,
        }))
    }
}

/// Resolves the batch's keys to devices and locks those devices in id
/// order, reading their heads; with [`HeldRows::Skip`] a device another
/// transaction holds is resolved but has no head.
async fn resolve_and_lock(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    mut by_kind: BTreeMap<KeyKind, HashSet<(String, String)>>,
    sources: &[&str],
    held: HeldRows,
) -> Result<(BTreeMap<Key, String>, BTreeMap<String, devices::Head>), StoreError> {
    let mut resolved: BTreeMap<Key, String> = BTreeMap::new();
    let heads = match by_kind.pop_first() {
        // The common batch: one key kind that names one device; the
        // keys resolve and their devices lock in one statement.
        Some((kind, keys)) if by_kind.is_empty() && devices::names_one_device(kind) => {
            let keys: Vec<(String, String)> = keys.into_iter().collect();
            let (found, heads) =
                devices::resolve_and_lock_heads(tx, kind, &keys, sources, held).await?;
            for ((site, key), id) in found {
                resolved.insert(Key { site, kind, key }, id);
            }
            if held == HeldRows::Skip && resolved.len() < keys.len() {
                // A key left out names no device, or one another
                // transaction holds: the latter's items wait for it.
                let missing: Vec<(String, String)> = keys
                    .into_iter()
                    .filter(|(site, key)| {
                        !resolved.contains_key(&Key {
                            site: site.clone(),
                            kind,
                            key: key.clone(),
                        })
                    })
                    .collect();
                for ((site, key), id) in devices::resolve(tx, kind, &missing).await? {
                    resolved.insert(Key { site, kind, key }, id);
                }
            }
            heads
        }
        first => {
            for (kind, keys) in first.into_iter().chain(by_kind) {
                let keys: Vec<(String, String)> = keys.into_iter().collect();
                for ((site, key), id) in devices::resolve(tx, kind, &keys).await? {
                    resolved.insert(Key { site, kind, key }, id);
                }
            }
            let mut ids: Vec<String> = resolved.values().cloned().collect();
            ids.sort();
            ids.dedup();
            devices::lock_heads(tx, &ids, sources, held).await?
        }
    };
    Ok((resolved, heads))
}

/// What [`Hub::apply`] committed.
pub struct Applied {
    pub stats: BatchStats,
    /// Its status changes, claimed for the caller to publish.
    pub outbox: Vec<fleet_outbox::Pending>,
    /// The positions of the items it left alone: their device was held by
    /// another transaction.
    pub held: BTreeSet<usize>,
}

/// Which devices of a batch the fast path settles and which must be loaded.
struct Plan<'a> {
    /// Confirmed snapshots: the freshness rows to move.
    refreshed: Vec<(&'a str, Source, chrono::DateTime<Utc>)>,
    /// Confirmed heartbeats: the `session_last_seen` to write.
    seen: Vec<(&'a str, chrono::DateTime<Utc>)>,
    applied: u64,
    stale: u64,
    duplicate: u64,
    /// Devices applied in full (every observation of theirs in the batch).
    load: BTreeSet<String>,
}

impl Plan<'_> {
    /// Counts one fast-path decision; true when it is a refresh to write.
    fn count(&mut self, c: Confirmation) -> bool {
        match c {
            Confirmation::Stale => self.stale += 1,
            Confirmation::Duplicate => self.duplicate += 1,
            Confirmation::Refresh => {
                self.applied += 1;
                return true;
            }
            // Never recorded: a device that needs loading is in `load`.
            Confirmation::Load => {}
        }
        false
    }
}

/// Runs `confirm` over the batch in order, device by device: a device goes
/// the fast way only when every observation of its in the batch is a
/// snapshot the fast path decides (each one seeing the freshness the
/// previous ones left).
fn plan<'a>(
    obs: &'a [(&Item, &Observation)],
    resolved: &'a BTreeMap<Key, String>,
    heads: &BTreeMap<String, devices::Head>,
    now: chrono::DateTime<Utc>,
    ttls: &fleet_domain::state::Ttls,
) -> Plan<'a> {
    use fleet_domain::state::{confirm, confirm_heartbeat};
    let mut load = BTreeSet::new();
    let mut fresh: BTreeMap<&str, BTreeMap<Source, fleet_domain::state::Freshness>> =
        BTreeMap::new();
    let mut decided: Vec<(&str, Source, chrono::DateTime<Utc>, Confirmation)> = vec![];
    let mut sessions: BTreeMap<&str, fleet_domain::state::Session> = BTreeMap::new();
    let mut heartbeats: Vec<(&str, chrono::DateTime<Utc>, Confirmation)> = vec![];
    for (_, o) in obs {
        let Some(id) = resolved.get(&o.key()) else {
            continue;
        };
        if load.contains(id) {
            continue;
        }
        let Some(head) = heads.get(id).filter(|h| !h.deleted) else {
            load.insert(id.clone());
            continue;
        };
        if let Observation::Connectivity {
            epoch,
            event,
            observed_at,
            observed_generation,
            identity_generation,
            ..
        } = o
        {
            let Some(connectivity) = head.connectivity else {
                load.insert(id.clone());
                continue;
            };
            // A session of another identity generation: the full path
            // decides (an earlier one is refused).
            if *identity_generation > 0 && *identity_generation != head.identity_generation {
                load.insert(id.clone());
                continue;
            }
            let session = sessions
                .entry(id.as_str())
                .or_insert_with(|| head.session.clone());
            let c = confirm_heartbeat(
                session,
                connectivity,
                head.observed_generation,
                *epoch,
                *event,
                *observed_at,
                *observed_generation,
            );
            match c {
                Confirmation::Load => {
                    load.insert(id.clone());
                }
                Confirmation::Refresh => {
                    session.last_seen = Some(*observed_at);
                    heartbeats.push((id.as_str(), *observed_at, c));
                }
                Confirmation::Stale | Confirmation::Duplicate => {
                    heartbeats.push((id.as_str(), *observed_at, c));
                }
            }
            continue;
        }
        let Observation::Snapshot { snapshot, .. } = o else {
            load.insert(id.clone());
            continue;
        };
        let rows = fresh
            .entry(id.as_str())
            .or_insert_with(|| head.freshness.clone());
        let c = confirm(
            rows.get(&snapshot.source),
            head.version,
            snapshot.source,
            snapshot.observed_at,
            &snapshot.digest(),
            now,
            ttls,
        );
        match c {
            Confirmation::Load => {
                load.insert(id.clone());
                continue;
            }
            Confirmation::Refresh => {
                if let Some(f) = rows.get_mut(&snapshot.source) {
                    f.observed_at = snapshot.observed_at;
                }
            }
            Confirmation::Stale | Confirmation::Duplicate => {}
        }
        decided.push((id.as_str(), snapshot.source, snapshot.observed_at, c));
    }
    let mut p = Plan {
        refreshed: vec![],
        seen: vec![],
        applied: 0,
        stale: 0,
        duplicate: 0,
        load,
    };
    let mut last: BTreeMap<(&str, Source), chrono::DateTime<Utc>> = BTreeMap::new();
    for (id, source, at, c) in decided {
        if p.load.contains(id) {
            continue;
        }
        if p.count(c) {
            last.insert((id, source), at);
        }
    }
    p.refreshed = last.into_iter().map(|((i, s), at)| (i, s, at)).collect();
    let mut seen: BTreeMap<&str, chrono::DateTime<Utc>> = BTreeMap::new();
    for (id, at, c) in heartbeats {
        if p.load.contains(id) {
            continue;
        }
        if p.count(c) {
            seen.insert(id, at);
        }
    }
    p.seen = seen.into_iter().collect();
    p
}

fn merge(into: &mut BatchStats, s: BatchStats) {
    into.applied += s.applied;
    into.confirmed += s.confirmed;
    into.stale += s.stale;
    into.duplicate += s.duplicate;
    into.unresolved += s.unresolved;
    into.deferred += s.deferred;
    into.summary.written.devices += s.summary.written.devices;
    into.summary.written.conditions += s.summary.written.conditions;
    into.summary.written.freshness += s.summary.written.freshness;
    into.summary.events += s.summary.events;
    into.summary.lifecycle += s.summary.lifecycle;
}
