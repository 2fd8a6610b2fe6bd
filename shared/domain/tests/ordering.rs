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
        .map(|(ty, v)| ConditionInput {
            condition_type: *ty,
            status: status(v),
            reason: format!("R{}", v % 2),
            message: String::new(),
        })
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
    Snapshot {
        source,
        observed_at: t(at),
        conditions,
        mirror,
    }
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
    (r, conds, s.freshness.clone())
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
    let w = ConditionInput {
        condition_type: ConditionType::FrontendPortsInCustomerVrf,
        status: ConditionStatus::True,
        reason: "CustomerVrfFlipVerified".into(),
        message: String::new(),
    };
    s.apply_condition_write(Source::FrontendFabric, &w, Some(t(1)), false, now)
        .unwrap();
    let snap = Snapshot {
        source: Source::Openstack,
        observed_at: t(2),
        conditions: vec![],
        mirror: Mirror::None,
    };
    s.apply_snapshot(&snap, now);
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
    let future = Snapshot {
        source: Source::Slurm,
        observed_at: now + Duration::minutes(6),
        conditions: vec![],
        mirror: Mirror::None,
    };
    assert!(matches!(
        future.validate(now),
        Err(DomainError::FutureObservation { .. })
    ));
    let ok = Snapshot {
        source: Source::Slurm,
        observed_at: now + Duration::minutes(4),
        conditions: vec![],
        mirror: Mirror::None,
    };
    assert!(
        ok.validate(now).is_ok(),
        "within the 5 minutes of tolerated skew"
    );
    let forbidden = Snapshot {
        source: Source::Slurm,
        observed_at: now,
        conditions: vec![ConditionInput {
            condition_type: ConditionType::IronicMaintenance,
            status: ConditionStatus::True,
            reason: String::new(),
            message: String::new(),
        }],
        mirror: Mirror::None,
    };
    assert!(matches!(
        forbidden.validate(now),
        Err(DomainError::ForbiddenSource { .. })
    ));
}

#[test]
fn custody_entry_writes_the_breach_latch_once() {
    let now = t(100);
    let ttls = Ttls::uniform(Duration::days(1));
    let mut s = base();
    let google = |at| Snapshot {
        source: Source::Borneo,
        observed_at: t(at),
        conditions: vec![],
        mirror: Mirror::Custody {
            state: "GOOGLE_OWNED".into(),
            credential_ref: None,
        },
    };
    // "GOOGLE_OWNED enters custody: operational_status = delegated, and in the
    // same transaction, if FrontendPortsInCustomerVrf is not True, the
    // hub-ordered latch write Unknown/HandoverBreach"
    let (_, notes) = s.apply_snapshot(&google(1), now);
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
    let (_, notes) = s.apply_snapshot(&google(2), now);
    assert!(!notes.handover_breach);
    assert_eq!(s.conditions, before.conditions);
    // "A poll that finds a delegated device with no latch row writes it the same way (lazy backfill)."
    s.conditions
        .remove(&ConditionType::FrontendPortsInCustomerVrf);
    let (_, notes) = s.apply_snapshot(&google(3), now);
    assert!(notes.handover_breach);
    assert!(s
        .conditions
        .contains_key(&ConditionType::FrontendPortsInCustomerVrf));
    // Frozen: conditions that would derive in_use do not move delegated.
    let cr = Snapshot {
        source: Source::Openstack,
        observed_at: t(4),
        conditions: vec![
            ConditionInput {
                condition_type: ConditionType::CustomerReady,
                status: ConditionStatus::True,
                reason: String::new(),
                message: String::new(),
            },
            ConditionInput {
                condition_type: ConditionType::InstanceAllocated,
                status: ConditionStatus::True,
                reason: String::new(),
                message: String::new(),
            },
        ],
        mirror: Mirror::None,
    };
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
    let w = ConditionInput {
        condition_type: ConditionType::FrontendPortsInCustomerVrf,
        status: ConditionStatus::True,
        reason: "CustomerVrfFlipVerified".into(),
        message: String::new(),
    };
    s.apply_condition_write(Source::FrontendFabric, &w, Some(t(1)), false, now)
        .unwrap();
    let g = Snapshot {
        source: Source::Borneo,
        observed_at: t(2),
        conditions: vec![],
        mirror: Mirror::Custody {
            state: "GOOGLE_OWNED".into(),
            credential_ref: None,
        },
    };
    let (_, notes) = s.apply_snapshot(&g, now);
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
    let os = Snapshot {
        source: Source::Openstack,
        observed_at: t(0),
        conditions: vec![ConditionInput {
            condition_type: ConditionType::InMaintenancePool,
            status: ConditionStatus::True,
            reason: String::new(),
            message: String::new(),
        }],
        mirror: Mirror::None,
    };
    let sl = Snapshot {
        source: Source::Slurm,
        observed_at: t(0),
        conditions: vec![
            ConditionInput {
                condition_type: ConditionType::SlurmRegistered,
                status: ConditionStatus::True,
                reason: String::new(),
                message: String::new(),
            },
            ConditionInput {
                condition_type: ConditionType::SlurmNodeHealthy,
                status: ConditionStatus::True,
                reason: String::new(),
                message: String::new(),
            },
        ],
        mirror: Mirror::None,
    };
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
