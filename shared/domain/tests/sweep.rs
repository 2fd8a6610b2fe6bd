//! The sweeper's `sweep_at` (migration 0023): kept by bringing it forward
//! to what [`DeviceState::sweep_lowered`] names at each write, and set again
//! by a sweep, it is never later than any deadline the device has, whatever
//! order its snapshots and sessions come in.

use chrono::{DateTime, Duration, TimeZone, Utc};
use fleet_domain::catalogue::observation_types_of;
use fleet_domain::state::*;
use fleet_domain::*;
use proptest::prelude::*;

fn t(i: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_700_000_000 + i, 0).unwrap()
}

const SOURCES: [Source; 4] = [
    Source::Slurm,
    Source::Netbox,
    Source::Openstack,
    Source::Borneo,
];

fn deadlines() -> Deadlines {
    let mut ttls = Ttls::uniform(Duration::seconds(180));
    ttls.per_source
        .insert(Source::Netbox, Duration::seconds(900));
    ttls.per_source
        .insert(Source::Borneo, Duration::seconds(60));
    Deadlines {
        ttls,
        unreachable_after: Duration::seconds(90),
        lost_after: Duration::seconds(600),
    }
}

/// Every deadline of the device: each source's silence and its session's
/// liveness timeouts.
fn every_deadline(s: &DeviceState, d: &Deadlines) -> Option<DateTime<Utc>> {
    s.freshness
        .iter()
        .map(|(source, f)| d.silence(*source, f.observed_at))
        .chain(d.liveness(&s.record))
        .min()
}

#[derive(Debug, Clone)]
enum Step {
    /// A snapshot of `SOURCES[i]` observed at `t(at)`, with `v` in it.
    Snapshot(usize, i64, u8),
    /// A session event: connectivity `c` (index into a list), last seen at `t(at)`.
    Session(u8, i64),
    Delete(bool),
    /// A sweep sets sweep_at again from the device's rows.
    Sweep,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..SOURCES.len(), 0i64..2_000, 0u8..3).prop_map(|(i, at, v)| Step::Snapshot(i, at, v)),
        2 => (0u8..4, 0i64..2_000).prop_map(|(c, at)| Step::Session(c, at)),
        1 => any::<bool>().prop_map(Step::Delete),
        1 => Just(Step::Sweep),
    ]
}

proptest! {
    #[test]
    fn sweep_at_is_never_later_than_a_deadline(steps in proptest::collection::vec(step(), 1..40)) {
        let d = deadlines();
        let mut s = DeviceState::new(DeviceRecord::new("dev_1".into(), "s1".into(), "n1".into()));
        // No row: no deadline yet.
        let mut sweep_at: Option<DateTime<Utc>> = None;
        let least = |a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, None) => a,
            (None, b) => b,
        };
        for st in &steps {
            let stored = s.clone();
            match st {
                Step::Snapshot(i, at, v) => {
                    // One of the types the source owns (none for some).
                    let conditions = observation_types_of(SOURCES[*i])
                        .take(1)
                        .map(|ty| ConditionInput {
                            condition_type: ty,
                            status: ConditionStatus::ALL[*v as usize % 3],
                            reason: String::new(),
                            message: String::new(),
                        })
                        .collect();
                    let snap = Snapshot {
                        bindings: vec![],
                        source: SOURCES[*i],
                        observed_at: t(*at),
                        conditions,
                        mirror: Mirror::None,
                    };
                    s.apply_snapshot(&snap, t(3_000));
                }
                Step::Session(c, at) => {
                    s.record.connectivity = [
                        Connectivity::Connected,
                        Connectivity::Unreachable,
                        Connectivity::Lost,
                        Connectivity::Disconnected,
                    ][*c as usize];
                    // A session only moves forward, as the hub's does.
                    let seen = t(*at).max(s.record.session.last_seen.unwrap_or(t(0)));
                    s.record.session.last_seen = Some(seen);
                }
                Step::Delete(deleted) => s.record.deleted = *deleted,
                Step::Sweep => {
                    sweep_at = every_deadline(&s, &d).filter(|_| !s.record.deleted);
                    continue;
                }
            }
            sweep_at = least(sweep_at, s.sweep_lowered(&stored, &d));
            if !s.record.deleted {
                if let Some(next) = every_deadline(&s, &d) {
                    prop_assert!(
                        sweep_at.is_some_and(|at| at <= next),
                        "sweep_at {:?} after {:?}: the device's next deadline is {}",
                        sweep_at, st, next
                    );
                }
            }
        }
    }
}
