//! The one poll loop: read the source, map, publish, sleep a jittered
//! interval, until shutdown. A connector supplies a [`Target`] per scope
//! (usually a site); the loop owns everything else, including the outage
//! rule of `spec/connectors.md`.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::config::PollConfig;
use chrono::{DateTime, Utc};
use fleet_domain::Source;
use fleet_proto::v1::{self, condition_snapshot::Mirror};
use fleet_runtime::Shutdown;

use crate::backoff::{jittered, unit};
use crate::error::{truncate, SourceError};
use crate::metrics::ConnectorMetrics;
use crate::publish::Bus;
use crate::snapshot::{all_unknown, key_id, observed_now};

/// What one poll may use besides its own client.
pub struct PollContext<'a> {
    /// The `observed_at` every snapshot of this poll carries.
    pub observed_at: DateTime<Utc>,
    pub bus: &'a Bus,
    pub metrics: &'a ConnectorMetrics,
}

/// What a target reads: its source at one fleet site.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub source: Source,
    /// The fleet site (a label for logs and metrics).
    pub site: &'a str,
    /// The reason of the `Unknown` conditions while the source cannot be
    /// read (`IronicUnreachable`, `SchedulerUnreachable`, ...).
    pub outage_reason: &'static str,
}

impl<'a> Scope<'a> {
    pub fn new(source: Source, site: &'a str, outage_reason: &'static str) -> Self {
        Scope {
            source,
            site,
            outage_reason,
        }
    }
}

/// One scope of one source: a client for the system and a pure mapping
/// from its JSON to snapshots.
pub trait Target: Send + 'static {
    fn scope(&self) -> Scope<'_>;
    /// The mirror an outage snapshot carries. `None` leaves every mirror
    /// at its last-known value.
    fn outage_mirror(&self) -> Option<Mirror> {
        None
    }
    /// What to publish for a device the previous read listed and this one
    /// does not; `None` publishes nothing (its rows then go stale).
    fn vanished(&self, _key: &v1::DeviceKey, _at: DateTime<Utc>) -> Option<v1::ConditionSnapshot> {
        None
    }
    /// What an outage publishes for a device the last good read listed:
    /// by default every condition the source owns `Unknown` with
    /// [`Target::outage_reason`] and `message` (the error), and
    /// [`Target::outage_mirror`]. A source whose messages must open with
    /// something of their own (health: the series selector) overrides it.
    fn outage(
        &self,
        key: &v1::DeviceKey,
        at: DateTime<Utc>,
        message: &str,
    ) -> Option<v1::ConditionSnapshot> {
        let scope = self.scope();
        all_unknown(
            scope.source,
            key.clone(),
            at,
            scope.outage_reason,
            message,
            self.outage_mirror(),
        )
    }
    /// Reads the source once and maps what it read. An error is an outage.
    fn poll(
        &mut self,
        ctx: PollContext<'_>,
    ) -> impl Future<Output = Result<Vec<v1::ConditionSnapshot>, SourceError>> + Send;
}

/// The device keys of the last successful read: what an outage speaks for,
/// and what a later read compares with to find vanished devices; with each
/// key the content of its last snapshot, to tell a change from a resync.
#[derive(Debug, Default)]
pub struct Tracker {
    last_seen: BTreeMap<(String, String, String), (v1::DeviceKey, Option<u64>)>,
}

/// What a successful read publishes.
#[derive(Debug, Default)]
pub struct Observed {
    /// New devices and devices whose snapshot differs from the previous
    /// read's in anything but `observed_at`: published at once.
    pub observed: Vec<v1::ConditionSnapshot>,
    /// Snapshots equal to the previous read's but for `observed_at`: they
    /// only keep the hub's freshness, so they may be spread over the
    /// interval (`poll.resync_spread`).
    pub resync: Vec<v1::ConditionSnapshot>,
    pub vanished: Vec<v1::ConditionSnapshot>,
    /// Keys listed twice in one read; the first listing wins.
    pub duplicates: Vec<v1::DeviceKey>,
}

impl Tracker {
    pub fn len(&self) -> usize {
        self.last_seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_seen.is_empty()
    }

    pub fn keys(&self) -> impl Iterator<Item = &v1::DeviceKey> {
        self.last_seen.values().map(|(k, _)| k)
    }

    /// Records a successful read and returns what to publish.
    pub fn read_ok<T: Target + ?Sized>(
        &mut self,
        target: &T,
        snapshots: Vec<v1::ConditionSnapshot>,
        at: DateTime<Utc>,
    ) -> Observed {
        let mut out = Observed::default();
        let mut now_seen = BTreeMap::new();
        for s in snapshots {
            let Some(k) = s.device.clone() else { continue };
            let id = key_id(&k);
            if now_seen.contains_key(&id) {
                out.duplicates.push(k);
                continue;
            }
            let content = content_of(&s);
            let before = self.last_seen.get(&id).and_then(|(_, c)| *c);
            now_seen.insert(id, (k, Some(content)));
            if before == Some(content) {
                out.resync.push(s);
            } else {
                out.observed.push(s);
            }
        }
        for (id, (k, _)) in &self.last_seen {
            if !now_seen.contains_key(id) {
                if let Some(s) = target.vanished(k, at) {
                    out.vanished.push(s);
                }
            }
        }
        self.last_seen = now_seen;
        out
    }

    /// The outage snapshots for a failed read: every device last seen, its
    /// conditions `Unknown` with the target's outage reason. What the next
    /// good read lists is a change again (the hub then holds `Unknown`).
    pub fn read_failed<T: Target + ?Sized>(
        &mut self,
        target: &T,
        at: DateTime<Utc>,
        error: &SourceError,
    ) -> Vec<v1::ConditionSnapshot> {
        let message = truncate(&error.to_string(), 300);
        for (_, content) in self.last_seen.values_mut() {
            *content = None;
        }
        self.last_seen
            .values()
            .filter_map(|(k, _)| target.outage(k, at, &message))
            .collect()
    }
}

/// A snapshot's content without `observed_at`.
fn content_of(s: &v1::ConditionSnapshot) -> u64 {
    use fleet_proto::Message;
    use std::hash::{Hash, Hasher};
    let mut bare = s.clone();
    bare.observed_at = None;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bare.encode_to_vec().hash(&mut h);
    h.finish()
}

/// How long to spread `n` resync snapshots over: `spread` of the
/// interval, none when there is nothing to spread.
pub fn spread_budget(interval: Duration, spread: f64, n: usize) -> Duration {
    if n == 0 || !spread.is_finite() || spread <= 0.0 {
        return Duration::ZERO;
    }
    interval.mul_f64(spread.min(0.9))
}

/// Polls `target` until shutdown. The read is abandoned when shutdown
/// arrives; a publish in progress is finished.
pub async fn run_target<T: Target>(
    mut target: T,
    bus: Bus,
    metrics: ConnectorMetrics,
    poll: PollConfig,
    mut shutdown: Shutdown,
) {
    let scope = target.scope();
    let source = scope.source.as_str();
    let site = scope.site.to_string();
    let outage_reason = scope.outage_reason;
    let interval = poll
        .resync_interval
        .clamp(Duration::from_millis(50), Duration::from_secs(86_400));
    let mut tracker = Tracker::default();
    // Failed reads in a row: the outage is logged when it starts and when
    // it ends, the reads between at debug (the error metric counts each).
    let mut failed_reads: u64 = 0;
    let mut duplicates = crate::Recurring::default();
    tracing::info!(
        source,
        site,
        interval_secs = interval.as_secs_f64(),
        "poll loop started"
    );
    loop {
        let started = Instant::now();
        let mut spent_pacing = Duration::ZERO;
        let at = observed_now();
        // One trace per read: every observation it publishes carries this
        // span's `traceparent`, so connector -> hub -> consumer is one trace.
        let read_span = tracing::info_span!("connector.read", source, site = %site);
        let read = tokio::select! {
            r = target.poll(PollContext { observed_at: at, bus: &bus, metrics: &metrics }) => r,
            _ = shutdown.wait() => break,
        };
        let outcome = match read {
            Ok(mut snapshots) => {
                if !poll.name_keys.is_identity() {
                    for s in &mut snapshots {
                        if let Some(k) = s.device.as_mut().filter(|k| k.kind == "name") {
                            k.key = poll.name_keys.apply(&k.key);
                        }
                    }
                }
                let o = tracker.read_ok(&target, snapshots, at);
                if failed_reads > 0 {
                    tracing::info!(
                        source,
                        site,
                        devices = tracker.len(),
                        failed_reads,
                        "source readable again"
                    );
                    failed_reads = 0;
                }
                for k in &o.duplicates {
                    if duplicates.starts(format!("{}={}", k.kind, k.key)) {
                        tracing::warn!(source, site, key_kind = %k.kind, device_key = %k.key, "device listed twice in one read; the first listing is used (logged again when it ends)");
                    }
                    metrics.warning(source, "duplicate_key");
                }
                for (key, reads) in duplicates.end_round() {
                    tracing::info!(source, site, device_key = %key, reads, "device no longer listed twice");
                }
                metrics.devices(source, &site, tracker.len());
                let mut failed = 0;
                for (kind, snapshots) in [("observed", &o.observed), ("vanished", &o.vanished)] {
                    failed += bus
                        .publish_all(
                            &metrics,
                            source,
                            &site,
                            kind,
                            snapshots,
                            poll.publish_in_flight,
                        )
                        .instrument(read_span.clone())
                        .await
                        .failed;
                }
                // Resyncs only keep the hub's freshness: spread over part
                // of the interval, they do not queue ahead of other
                // sources' changes and the agents' heartbeats in one burst.
                let paced = Instant::now();
                let budget = spread_budget(interval, poll.resync_spread, o.resync.len());
                let r = tokio::select! {
                    r = bus.publish_spread(
                        &metrics,
                        source,
                        &site,
                        &o.resync,
                        poll.publish_in_flight,
                        budget,
                    ).instrument(read_span.clone()) => r,
                    _ = shutdown.wait() => break,
                };
                spent_pacing = paced.elapsed();
                tracing::debug!(
                    source,
                    site,
                    changed = o.observed.len(),
                    resync = o.resync.len(),
                    vanished = o.vanished.len(),
                    failed = failed + r.failed,
                    "poll published"
                );
                "ok"
            }
            Err(e) => {
                let snapshots = tracker.read_failed(&target, at, &e);
                failed_reads += 1;
                let what = if !snapshots.is_empty() {
                    "source cannot be read; publishing its conditions as Unknown (logged again when it is readable)"
                } else if tracker.len() == 0 {
                    "source cannot be read; no device seen yet, nothing is published (logged again when it is readable)"
                } else {
                    "source cannot be read; it owns no conditions, nothing is published (logged again when it is readable)"
                };
                if failed_reads == 1 {
                    tracing::error!(source, site, kind = e.kind(), error = %e, devices = snapshots.len(),
                        reason = outage_reason, "{what}");
                } else {
                    tracing::debug!(source, site, kind = e.kind(), error = %e, failed_reads, "source still cannot be read");
                }
                metrics.error(source, &site, e.kind());
                bus.publish_all(
                    &metrics,
                    source,
                    &site,
                    "outage",
                    &snapshots,
                    poll.publish_in_flight,
                )
                .instrument(read_span.clone())
                .await;
                "outage"
            }
        };
        metrics.poll(source, &site, outcome, started.elapsed());
        // The read's span ends with its publishing, not after the pause.
        drop(read_span);
        // The time spent pacing resyncs is part of the interval.
        let wait = jittered(interval, poll.jitter, unit()).saturating_sub(spent_pacing);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait() => break,
        }
    }
    tracing::info!(source, site, "poll loop stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{condition, key, snapshot};
    use fleet_domain::{ConditionStatus, ConditionType, KeyKind};

    struct Fake {
        vanish: bool,
    }

    impl Target for Fake {
        fn scope(&self) -> Scope<'_> {
            Scope::new(Source::Slurm, "s1", "SchedulerUnreachable")
        }
        fn outage_mirror(&self) -> Option<Mirror> {
            Some(Mirror::Slurm(v1::SlurmMirror {
                states: vec![],
                mode: "keep".into(),
            }))
        }
        fn vanished(&self, k: &v1::DeviceKey, at: DateTime<Utc>) -> Option<v1::ConditionSnapshot> {
            self.vanish.then(|| {
                snapshot(
                    Source::Slurm,
                    k.clone(),
                    at,
                    vec![condition(
                        ConditionType::SlurmRegistered,
                        ConditionStatus::False,
                        "NoLongerObserved",
                        "",
                    )],
                    None,
                )
            })
        }
        async fn poll(
            &mut self,
            _ctx: PollContext<'_>,
        ) -> Result<Vec<v1::ConditionSnapshot>, SourceError> {
            Ok(vec![])
        }
    }

    fn seen(name: &str, at: DateTime<Utc>) -> v1::ConditionSnapshot {
        snapshot(
            Source::Slurm,
            key("s1", KeyKind::Name, name),
            at,
            vec![],
            None,
        )
    }

    #[test]
    fn outage_speaks_for_the_devices_last_seen_and_keeps_mirrors() {
        let t = Fake { vanish: true };
        let mut tr = Tracker::default();
        let at = observed_now();
        let err = SourceError::Connect {
            url: "http://slurm:6820/slurm/v0.0.38/nodes".into(),
            message: "connection refused".into(),
        };
        assert!(tr.read_failed(&t, at, &err).is_empty(), "nothing seen yet");
        let o = tr.read_ok(
            &t,
            vec![seen("gpu01", at), seen("gpu02", at), seen("gpu01", at)],
            at,
        );
        assert_eq!(o.observed.len(), 2);
        assert_eq!(o.duplicates.len(), 1);
        assert!(o.vanished.is_empty());
        let out = tr.read_failed(&t, at, &err);
        assert_eq!(out.len(), 2);
        for s in &out {
            assert_eq!(s.conditions.len(), 2);
            for c in &s.conditions {
                assert_eq!(c.status, "Unknown");
                assert_eq!(c.reason, "SchedulerUnreachable");
                assert!(c.message.contains("connection refused"), "{}", c.message);
            }
            assert_eq!(
                s.mirror,
                Some(Mirror::Slurm(v1::SlurmMirror {
                    states: vec![],
                    mode: "keep".into()
                }))
            );
        }
        // A failed read forgets nothing.
        assert_eq!(tr.len(), 2);
    }

    #[test]
    fn an_unchanged_snapshot_is_a_resync_until_an_outage() {
        let t = Fake { vanish: false };
        let mut tr = Tracker::default();
        let at = observed_now();
        let later = at + chrono::Duration::seconds(60);
        let o = tr.read_ok(&t, vec![seen("gpu01", at), seen("gpu02", at)], at);
        assert_eq!((o.observed.len(), o.resync.len()), (2, 0), "new devices");
        // gpu02 changes; gpu01 differs only in observed_at.
        let mut changed = seen("gpu02", later);
        changed.conditions.push(condition(
            ConditionType::SlurmRegistered,
            ConditionStatus::True,
            "",
            "",
        ));
        let o = tr.read_ok(&t, vec![seen("gpu01", later), changed.clone()], later);
        assert_eq!(o.observed.len(), 1);
        assert_eq!(o.observed[0].device.as_ref().unwrap().key, "gpu02");
        assert_eq!(o.resync.len(), 1);
        assert_eq!(o.resync[0].device.as_ref().unwrap().key, "gpu01");
        // After an outage the hub holds Unknown: everything is a change.
        let err = SourceError::Connect {
            url: "http://slurm:6820/".into(),
            message: "connection refused".into(),
        };
        tr.read_failed(&t, later, &err);
        let o = tr.read_ok(&t, vec![seen("gpu01", later), changed], later);
        assert_eq!((o.observed.len(), o.resync.len()), (2, 0));
    }

    #[test]
    fn resyncs_are_spread_over_part_of_the_interval() {
        let i = Duration::from_secs(100);
        assert_eq!(spread_budget(i, 0.5, 10), Duration::from_secs(50));
        assert_eq!(
            spread_budget(i, 0.5, 0),
            Duration::ZERO,
            "nothing to spread"
        );
        assert_eq!(spread_budget(i, 0.0, 10), Duration::ZERO, "disabled");
        assert_eq!(spread_budget(i, f64::NAN, 10), Duration::ZERO);
        assert_eq!(spread_budget(i, 3.0, 10), Duration::from_secs(90), "capped");
    }

    #[test]
    fn devices_that_leave_the_listing_are_vanished_once() {
        let t = Fake { vanish: true };
        let mut tr = Tracker::default();
        let at = observed_now();
        tr.read_ok(&t, vec![seen("gpu01", at), seen("gpu02", at)], at);
        let o = tr.read_ok(&t, vec![seen("gpu01", at)], at);
        assert_eq!(o.vanished.len(), 1);
        assert_eq!(o.vanished[0].device.as_ref().unwrap().key, "gpu02");
        let o = tr.read_ok(&t, vec![seen("gpu01", at)], at);
        assert!(o.vanished.is_empty(), "published once, then forgotten");
        let quiet = Fake { vanish: false };
        let o = tr.read_ok(&quiet, vec![], at);
        assert!(o.vanished.is_empty());
        assert!(tr.is_empty());
    }
}
