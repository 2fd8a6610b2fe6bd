//! What the sweeper waits for, and when it must look at a device again.
//!
//! A device is due for a sweep when a source's freshness deadline
//! (`observed_at` + the source's TTL) passed since it was last derived, or
//! when its session is past a liveness timeout. Finding that by reading every
//! freshness row of the fleet grows with the fleet (`docs/scaling.md`), and
//! an index on the deadline would cost every freshness-only resync a new
//! entry in it. Instead the hub keeps, per device, a `sweep_at` no later than
//! any deadline still to come: the sweeper reads only the devices whose
//! `sweep_at` has passed, and sets it again from their rows.
//!
//! Deadlines only move later as snapshots and heartbeats arrive (an older
//! snapshot is never applied), so a `sweep_at` once set stays early enough
//! until the device gains a deadline it did not have: a source's first
//! snapshot, a session that opens or changes, a deleted device that comes
//! back. [`DeviceState::sweep_lowered`] names that deadline for the write
//! that brings it.

use super::*;

/// The deadlines the sweeper keeps: a source's silence and a session's
/// liveness timeouts.
#[derive(Debug, Clone)]
pub struct Deadlines {
    pub ttls: Ttls,
    /// A connected device not heard from for this long becomes unreachable.
    pub unreachable_after: Duration,
    /// A connected or unreachable device not heard from for this long is lost.
    pub lost_after: Duration,
}

impl Deadlines {
    /// When `source`'s snapshot observed at `observed_at` goes silent.
    pub fn silence(&self, source: Source, observed_at: DateTime<Utc>) -> DateTime<Utc> {
        observed_at + self.ttls.of(source)
    }

    /// The liveness timeouts `record`'s session runs into, earliest first:
    /// unreachable (a connected device), then lost (connected or
    /// unreachable).
    pub fn liveness(&self, record: &DeviceRecord) -> impl Iterator<Item = DateTime<Utc>> {
        let last = record.session.last_seen;
        let (unreachable, lost) = match record.connectivity {
            Connectivity::Connected => (true, true),
            Connectivity::Unreachable => (false, true),
            _ => (false, false),
        };
        let at = move |on: bool, after: Duration| last.filter(|_| on).map(|l| l + after);
        at(unreachable, self.unreachable_after)
            .into_iter()
            .chain(at(lost, self.lost_after))
    }

    /// A fingerprint of these settings: `sweep_at` values computed under
    /// other settings may be too late, and the hub recomputes them all when
    /// it changes.
    pub fn fingerprint(&self) -> String {
        let ms = |d: Duration| d.num_milliseconds();
        let mut s = format!(
            "default={};unreachable={};lost={}",
            ms(self.ttls.default),
            ms(self.unreachable_after),
            ms(self.lost_after)
        );
        for (source, ttl) in &self.ttls.per_source {
            s.push_str(&format!(";{}={}", source.as_str(), ms(*ttl)));
        }
        s
    }
}

/// What the hub's settings table (`hub_sweep_settings`) and the live
/// replicas (`hub_replicas`) say, as one sweep reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepSettings<'a> {
    /// The fingerprint the `sweep_at` values were last computed under, and
    /// whether a live replica with other settings (or without any on
    /// record: a version before them) was seen since: `None` before any
    /// hub swept.
    pub recorded: Option<(&'a str, bool)>,
    /// The settings of the live replica that started last with the
    /// settings it has (`None`: no live replica has any on record yet).
    pub newest: Option<&'a str>,
    /// Whether a live replica runs other settings than this one, or none
    /// on record.
    pub others_live: bool,
}

/// A sweeper's turn, decided from [`SweepSettings`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepTurn {
    /// A live replica started later with other settings: the sweep is its
    /// to do. Sweeping by these would set `sweep_at` by deadlines the
    /// newer settings may have moved earlier.
    Leave { newer: String },
    /// Sweep. `mark_all`: first make every live device due, because the
    /// stored `sweep_at` values may have been computed under other
    /// settings; `mixed` is recorded with these settings.
    Sweep { mark_all: bool, mixed: bool },
}

/// Whose sweep it is during a rolling change of the freshness TTLs or the
/// liveness timeouts, when replicas with old and new settings run at
/// once. The replicas with the newest settings sweep, the others leave it
/// to them; a replica with other settings left from an older start sweeps
/// again once no newer one is live. Every device is made due once when
/// the settings that sweep change, and once more when the last replica
/// with other settings has gone: until then its lanes may have set a
/// source's first deadline by its own, later, TTL.
pub fn sweep_turn(own: &str, seen: &SweepSettings<'_>) -> SweepTurn {
    if let Some(newer) = seen.newest.filter(|n| *n != own) {
        return SweepTurn::Leave {
            newer: newer.to_string(),
        };
    }
    let mark_all = match seen.recorded {
        None => false,
        Some((fingerprint, mixed)) => fingerprint != own || (mixed && !seen.others_live),
    };
    SweepTurn::Sweep {
        mark_all,
        mixed: seen.others_live,
    }
}

impl DeviceState {
    /// The earliest deadline this state has that `stored` (what the
    /// transaction read) did not, for the write to bring the device's
    /// `sweep_at` forward to; `None` when every deadline of this state was
    /// already one of `stored`'s or later than one of them, or the device
    /// is deleted (a deleted device is never swept).
    pub fn sweep_lowered(&self, stored: &DeviceState, d: &Deadlines) -> Option<DateTime<Utc>> {
        if self.record.deleted {
            return None;
        }
        let back = stored.record.deleted;
        let sources = self.freshness.iter().filter_map(|(source, f)| {
            let new = back
                || stored
                    .freshness
                    .get(source)
                    .is_none_or(|s| f.observed_at < s.observed_at);
            new.then(|| d.silence(*source, f.observed_at))
        });
        // A heartbeat moves `last_seen` later, and the timeouts with it; a
        // change of connectivity, or a `last_seen` earlier than (or where
        // there was none), brings timeouts the device did not have.
        let seen_earlier = match (
            stored.record.session.last_seen,
            self.record.session.last_seen,
        ) {
            (Some(was), Some(now)) => now < was,
            (None, Some(_)) => true,
            (_, None) => false,
        };
        let session_moved =
            back || seen_earlier || self.record.connectivity != stored.record.connectivity;
        let liveness = d.liveness(&self.record).filter(|_| session_moved);
        sources.chain(liveness).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        format!("2026-12-07T{s}Z").parse().unwrap()
    }

    fn deadlines() -> Deadlines {
        let mut ttls = Ttls::uniform(Duration::minutes(3));
        ttls.per_source
            .insert(Source::Netbox, Duration::minutes(15));
        Deadlines {
            ttls,
            unreachable_after: Duration::seconds(90),
            lost_after: Duration::minutes(10),
        }
    }

    fn device() -> DeviceState {
        DeviceState::new(DeviceRecord::new("d1".into(), "s1".into(), "gpu01".into()))
    }

    fn seen(s: &mut DeviceState, source: Source, observed: &str) {
        s.freshness.insert(
            source,
            Freshness {
                observed_at: at(observed),
                digest: vec![1],
                settled_version: UNSETTLED,
            },
        );
    }

    fn connected(s: &mut DeviceState, last_seen: &str) {
        s.record.connectivity = Connectivity::Connected;
        s.record.session.epoch = 1;
        s.record.session.last_seen = Some(at(last_seen));
    }

    /// A case: its name, the device as stored, the write, and the
    /// `sweep_at` it must bring forward to (`None`: what the device had
    /// covers it).
    type Case = (
        &'static str,
        DeviceState,
        Box<dyn Fn(&mut DeviceState)>,
        Option<&'static str>,
    );

    /// Each case: what the write brings, and the `sweep_at` it must bring
    /// forward to.
    #[test]
    fn a_write_lowers_sweep_at_only_for_a_deadline_the_device_did_not_have() {
        let d = deadlines();
        let mut known = device();
        seen(&mut known, Source::Slurm, "12:00:00");
        connected(&mut known, "12:00:00");

        let cases: Vec<Case> = vec![
            (
                "a source's first snapshot: its silence, by its own TTL",
                device(),
                Box::new(|s| seen(s, Source::Netbox, "12:00:00")),
                Some("12:15:00"),
            ),
            (
                "the earliest of two new sources",
                device(),
                Box::new(|s| {
                    seen(s, Source::Netbox, "12:00:00");
                    seen(s, Source::Slurm, "12:01:00");
                }),
                Some("12:04:00"),
            ),
            (
                "a later snapshot of a known source moves its deadline later: nothing",
                known.clone(),
                Box::new(|s| seen(s, Source::Slurm, "12:01:00")),
                None,
            ),
            (
                "a heartbeat (last_seen later, same session): nothing",
                known.clone(),
                Box::new(|s| s.record.session.last_seen = Some(at("12:00:30"))),
                None,
            ),
            (
                "a session that opens: unreachable after 90 s",
                device(),
                Box::new(|s| connected(s, "12:00:00")),
                Some("12:01:30"),
            ),
            (
                "connected -> unreachable: lost after 10 min",
                known.clone(),
                Box::new(|s| s.record.connectivity = Connectivity::Unreachable),
                Some("12:10:00"),
            ),
            (
                "unreachable -> lost: no liveness deadline left",
                {
                    let mut s = device();
                    s.record.connectivity = Connectivity::Unreachable;
                    s.record.session.last_seen = Some(at("12:00:00"));
                    s
                },
                Box::new(|s| s.record.connectivity = Connectivity::Lost),
                None,
            ),
            (
                "a deleted device is never swept",
                device(),
                Box::new(|s| {
                    seen(s, Source::Slurm, "12:00:00");
                    s.record.deleted = true;
                }),
                None,
            ),
            (
                "a deleted device that comes back: every deadline it has",
                {
                    let mut s = known.clone();
                    s.record.deleted = true;
                    s
                },
                Box::new(|s| s.record.deleted = false),
                Some("12:01:30"),
            ),
        ];
        for (name, stored, write, want) in cases {
            let mut after = stored.clone();
            write(&mut after);
            assert_eq!(after.sweep_lowered(&stored, &d), want.map(at), "{name}");
        }
    }

    #[test]
    fn liveness_deadlines_follow_connectivity() {
        let d = deadlines();
        let mut s = device();
        assert_eq!(d.liveness(&s.record).count(), 0, "never connected");
        connected(&mut s, "12:00:00");
        assert_eq!(
            d.liveness(&s.record).collect::<Vec<_>>(),
            vec![at("12:01:30"), at("12:10:00")]
        );
        s.record.connectivity = Connectivity::Disconnected;
        assert_eq!(d.liveness(&s.record).count(), 0, "closed session");
    }

    #[test]
    fn the_fingerprint_changes_with_any_setting() {
        let a = deadlines();
        let mut b = deadlines();
        assert_eq!(a.fingerprint(), b.fingerprint());
        b.ttls
            .per_source
            .insert(Source::Slurm, Duration::minutes(1));
        assert_ne!(a.fingerprint(), b.fingerprint());
        let mut c = deadlines();
        c.lost_after = Duration::minutes(11);
        assert_ne!(a.fingerprint(), c.fingerprint());
    }

    /// `sweep_turn`: a rolling change of the settings, A (old) to B (new).
    #[test]
    fn the_newest_settings_sweep_and_every_device_is_due_after_each_change() {
        let seen = |recorded: Option<(&'static str, bool)>,
                    newest: Option<&'static str>,
                    others_live: bool| SweepSettings {
            recorded,
            newest,
            others_live,
        };
        let sweep = |mark_all, mixed| SweepTurn::Sweep { mark_all, mixed };
        let leave = SweepTurn::Leave { newer: "B".into() };
        let cases = [
            // (replica, what it reads, its turn)
            ("A", seen(None, None, false), sweep(false, false)), // the first hub: records only
            (
                "A",
                seen(Some(("A", false)), Some("A"), false),
                sweep(false, false),
            ), // steady
            (
                "B",
                seen(Some(("A", false)), Some("B"), true),
                sweep(true, true),
            ), // B starts beside A
            ("A", seen(Some(("B", true)), Some("B"), true), leave.clone()), // A leaves it to B
            (
                "B",
                seen(Some(("B", true)), Some("B"), true),
                sweep(false, true),
            ), // A still live
            (
                "B",
                seen(Some(("B", true)), Some("B"), false),
                sweep(true, false),
            ), // A gone: once more
            (
                "B",
                seen(Some(("B", false)), Some("B"), false),
                sweep(false, false),
            ), // steady again
            // B's replicas all died: A is the newest live again.
            (
                "A",
                seen(Some(("B", false)), Some("A"), false),
                sweep(true, false),
            ),
            // A replica of a version without settings on record is live.
            (
                "B",
                seen(Some(("B", false)), Some("B"), true),
                sweep(false, true),
            ),
            // Before this replica's first heartbeat: nobody's settings on record.
            ("B", seen(Some(("A", false)), None, true), sweep(true, true)),
        ];
        for (own, seen, want) in cases {
            assert_eq!(sweep_turn(own, &seen), want, "{own} reading {seen:?}");
        }
    }
}
