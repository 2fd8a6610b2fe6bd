//! Latch drift: a device whose durable fabric latch disagrees with what the
//! live fabric shows (`connectors.md`, the live-fabric observation
//! conditions). Counted and listed, never repaired: the hub does not
//! rewrite a latch from an observation.
//!
//! Readers treat a latch by its effect: `True` and `Unknown` refuse
//! (the ports or GPUs may be there), `False` and absence permit. A device
//! drifts when that effect disagrees with a definite, fresh observation:
//!
//! | live observation | latch `False` or absent | latch `True` or `Unknown` |
//! |---|---|---|
//! | `True` | `unguarded`: the fabric shows it, nothing refuses | agree |
//! | `False` | agree | `stale_guard`: a refusal the fabric no longer backs |
//! | `Unknown`, stale or absent | no verdict | no verdict |

use chrono::{DateTime, Utc};

use crate::catalogue::ConditionType;
use crate::state::{DeviceState, Ttls};
use crate::vocab::ConditionStatus;

/// A durable latch and the live observation of the same thing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    pub latch: ConditionType,
    pub observed: ConditionType,
}

pub const PAIRS: [Pair; 3] = [
    Pair {
        latch: ConditionType::FrontendPortsInCustomerVrf,
        observed: ConditionType::FrontendPortsObservedInCustomerVrf,
    },
    Pair {
        latch: ConditionType::BackendPortsInMaintenanceVrf,
        observed: ConditionType::BackendPortsObservedInMaintenanceVrf,
    },
    Pair {
        latch: ConditionType::NvLinkGpusInRepairPartition,
        observed: ConditionType::NvLinkGpusObservedInRepairPartition,
    },
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Drift {
    /// The fabric shows the device in, and the latch permits.
    Unguarded,
    /// The fabric shows the device out, and the latch still refuses.
    StaleGuard,
}

impl Drift {
    pub const ALL: [Drift; 2] = [Drift::Unguarded, Drift::StaleGuard];

    pub fn as_str(self) -> &'static str {
        match self {
            Drift::Unguarded => "unguarded",
            Drift::StaleGuard => "stale_guard",
        }
    }

    pub fn parse(s: &str) -> Option<Drift> {
        Drift::ALL.into_iter().find(|d| d.as_str() == s)
    }
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `latch` is the durable row's status (`None`: no row); `observed` the
/// live row as derivation reads it (stale reads `Unknown`; `None`: no row).
pub fn drift(latch: Option<ConditionStatus>, observed: Option<ConditionStatus>) -> Option<Drift> {
    let refuses = matches!(
        latch,
        Some(ConditionStatus::True) | Some(ConditionStatus::Unknown)
    );
    match observed? {
        ConditionStatus::True if !refuses => Some(Drift::Unguarded),
        ConditionStatus::False if refuses => Some(Drift::StaleGuard),
        _ => None,
    }
}

/// The same over `device_conditions o` (the fresh observed row, joined)
/// and `device_conditions l` (the latch row, left-joined): `'unguarded'`,
/// `'stale_guard'` or NULL. The caller keeps only fresh observed rows.
pub const DRIFT_SQL: &str = "(CASE \
    WHEN o.status = 'True' AND COALESCE(l.status, 'False') = 'False' THEN 'unguarded' \
    WHEN o.status = 'False' AND l.status IN ('True', 'Unknown') THEN 'stale_guard' \
    END)";

/// A device's drifting latches, as derivation reads its rows now.
pub fn device_drift(state: &DeviceState, now: DateTime<Utc>, ttls: &Ttls) -> Vec<(Pair, Drift)> {
    PAIRS
        .iter()
        .filter_map(|p| {
            let latch = state.conditions.get(&p.latch).map(|r| r.status);
            let observed = state
                .conditions
                .get(&p.observed)
                .map(|_| state.effective(p.observed, now, ttls).status);
            drift(latch, observed).map(|d| (*p, d))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ConditionRow, DeviceRecord};
    use crate::vocab::{ConditionOf, Source};
    use ConditionStatus::{False as F, True as T, Unknown as U};

    #[test]
    fn the_table() {
        let cases: [(
            Option<ConditionStatus>,
            Option<ConditionStatus>,
            Option<Drift>,
        ); 16] = [
            (None, Some(T), Some(Drift::Unguarded)),
            (Some(F), Some(T), Some(Drift::Unguarded)),
            (Some(T), Some(T), None),
            (Some(U), Some(T), None),
            (None, Some(F), None),
            (Some(F), Some(F), None),
            (Some(T), Some(F), Some(Drift::StaleGuard)),
            (Some(U), Some(F), Some(Drift::StaleGuard)),
            (None, Some(U), None),
            (Some(F), Some(U), None),
            (Some(T), Some(U), None),
            (Some(U), Some(U), None),
            (None, None, None),
            (Some(F), None, None),
            (Some(T), None, None),
            (Some(U), None, None),
        ];
        for (latch, observed, want) in cases {
            assert_eq!(drift(latch, observed), want, "{latch:?} {observed:?}");
        }
    }

    #[test]
    fn pairs_are_a_durable_latch_and_its_observation_of_one_owner() {
        for p in PAIRS {
            assert!(p.latch.is_durable(), "{}", p.latch);
            assert!(!p.observed.is_durable(), "{}", p.observed);
            assert!(p
                .observed
                .entry()
                .owners
                .iter()
                .all(|o| p.latch.entry().owners.contains(o)));
        }
        assert_eq!(Drift::parse("stale_guard"), Some(Drift::StaleGuard));
        assert_eq!(Drift::parse("x"), None);
    }

    fn row(
        t: ConditionType,
        status: ConditionStatus,
        source: Source,
        at: DateTime<Utc>,
    ) -> ConditionRow {
        ConditionRow {
            condition_type: t,
            status,
            reason: String::new(),
            message: String::new(),
            source,
            condition_of: ConditionOf::None,
            durable: t.is_durable(),
            observed_at: at,
            received_at: at,
            decisive: false,
            last_transition_at: at,
        }
    }

    #[test]
    fn a_stale_observation_gives_no_verdict() {
        let now = Utc::now();
        let ttls = Ttls::uniform(chrono::Duration::seconds(180));
        let mut s = DeviceState::new(DeviceRecord::new("d1".into(), "s1".into(), "gpu01".into()));
        let add = |s: &mut DeviceState, r: ConditionRow| {
            s.conditions.insert(r.condition_type, r);
        };
        add(
            &mut s,
            row(
                ConditionType::FrontendPortsObservedInCustomerVrf,
                T,
                Source::FrontendFabric,
                now,
            ),
        );
        add(
            &mut s,
            row(
                ConditionType::NvLinkGpusInRepairPartition,
                T,
                Source::NvlinkFabric,
                now,
            ),
        );
        add(
            &mut s,
            row(
                ConditionType::NvLinkGpusObservedInRepairPartition,
                F,
                Source::NvlinkFabric,
                now,
            ),
        );
        add(
            &mut s,
            row(
                ConditionType::BackendPortsInMaintenanceVrf,
                F,
                Source::BackendFabric,
                now,
            ),
        );
        add(
            &mut s,
            row(
                ConditionType::BackendPortsObservedInMaintenanceVrf,
                T,
                Source::BackendFabric,
                now - chrono::Duration::seconds(600),
            ),
        );
        let got: Vec<(ConditionType, Drift)> = device_drift(&s, now, &ttls)
            .into_iter()
            .map(|(p, d)| (p.latch, d))
            .collect();
        assert_eq!(
            got,
            vec![
                (ConditionType::FrontendPortsInCustomerVrf, Drift::Unguarded),
                (
                    ConditionType::NvLinkGpusInRepairPartition,
                    Drift::StaleGuard
                ),
            ]
        );
    }
}
