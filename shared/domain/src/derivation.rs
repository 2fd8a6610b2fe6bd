//! Operational and health status as pure functions of conditions
//! (`spec/conditions.md`, "Operational status: ordered rules" and "Health
//! status"). A priority-ordered classifier, never a transition engine.

use crate::catalogue::ConditionType as C;
use crate::vocab::{ChassisHealth, ConditionStatus, HealthStatus, OperationalStatus};

/// Reasons with a meaning to derivation.
pub mod reasons {
    pub const NOT_REPORTED: &str = "NotReported";
    pub const SOURCE_SILENT: &str = "SourceSilent";
    pub const SCHEDULER_UNREACHABLE: &str = "SchedulerUnreachable";
    pub const NO_LONGER_OBSERVED: &str = "NoLongerObserved";
    pub const HANDOVER_BREACH: &str = "HandoverBreach";
}

/// A condition as derivation reads it: stale rows already read as
/// `Unknown`/`SourceSilent`, absent rows as `Unknown` with no reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective<'a> {
    pub status: ConditionStatus,
    pub reason: &'a str,
}

impl Effective<'_> {
    pub const ABSENT: Effective<'static> = Effective {
        status: ConditionStatus::Unknown,
        reason: "",
    };

    /// Seed 002 / conditions.md: "*Lost from sight* means Unknown because
    /// SLURM could not be read (SchedulerUnreachable) or because the SLURM
    /// source went silent (SourceSilent)".
    fn lost_from_sight(&self) -> bool {
        self.status == ConditionStatus::Unknown
            && (self.reason == reasons::SCHEDULER_UNREACHABLE
                || self.reason == reasons::SOURCE_SILENT)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derivation {
    pub status: OperationalStatus,
    /// The types the matched rule names, in the rule's order.
    pub decisive: Vec<C>,
    /// The number of the matched row of the rules table (0 to 9).
    pub rule: u8,
}

fn d(status: OperationalStatus, rule: u8, decisive: Vec<C>) -> Derivation {
    Derivation {
        status,
        decisive,
        rule,
    }
}

/// The ordered rules; `get` returns the effective value of a type.
pub fn derive_operational<'a>(
    inventory_only: bool,
    get: impl Fn(C) -> Effective<'a>,
) -> Derivation {
    use ConditionStatus::{False, True};
    use OperationalStatus as S;
    if inventory_only {
        return d(S::Unknown, 0, vec![]);
    }
    let is = |t: C, s: ConditionStatus| get(t).status == s;
    if is(C::IronicProvisionHealthy, False) {
        return d(S::Failed, 1, vec![C::IronicProvisionHealthy]);
    }
    if is(C::IronicMaintenance, True) {
        return d(S::Quarantine, 2, vec![C::IronicMaintenance]);
    }
    if is(C::CustomerReady, True) && is(C::InstanceAllocated, True) {
        return d(S::InUse, 3, vec![C::CustomerReady, C::InstanceAllocated]);
    }
    if is(C::CustomerReady, True) && is(C::InstanceAllocated, False) && is(C::IronicAvailable, True)
    {
        return d(
            S::Available,
            4,
            vec![C::CustomerReady, C::InstanceAllocated, C::IronicAvailable],
        );
    }
    if is(C::InMaintenancePool, True) {
        let registered = get(C::SlurmRegistered);
        let healthy = get(C::SlurmNodeHealthy);
        let false_rows: Vec<C> = [
            (C::SlurmRegistered, &registered),
            (C::SlurmNodeHealthy, &healthy),
        ]
        .into_iter()
        .filter(|(_, e)| e.status == False)
        .map(|(t, _)| t)
        .collect();
        if !false_rows.is_empty() {
            let mut decisive = vec![C::InMaintenancePool];
            decisive.extend(false_rows);
            return d(S::Quarantine, 5, decisive);
        }
        let ok = |e: &Effective| e.status == True || e.lost_from_sight();
        if ok(&registered) && ok(&healthy) {
            return d(
                S::Validation,
                6,
                vec![
                    C::InMaintenancePool,
                    C::SlurmRegistered,
                    C::SlurmNodeHealthy,
                ],
            );
        }
        return d(S::Quarantine, 7, vec![C::InMaintenancePool]);
    }
    if is(C::CustomerReady, False) {
        return d(S::Quarantine, 8, vec![C::CustomerReady]);
    }
    d(S::Unknown, 9, vec![])
}

/// `health_status` from the `chassis_health` composite alone: absent or
/// stale reads `unknown`; inventory-only devices keep `unknown`.
pub fn derive_health(inventory_only: bool, composite: Option<ChassisHealth>) -> HealthStatus {
    if inventory_only {
        return HealthStatus::Unknown;
    }
    match composite {
        Some(ChassisHealth::Ok) => HealthStatus::Healthy,
        Some(ChassisHealth::Warning) => HealthStatus::Degraded,
        Some(ChassisHealth::Critical) => HealthStatus::Critical,
        None => HealthStatus::Unknown,
    }
}

/// Whether a derived status may be materialised: "While operational_status
/// is delegated, pending_handover or drained, or the device carries an
/// active impairment hold, the hub does not re-materialise".
pub fn is_frozen(current: OperationalStatus, impairment_hold: bool) -> bool {
    current.is_custody_hold() || impairment_hold
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::derivation::reasons::*;
    use std::collections::HashMap;
    use ConditionStatus::{False as F, True as T, Unknown as U};
    use OperationalStatus as S;

    fn derive(rows: &[(C, ConditionStatus, &'static str)]) -> Derivation {
        let map: HashMap<C, Effective<'static>> = rows
            .iter()
            .map(|(t, s, r)| {
                (
                    *t,
                    Effective {
                        status: *s,
                        reason: r,
                    },
                )
            })
            .collect();
        derive_operational(false, |t| map.get(&t).cloned().unwrap_or(Effective::ABSENT))
    }

    /// Each row: the sentence it checks, the conditions, the status and rule.
    #[test]
    fn ordered_rules_table() {
        let cases: Vec<(&str, Vec<(C, ConditionStatus, &'static str)>, S, u8)> = vec![
            ("rule 1: IronicProvisionHealthy = False -> failed", vec![(C::IronicProvisionHealthy, F, "DeployFailed"), (C::IronicMaintenance, T, "")], S::Failed, 1),
            ("rule 2: IronicMaintenance = True -> quarantine", vec![(C::IronicMaintenance, T, ""), (C::CustomerReady, T, ""), (C::InstanceAllocated, T, "")], S::Quarantine, 2),
            ("rule 3: CustomerReady and InstanceAllocated -> in_use", vec![(C::CustomerReady, T, ""), (C::InstanceAllocated, T, "")], S::InUse, 3),
            ("seed 002: 'The quarantine -> in_use edge ... the trait is authoritative proof of customer handover and outranks the maintenance-pool lessee'", vec![(C::InMaintenancePool, T, ""), (C::CustomerReady, T, ""), (C::InstanceAllocated, T, ""), (C::SlurmNodeHealthy, F, "Drain")], S::InUse, 3),
            ("rule 4: customer ready, unallocated, Ironic available -> available", vec![(C::CustomerReady, T, ""), (C::InstanceAllocated, F, ""), (C::IronicAvailable, T, "")], S::Available, 4),
            ("rule 4 needs InstanceAllocated = False, not Unknown", vec![(C::CustomerReady, T, ""), (C::IronicAvailable, T, "")], S::Unknown, 9),
            ("rule 5: maintenance pool and SlurmNodeHealthy = False -> quarantine", vec![(C::InMaintenancePool, T, ""), (C::SlurmRegistered, T, ""), (C::SlurmNodeHealthy, F, "Drain")], S::Quarantine, 5),
            ("rule 5: maintenance pool and SlurmRegistered = False -> quarantine", vec![(C::InMaintenancePool, T, ""), (C::SlurmRegistered, F, NO_LONGER_OBSERVED), (C::SlurmNodeHealthy, U, NO_LONGER_OBSERVED)], S::Quarantine, 5),
            ("rule 6: maintenance pool, SLURM healthy -> validation", vec![(C::InMaintenancePool, T, ""), (C::SlurmRegistered, T, ""), (C::SlurmNodeHealthy, T, "")], S::Validation, 6),
            ("seed 002 SLURM divergence: 'a scheduler outage does not move a validating fleet to quarantine; only an explicit False does'", vec![(C::InMaintenancePool, T, ""), (C::SlurmRegistered, U, SCHEDULER_UNREACHABLE), (C::SlurmNodeHealthy, U, SCHEDULER_UNREACHABLE)], S::Validation, 6),
            ("rule 6: SLURM source went silent is lost from sight", vec![(C::InMaintenancePool, T, ""), (C::SlurmRegistered, T, ""), (C::SlurmNodeHealthy, U, SOURCE_SILENT)], S::Validation, 6),
            ("'a device SLURM never reported stays in rule 7'", vec![(C::InMaintenancePool, T, "")], S::Quarantine, 7),
            ("NotReported is not lost from sight", vec![(C::InMaintenancePool, T, ""), (C::SlurmRegistered, U, NOT_REPORTED), (C::SlurmNodeHealthy, T, "")], S::Quarantine, 7),
            ("rule 8: CustomerReady = False -> quarantine", vec![(C::CustomerReady, F, "")], S::Quarantine, 8),
            ("rule 9: otherwise unknown", vec![], S::Unknown, 9),
            ("'A source outage elsewhere makes that source's conditions Unknown ... never failed or quarantine'", vec![(C::IronicProvisionHealthy, U, "IronicUnreachable"), (C::IronicMaintenance, U, "IronicUnreachable"), (C::CustomerReady, U, "IronicUnreachable"), (C::InstanceAllocated, U, "IronicUnreachable"), (C::IronicAvailable, U, "IronicUnreachable"), (C::InMaintenancePool, U, "IronicUnreachable")], S::Unknown, 9),
        ];
        for (sentence, rows, status, rule) in cases {
            let got = derive(&rows);
            assert_eq!((got.status, got.rule), (status, rule), "{sentence}");
        }
    }

    #[test]
    fn decisive_types_are_the_ones_the_rule_names() {
        // Each set is the conditions one rule reads: every one is decisive.
        for rows in [
            [
                (C::InMaintenancePool, T, ""),
                (C::SlurmRegistered, F, ""),
                (C::SlurmNodeHealthy, F, "Down"),
            ],
            [
                (C::CustomerReady, T, ""),
                (C::InstanceAllocated, F, ""),
                (C::IronicAvailable, T, ""),
            ],
        ] {
            let want: Vec<_> = rows.iter().map(|(ty, _, _)| *ty).collect();
            assert_eq!(derive(&rows).decisive, want);
        }
    }

    #[test]
    fn inventory_only_is_never_derived() {
        // seed 002: "Operational/health stay at their defaults (unknown/unknown) by design"
        let got = derive_operational(true, |_| Effective {
            status: F,
            reason: "",
        });
        assert_eq!((got.status, got.rule), (S::Unknown, 0));
        assert_eq!(
            derive_health(true, Some(ChassisHealth::Critical)),
            HealthStatus::Unknown
        );
    }

    #[test]
    fn health_follows_the_chassis_composite() {
        for (chassis, want) in [
            (Some(ChassisHealth::Ok), HealthStatus::Healthy),
            (Some(ChassisHealth::Warning), HealthStatus::Degraded),
            (Some(ChassisHealth::Critical), HealthStatus::Critical),
            (None, HealthStatus::Unknown),
        ] {
            assert_eq!(derive_health(false, chassis), want, "{chassis:?}");
        }
    }

    #[test]
    fn holds_freeze() {
        assert!(is_frozen(S::Delegated, false));
        assert!(is_frozen(S::PendingHandover, false));
        assert!(is_frozen(S::Drained, false));
        assert!(is_frozen(S::Available, true));
        assert!(!is_frozen(S::Quarantine, false));
    }
}
