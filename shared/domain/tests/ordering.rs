//! `spec/quality.md`: "any permutation with duplicates of a snapshot
//! sequence ends in the same state as in-order application".

use chrono::{DateTime, Duration, TimeZone, Utc};
use fleet_domain::state::*;
use fleet_domain::*;
use proptest::prelude::*;

fn base() -> DeviceState {
    DeviceState::new(DeviceRecord::new("dev_1".into(), "s1".into(), "n1".into()))
}

fn t(i: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_700_000_000 + i, 0).unwrap()
}

fn status(i: u8) -> ConditionStatus {
    ConditionStatus::ALL[(i % 3) as usize]
}

/// A condition input with no message.
fn input(condition_type: ConditionType, status: ConditionStatus, reason: &str) -> ConditionInput {
    ConditionInput {
        condition_type,
        status,
        reason: reason.into(),
        message: String::new(),
    }
}

/// A snapshot that names no bindings.
fn snapshot(
    source: Source,
    observed_at: DateTime<Utc>,
    conditions: Vec<ConditionInput>,
    mirror: Mirror,
) -> Snapshot {
    Snapshot {
        bindings: vec![],
        source,
        observed_at,
        conditions,
        mirror,
    }
}

/// A snapshot in which each of `types` reads True.
fn all_true(source: Source, at: i64, types: &[ConditionType]) -> Snapshot {
    let conditions = types
        .iter()
        .map(|ty| input(*ty, ConditionStatus::True, ""))
        .collect();
    snapshot(source, t(at), conditions, Mirror::None)
}

/// Borneo's custody snapshot of a device gone GOOGLE_OWNED.
fn google_owned(at: i64) -> Snapshot {
    let mirror = Mirror::Custody {
        state: "GOOGLE_OWNED".into(),
        credential_ref: None,
    };
    snapshot(Source::Borneo, t(at), vec![], mirror)
}

/// The front-end flip's verified latch, written True (observed at 1).
fn write_verified_flip(s: &mut DeviceState, now: DateTime<Utc>) {
    let w = input(
        ConditionType::FrontendPortsInCustomerVrf,
        ConditionStatus::True,
        "CustomerVrfFlipVerified",
    );
    s.apply_condition_write(Source::FrontendFabric, &w, Some(t(1)), false, now)
        .unwrap();
}

/// What the fast path says of `snap` from the device's freshness row and
/// version alone.
fn confirm_snapshot(
    s: &DeviceState,
    snap: &Snapshot,
    now: DateTime<Utc>,
    ttls: &Ttls,
) -> Confirmation {
    confirm(
        s.freshness.get(&snap.source),
        s.record.version,
        snap.source,
        snap.observed_at,
        &snap.digest(),
        now,
        ttls,
    )
}

/// One change the way the hub makes it: the edit, then `finish` against the
/// state before it.
fn settle(
    s: &mut DeviceState,
    now: DateTime<Utc>,
    ttls: &Ttls,
    edit: impl FnOnce(&mut DeviceState),
) {
    let before = s.clone();
    edit(s);
    s.finish(&before, false, now, ttls);
}

/// Drives a fresh device through generated steps the way the hub does:
/// each step's edit, then `finish` at the clock the step leaves. A step that
/// asked a fast path first returns its answer, the full path's outcome and
/// what the refresh check needs: the fast path's `Stale` and `Duplicate`
/// must be the full path's, its `Refresh` an applied change, and
/// `on_refresh` (given the state before the step and after it, and the
/// clock) holds the full path's state to the fast one's.
fn drive<S, R>(
    steps: Vec<S>,
    ttls: &Ttls,
    mut apply: impl FnMut(&mut DeviceState, &mut DateTime<Utc>, S) -> Option<(Confirmation, Outcome, R)>,
    mut on_refresh: impl FnMut(
        &DeviceState,
        &DeviceState,
        DateTime<Utc>,
        R,
    ) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let mut now = t(1_000);
    let mut s = base();
    for step in steps {
        let before = s.clone();
        let asked = apply(&mut s, &mut now, step);
        s.finish(&before, false, now, ttls);
        let Some((c, outcome, r)) = asked else {
            continue;
        };
        match c {
            Confirmation::Stale => prop_assert_eq!(outcome, Outcome::Stale),
            Confirmation::Duplicate => prop_assert_eq!(outcome, Outcome::Duplicate),
            Confirmation::Load => {}
            Confirmation::Refresh => {
                prop_assert_eq!(outcome, Outcome::Applied);
                on_refresh(&before, &s, now, r)?;
            }
        }
    }
    Ok(())
}

/// A snapshot from one of three sources with generated values.
fn snap(source: u8, at: i64, vals: [u8; 6]) -> Snapshot {
    let (source, types): (Source, Vec<ConditionType>) = match source % 3 {
        0 => (
            Source::Openstack,
            fleet_domain::catalogue::observation_types_of(Source::Openstack).collect(),
        ),
        1 => (
            Source::Slurm,
            fleet_domain::catalogue::observation_types_of(Source::Slurm).collect(),
        ),
        _ => (
            Source::HealthStatus,
            fleet_domain::catalogue::observation_types_of(Source::HealthStatus)
                .take(3)
                .collect(),
        ),
    };
    let conditions = types
        .iter()
        .zip(vals)
        // Leave some types out: they must read NotReported either way.
        .filter(|(_, v)| *v != 7)
        .map(|(ty, v)| input(*ty, status(v), &format!("R{}", v % 2)))
        .collect();
    let mirror = match source {
        Source::Slurm => Mirror::Slurm {
            states: vec![if vals[0] % 2 == 0 {
                "IDLE".into()
            } else {
                "DOWN".into()
            }],
            mode: SlurmMode::Observed,
        },
        Source::HealthStatus => Mirror::Health {
            chassis: ChassisHealth::ALL.get((vals[1] % 4) as usize).copied(),
        },
        _ => Mirror::None,
    };
    // Openstack resolves the Placement binding, fails to, or leaves it out.
    let bindings = match (source, vals[2] % 3) {
        (Source::Openstack, 1) => vec![fleet_domain::binding::BindingInput::Resolved {
            resource: fleet_domain::binding::Resource::Placement,
            resource_id: format!("rp-{}", vals[3] % 2),
        }],
        (Source::Openstack, 2) => vec![fleet_domain::binding::BindingInput::Failed {
            resource: fleet_domain::binding::Resource::Placement,
            reason: "PlacementUnreachable".into(),
            message: String::new(),
        }],
        _ => vec![],
    };
    Snapshot {
        source,
        observed_at: t(at),
        conditions,
        mirror,
        bindings,
    }
}

/// One openstack snapshot, the same content whenever it is observed (`at`).
fn repeated(at: i64) -> Snapshot {
    snap(0, at, [1, 0, 1, 0, 1, 0])
}

/// The state with the clocks that legitimately depend on delivery order
/// (when a value was first seen, when the hub received it) left out.
fn semantic(s: &DeviceState) -> impl PartialEq + std::fmt::Debug {
    let conds: Vec<_> = s
        .conditions
        .values()
        .map(|c| {
            (
                c.condition_type,
                c.status,
                c.reason.clone(),
                c.source,
                c.decisive,
                s.last_confirmed(c),
            )
        })
        .collect();
    let mut r = s.record.clone();
    r.entered_service_at = None;
    r.failed_at = None;
    // A binding's resolved_at / failed_at say when it was first seen so,
    // and what a failed row keeps (its last-known id, or the row itself
    // once its source stops listing it) is what the hub heard of before:
    // history, which depends on what arrived first. The rest converges.
    let bindings: Vec<_> = s
        .bindings
        .values()
        .filter(|b| !(b.failed_at.is_some() && b.reason == fleet_domain::binding::NOT_REPORTED))
        .map(|b| {
            let fresh = s.freshness.get(&b.source).map(|f| f.observed_at);
            (
                b.resource,
                b.resource_id.clone().filter(|_| b.failed_at.is_none()),
                b.failed_at.is_some(),
                b.reason.clone(),
                fresh.map_or(b.observed_at, |f| f.max(b.observed_at)),
            )
        })
        .collect();
    (r, conds, s.freshness.clone(), bindings)
}

fn apply_all(snaps: &[Snapshot], order: &[usize]) -> DeviceState {
    let now = t(10_000);
    let ttls = Ttls::uniform(Duration::days(365));
    let mut s = base();
    for i in order {
        s.apply_snapshot(&snaps[*i], now);
        s.reconcile(now, &ttls);
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn permutations_with_duplicates_converge(
        raw in prop::collection::vec((0u8..3, 0i64..40, prop::array::uniform6(0u8..8)), 1..12),
        dupes in prop::collection::vec(0usize..100, 0..8),
        seed in any::<u64>(),
    ) {
        let snaps: Vec<Snapshot> = raw.iter().map(|(s, at, v)| snap(*s, *at, *v)).collect();
        let in_order: Vec<usize> = {
            let mut idx: Vec<usize> = (0..snaps.len()).collect();
            idx.sort_by_key(|i| (snaps[*i].observed_at, snaps[*i].digest()));
            idx
        };
        let mut shuffled: Vec<usize> = (0..snaps.len()).chain(dupes.iter().map(|d| d % snaps.len())).collect();
        // Fisher-Yates with a seeded LCG: proptest shrinks the seed.
        let mut x = seed | 1;
        for i in (1..shuffled.len()).rev() {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            shuffled.swap(i, (x >> 33) as usize % (i + 1));
        }
        let a = apply_all(&snaps, &in_order);
        let b = apply_all(&snaps, &shuffled);
        prop_assert_eq!(semantic(&a), semantic(&b));
    }
}

#[test]
fn stale_and_duplicate_are_not_applied() {
    let now = t(100);
    let mut s = base();
    let newer = snap(0, 50, [1, 1, 1, 1, 1, 1]);
    let older = snap(0, 40, [2, 2, 2, 2, 2, 2]);
    assert_eq!(s.apply_snapshot(&newer, now).0, Outcome::Applied);
    // "An observation older than the stored one for the same (device, type) is stale and not applied."
    assert_eq!(s.apply_snapshot(&older, now).0, Outcome::Stale);
    // "One equal in time and content is a duplicate and a no-op."
    let before = s.clone();
    assert_eq!(s.apply_snapshot(&newer, now).0, Outcome::Duplicate);
    assert_eq!(s, before);
}

#[test]
fn snapshot_leaves_out_types_as_not_reported_and_never_touches_latches() {
    let now = t(100);
    let mut s = base();
    write_verified_flip(&mut s, now);
    s.apply_snapshot(
        &snapshot(Source::Openstack, t(2), vec![], Mirror::None),
        now,
    );
    // "Types the source owns and left out are written Unknown, reason NotReported"
    let row = &s.conditions[&ConditionType::IronicMaintenance];
    assert_eq!(
        (row.status, row.reason.as_str()),
        (ConditionStatus::Unknown, "NotReported")
    );
    // "Durable types are never touched by a snapshot."
    assert_eq!(
        s.conditions[&ConditionType::FrontendPortsInCustomerVrf].status,
        ConditionStatus::True
    );
}

#[test]
fn future_and_forbidden_are_typed_errors() {
    let now = t(0);
    let slurm =
        |observed_at, conditions, mirror| snapshot(Source::Slurm, observed_at, conditions, mirror);
    let future = slurm(now + Duration::minutes(6), vec![], Mirror::None);
    assert!(matches!(
        future.validate(now),
        Err(DomainError::FutureObservation { .. })
    ));
    let ok = slurm(now + Duration::minutes(4), vec![], Mirror::None);
    assert!(
        ok.validate(now).is_ok(),
        "within the 5 minutes of tolerated skew"
    );
    let maintenance = input(ConditionType::IronicMaintenance, ConditionStatus::True, "");
    let forbidden = slurm(now, vec![maintenance], Mirror::None);
    assert!(matches!(
        forbidden.validate(now),
        Err(DomainError::ForbiddenSource { .. })
    ));
    // Issue 19: "a mirror of the wrong kind on a snapshot is ... a
    // malformed snapshot, 400", not a forbidden source.
    let wrong_mirror = Snapshot {
        source: Source::Slurm,
        ..google_owned(0)
    };
    match wrong_mirror.validate(now) {
        Err(DomainError::InvalidArgument(m)) => {
            assert_eq!(m, "a slurm snapshot cannot carry the custody mirror")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn custody_entry_writes_the_breach_latch_once() {
    let now = t(100);
    let ttls = Ttls::uniform(Duration::days(1));
    let mut s = base();
    // "GOOGLE_OWNED enters custody: operational_status = delegated, and in the
    // same transaction, if FrontendPortsInCustomerVrf is not True, the
    // hub-ordered latch write Unknown/HandoverBreach"
    let (_, notes) = s.apply_snapshot(&google_owned(1), now);
    s.reconcile(now, &ttls);
    assert!(notes.handover_breach);
    assert_eq!(s.record.operational_status, OperationalStatus::Delegated);
    let latch = &s.conditions[&ConditionType::FrontendPortsInCustomerVrf];
    assert_eq!(
        (latch.status, latch.reason.as_str()),
        (ConditionStatus::Unknown, "HandoverBreach")
    );
    // "A device whose row exists and whose status is unchanged is left alone
    // (the breach is not re-logged)."
    let before = s.clone();
    let (_, notes) = s.apply_snapshot(&google_owned(2), now);
    assert!(!notes.handover_breach);
    assert_eq!(s.conditions, before.conditions);
    // "A poll that finds a delegated device with no latch row writes it the same way (lazy backfill)."
    s.conditions
        .remove(&ConditionType::FrontendPortsInCustomerVrf);
    let (_, notes) = s.apply_snapshot(&google_owned(3), now);
    assert!(notes.handover_breach);
    assert!(s
        .conditions
        .contains_key(&ConditionType::FrontendPortsInCustomerVrf));
    // Frozen: conditions that would derive in_use do not move delegated.
    let cr = all_true(
        Source::Openstack,
        4,
        &[
            ConditionType::CustomerReady,
            ConditionType::InstanceAllocated,
        ],
    );
    s.apply_snapshot(&cr, now);
    s.reconcile(now, &ttls);
    assert_eq!(s.record.operational_status, OperationalStatus::Delegated);
    assert_eq!(
        s.decisive_types(),
        vec![
            ConditionType::CustomerReady,
            ConditionType::InstanceAllocated
        ],
        "decisive flags still update"
    );
}

#[test]
fn verified_flip_means_no_breach() {
    let now = t(100);
    let mut s = base();
    write_verified_flip(&mut s, now);
    let (_, notes) = s.apply_snapshot(&google_owned(2), now);
    assert!(!notes.handover_breach);
    assert_eq!(
        s.conditions[&ConditionType::FrontendPortsInCustomerVrf].status,
        ConditionStatus::True
    );
}

#[test]
fn source_silence_reads_unknown_and_keeps_validation() {
    let ttls = Ttls::uniform(Duration::seconds(60));
    let mut s = base();
    let os = all_true(Source::Openstack, 0, &[ConditionType::InMaintenancePool]);
    let sl = all_true(
        Source::Slurm,
        0,
        &[
            ConditionType::SlurmRegistered,
            ConditionType::SlurmNodeHealthy,
        ],
    );
    s.apply_snapshot(&os, t(0));
    s.apply_snapshot(&sl, t(0));
    s.reconcile(t(1), &ttls);
    assert_eq!(s.record.operational_status, OperationalStatus::Validation);
    // Only SLURM refreshes: openstack goes silent -> InMaintenancePool reads Unknown -> unknown.
    let sl2 = Snapshot {
        observed_at: t(100),
        ..sl.clone()
    };
    s.apply_snapshot(&sl2, t(100));
    s.reconcile(t(100), &ttls);
    assert_eq!(
        s.record.operational_status,
        OperationalStatus::Unknown,
        "a silent source never reads as failed or quarantine"
    );
    // Now openstack refreshes but SLURM is silent: lost from sight -> validation (rule 6).
    let os2 = Snapshot {
        observed_at: t(200),
        ..os
    };
    s.apply_snapshot(&os2, t(200));
    s.reconcile(t(200), &ttls);
    assert_eq!(s.record.operational_status, OperationalStatus::Validation);
}

/// One step of the fast-path property below.
#[derive(Debug, Clone)]
enum Step {
    Snapshot(u8, i64, [u8; 6]),
    /// A single condition write, by slurm (true) or openstack, to a type
    /// it owns, with a status and a time.
    Write(bool, u8, i64),
    /// An operator change to the record (bumps `version`).
    Cordon,
    /// A session event from the gateway: opened, closed (bumps `version`
    /// and moves connectivity and what derives from it).
    Session(bool),
    /// A re-join: a new identity generation (bumps `version`).
    Rejoin,
    /// A mirrored column moved by something other than its snapshot.
    ForeignMirror,
    /// The clock moves on, by seconds (past the TTL now and then).
    Wait(i64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..3, 0i64..20, prop::array::uniform6(0u8..2)).prop_map(|(s, d, v)| Step::Snapshot(s, d, v)),
        2 => (0u8..3, 0i64..20).prop_map(|(v, d)| Step::Write(false, v, d)),
        1 => Just(Step::Cordon),
        2 => any::<bool>().prop_map(Step::Session),
        1 => Just(Step::Rejoin),
        1 => (0u8..3, 0i64..20).prop_map(|(v, d)| Step::Write(true, v, d)),
        1 => Just(Step::ForeignMirror),
        2 => (0i64..90).prop_map(Step::Wait),
    ]
}

#[derive(Debug, Clone)]
enum Beat {
    /// (epoch delta 0..2, event 0 open / 1 heartbeat / 2 close, seconds back/forward, generation)
    Event(i64, u8, i64, i64),
    /// Time passes and the sweeper applies the liveness timeouts.
    Sweep(i64),
}

fn beat() -> impl Strategy<Value = Beat> {
    prop_oneof![
        8 => (0i64..2, 0u8..3, -3i64..10, 0i64..3).prop_map(|(e, k, d, g)| Beat::Event(e, k, d, g)),
        1 => (0i64..200).prop_map(Beat::Sweep),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `confirm` is what lets the hub resync without loading a device; it
    /// must never say `Refresh` where the full path would do more than move
    /// the freshness row, and its stale/duplicate must be the full path's.
    #[test]
    fn the_fast_path_confirms_only_what_the_full_path_would_not_change(
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let ttls = Ttls::uniform(Duration::seconds(60));
        let mut clock = 0i64;
        let mut epoch = 0i64;
        drive(steps, &ttls, |s, now, st| {
            match st {
                Step::Snapshot(src, d, v) => {
                    clock += d;
                    let mut snap = snap(src, 0, v);
                    snap.observed_at = *now - Duration::seconds(30) + Duration::seconds(clock % 40);
                    let c = confirm_snapshot(s, &snap, *now, &ttls);
                    let (outcome, _) = s.apply_snapshot(&snap, *now);
                    return Some((c, outcome, snap));
                }
                Step::Write(slurm, v, d) => {
                    clock += d;
                    // Openstack's IronicMaintenance, or slurm's first type.
                    let (source, condition_type) = if slurm {
                        let t = fleet_domain::catalogue::observation_types_of(Source::Slurm).next().unwrap();
                        (Source::Slurm, t)
                    } else {
                        (Source::Openstack, ConditionType::IronicMaintenance)
                    };
                    let w = input(condition_type, status(v), "");
                    let at = *now - Duration::seconds(30) + Duration::seconds(clock % 40);
                    let _ = s.apply_condition_write(source, &w, Some(at), false, *now);
                }
                Step::Cordon => s.record.cordoned = !s.record.cordoned,
                Step::Session(open) => {
                    epoch += 1;
                    let event = if open { ConnectivityEvent::Opened } else { ConnectivityEvent::Closed };
                    s.apply_connectivity(epoch, "gw-1", event, *now);
                }
                Step::ForeignMirror => s.record.mirrors.slurm_states = vec!["DRAIN".into()],
                Step::Rejoin => s.record.identity_generation += 1,
                // The sweeper re-derives what went silent.
                Step::Wait(secs) => *now += Duration::seconds(secs),
            }
            None
        }, |before, s, now, snap| {
            // The fast path: move observed_at, nothing else.
            let mut fast = before.clone();
            fast.freshness.get_mut(&snap.source).unwrap().observed_at = snap.observed_at;
            // Refreshing changes nothing derivation reads...
            let mut a = fast.clone();
            a.finish(&fast, false, now, &ttls);
            let mut b = before.clone();
            b.finish(before, false, now, &ttls);
            for t in fast.conditions.keys() {
                prop_assert_eq!(fast.effective(*t, now, &ttls), before.effective(*t, now, &ttls));
            }
            prop_assert_eq!(&a.record, &b.record);
            prop_assert_eq!(&a.conditions, &b.conditions);
            // ...and the full path is the fast one plus the
            // sweeper's re-derivation.
            prop_assert_eq!(s, &a);
            Ok(())
        })?;
    }

    /// `confirm_heartbeat` says `Refresh` only where applying the
    /// connectivity observation in full changes nothing but
    /// `session.last_seen`, and its stale/duplicate are the full path's.
    #[test]
    fn the_heartbeat_fast_path_confirms_only_what_the_full_path_would_not_change(
        beats in prop::collection::vec(beat(), 1..40),
    ) {
        let ttls = Ttls::uniform(Duration::days(1));
        let mut epoch = 0i64;
        drive(beats, &ttls, |s, now, b| {
            match b {
                Beat::Event(de, kind, dt, generation) => {
                    epoch += de;
                    let event = [ConnectivityEvent::Opened, ConnectivityEvent::Heartbeat, ConnectivityEvent::Closed][kind as usize];
                    let at = *now + Duration::seconds(dt);
                    *now += Duration::seconds(dt.max(0));
                    let c = confirm_heartbeat(
                        &s.record.session,
                        s.record.connectivity,
                        s.record.observed_generation,
                        epoch,
                        event,
                        at,
                        generation,
                    );
                    let outcome = s.apply_connectivity(epoch, "gw-1", event, at);
                    if outcome == Outcome::Applied {
                        s.report_generation(generation);
                    }
                    Some((c, outcome, at))
                }
                Beat::Sweep(secs) => {
                    *now += Duration::seconds(secs);
                    s.apply_liveness(*now, Duration::seconds(30), Duration::seconds(120));
                    None
                }
            }
        }, |before, s, now, at| {
            let mut fast = before.clone();
            fast.record.session.last_seen = Some(at);
            prop_assert_eq!(fast.record.version, s.record.version, "a heartbeat never bumps version");
            // The full path is the fast one plus the
            // sweeper's re-derivation.
            fast.finish(before, false, now, &ttls);
            prop_assert_eq!(s, &fast);
            Ok(())
        })?;
    }
}

#[test]
fn a_repeated_snapshot_is_confirmed_until_something_it_writes_moves() {
    let ttls = Ttls::uniform(Duration::seconds(60));
    let now = t(40);
    let mut s = base();
    let first = repeated(10);
    let again = repeated(20);
    let c = |s: &DeviceState, snap: &Snapshot| confirm_snapshot(s, snap, now, &ttls);
    assert_eq!(c(&s, &first), Confirmation::Load, "nothing stored yet");
    settle(&mut s, now, &ttls, |s| {
        s.apply_snapshot(&first, now);
    });
    assert_eq!(c(&s, &first), Confirmation::Duplicate);
    assert_eq!(c(&s, &again), Confirmation::Refresh);
    assert_eq!(c(&s, &repeated(5)), Confirmation::Stale);
    // A single write to a row the source owns: the rows no longer hold the
    // snapshot's values as far as the freshness row can vouch.
    let w = input(ConditionType::IronicMaintenance, ConditionStatus::True, "");
    settle(&mut s, now, &ttls, |s| {
        s.apply_condition_write(Source::Openstack, &w, Some(t(15)), false, now)
            .unwrap();
    });
    assert_eq!(c(&s, &again), Confirmation::Load);
    // Applied in full, the snapshot settles again.
    settle(&mut s, now, &ttls, |s| {
        s.apply_snapshot(&again, now);
    });
    let third = repeated(30);
    assert_eq!(c(&s, &third), Confirmation::Refresh);
    // An operator change, a session opening and a write to a type another
    // source owns bump the version or write rows, but nothing the
    // snapshot's full apply would write: still confirmed.
    let v = s.record.version;
    settle(&mut s, now, &ttls, |s| s.record.cordoned = true);
    settle(&mut s, now, &ttls, |s| {
        s.apply_connectivity(1, "gw-1", ConnectivityEvent::Opened, now);
    });
    let slurm_type = fleet_domain::catalogue::observation_types_of(Source::Slurm)
        .next()
        .unwrap();
    let w = input(slurm_type, ConditionStatus::True, "");
    settle(&mut s, now, &ttls, |s| {
        s.apply_condition_write(Source::Slurm, &w, Some(t(15)), false, now)
            .unwrap();
    });
    assert!(
        s.record.version >= v + 2,
        "cordon and open bump the version"
    );
    assert_eq!(c(&s, &third), Confirmation::Refresh);
    // Another source's first snapshot moves its own mirror, not this one's.
    let before = s.clone();
    settle(&mut s, now, &ttls, |s| {
        s.apply_snapshot(&snap(1, 12, [1, 1, 0, 0, 0, 0]), now);
    });
    assert_ne!(
        s.record.mirrors.slurm_states,
        before.record.mirrors.slurm_states
    );
    assert_eq!(c(&s, &third), Confirmation::Refresh);
    // A mirrored column moved by something else: load once more.
    settle(&mut s, now, &ttls, |s| s.record.power = Power::Off);
    assert_eq!(c(&s, &third), Confirmation::Load);
    // A silent source is never refreshed without loading.
    settle(&mut s, now, &ttls, |s| {
        s.apply_snapshot(&third, now);
    });
    // Read 61 s after it was observed, with a 60 s TTL.
    let late = repeated(30 + 61);
    assert_eq!(
        confirm_snapshot(&s, &late, late.observed_at + Duration::seconds(1), &ttls),
        Confirmation::Load,
    );
}

#[test]
fn a_snapshot_that_left_a_later_write_in_place_is_not_settled() {
    let ttls = Ttls::uniform(Duration::seconds(60));
    let now = t(40);
    let mut s = base();
    let first = repeated(10);
    settle(&mut s, now, &ttls, |s| {
        s.apply_snapshot(&first, now);
    });
    // A single write observed at 25 ...
    let w = input(
        ConditionType::IronicMaintenance,
        ConditionStatus::Unknown,
        "Written",
    );
    settle(&mut s, now, &ttls, |s| {
        s.apply_condition_write(Source::Openstack, &w, Some(t(25)), false, now)
            .unwrap();
    });
    // ... outlives the same snapshot observed at 20 ...
    settle(&mut s, now, &ttls, |s| {
        s.apply_snapshot(&repeated(20), now);
    });
    assert_eq!(
        s.conditions[&ConditionType::IronicMaintenance].reason,
        "Written"
    );
    // ... so the one observed at 30, which the full path applies over the
    // write, cannot be confirmed from the freshness row.
    assert_eq!(
        confirm_snapshot(&s, &repeated(30), now, &ttls),
        Confirmation::Load
    );
}

/// Seed 000: "Certificates of an earlier generation never work again." A
/// session opened under an earlier identity generation cannot open or
/// heartbeat the device back to connected; its close still applies.
#[test]
fn connectivity_of_an_earlier_identity_generation_is_refused() {
    let now = Utc::now();
    let mut s = DeviceState::new(DeviceRecord::new("d1".into(), "s1".into(), "n1".into()));
    assert_eq!(
        s.apply_connectivity_of(1, "gw-1", ConnectivityEvent::Opened, now, 1),
        Outcome::Applied
    );
    assert_eq!(s.record.connectivity, Connectivity::Connected);
    // Revoked: the generation moves on.
    fleet_domain::commands::revoke_identity(&mut s.record);
    let later = now + Duration::seconds(1);
    assert_eq!(
        s.apply_connectivity_of(1, "gw-1", ConnectivityEvent::Heartbeat, later, 1),
        Outcome::Stale
    );
    assert_eq!(
        s.apply_connectivity_of(2, "gw-1", ConnectivityEvent::Opened, later, 1),
        Outcome::Stale
    );
    // The old session's close applies; the new generation's open does.
    assert_eq!(
        s.apply_connectivity_of(1, "gw-1", ConnectivityEvent::Closed, later, 1),
        Outcome::Applied
    );
    assert_eq!(s.record.connectivity, Connectivity::Disconnected);
    let again = later + Duration::seconds(1);
    assert_eq!(
        s.apply_connectivity_of(3, "gw-1", ConnectivityEvent::Opened, again, 2),
        Outcome::Applied
    );
    assert_eq!(s.record.connectivity, Connectivity::Connected);
    // Not reported (0): as before.
    assert_eq!(
        s.apply_connectivity_of(
            3,
            "gw-1",
            ConnectivityEvent::Heartbeat,
            again + Duration::seconds(1),
            0
        ),
        Outcome::Applied
    );
}

/// Issue 19: "Devices imported from NetBox get the Ironic node uuid as
/// infrastructure_ref once a unique match is seen"; a ref already set is
/// never replaced by a snapshot.
#[test]
fn an_ironic_snapshot_gives_a_device_without_a_ref_its_node_uuid_once() {
    let ironic = |at: i64, uuid: &str| {
        let mirror = Mirror::Ironic {
            provision_state: "available".into(),
            maintenance: false,
            maintenance_reason: None,
            instance_uuid: None,
            lessee: None,
            power: Power::On,
            node_uuid: Some(uuid.into()),
        };
        snapshot(Source::Openstack, t(at), vec![], mirror)
    };
    let mut s = base();
    assert_eq!(s.record.infrastructure_ref, None);
    s.apply_snapshot(&ironic(1, "node-a"), t(1));
    assert_eq!(s.record.infrastructure_ref.as_deref(), Some("node-a"));
    s.apply_snapshot(&ironic(2, "node-b"), t(2));
    assert_eq!(
        s.record.infrastructure_ref.as_deref(),
        Some("node-a"),
        "an existing ref is kept"
    );
}
