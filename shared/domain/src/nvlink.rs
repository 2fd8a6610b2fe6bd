//! The NVLink repair-partition move and its return (seed 002, "NVLink
//! repair-partition latch contract"): put every GPU of a host into the
//! site's repair partition through NMX-M, or take them all out, and record
//! `NvLinkGpusInRepairPartition` once the membership reads back. Pure: the
//! workflow service reads the device's custody and NMX-M's membership (and
//! the operation it pinned), asks [`nv_next`], does it, reads again.
//!
//! NMX-M replaces a partition's whole member list on a PUT and a GPU is in
//! at most one partition, so a move first takes the host's GPUs out of any
//! other partition, then puts the repair partition's members plus the
//! host's; every PUT is planned from a read, checked against a fresh read
//! just before it is sent (the drift check), and waited on through its
//! operation.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::failure::FailureCode;
use crate::OperationalStatus;

/// Into the repair partition, or out of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvDirection {
    Move,
    Return,
}

impl NvDirection {
    /// The reason a verified run records: `MoveVerified` (True) or
    /// `ReturnVerified` (False).
    pub fn verified_reason(self) -> &'static str {
        match self {
            NvDirection::Move => "MoveVerified",
            NvDirection::Return => "ReturnVerified",
        }
    }
}

/// The reason of the `Unknown` written before the first NMX-M write.
pub const IN_PROGRESS_REASON: &str = "MoveInProgress";

/// Why the tray may not be moved: it is in customer custody (the seed's
/// "custody check", read here as the hub's custody holds that hand the
/// tray to a customer, and Borneo's `GOOGLE_OWNED`).
pub fn custody_refusal(status: OperationalStatus, custody: Option<&str>) -> Option<String> {
    use OperationalStatus as O;
    if matches!(status, O::Delegated | O::PendingHandover) {
        return Some(format!("the device is {status}"));
    }
    if custody.map(str::trim) == Some("GOOGLE_OWNED") {
        return Some("Borneo lists the device GOOGLE_OWNED".into());
    }
    None
}

/// NMX-M's membership as one step reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    /// GPU id -> the partition it is in (`None`: in none).
    pub partition_of: BTreeMap<String, Option<String>>,
    /// The host's GPUs (its compute node's `GpuIDList`); `None`: NMX-M
    /// lists no compute node of the host's name.
    pub host_gpus: Option<Vec<String>>,
    /// The repair partition's id; `None`: no partition has its name.
    pub repair_id: Option<String>,
}

impl Membership {
    fn members(&self, partition: &str) -> BTreeSet<String> {
        self.partition_of
            .iter()
            .filter(|(_, p)| p.as_deref() == Some(partition))
            .map(|(g, _)| g.clone())
            .collect()
    }
}

/// A pinned NMX-M operation's state (`GET /nmx/v1/operations/<id>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpState {
    Pending,
    Completed,
    Failed(String),
    /// NMX-M does not know the operation (404).
    Gone,
}

impl OpState {
    /// NMX-M's operation status.
    pub fn parse(status: &str) -> OpState {
        match status.trim().to_ascii_lowercase().as_str() {
            "completed" | "complete" | "succeeded" | "success" | "done" => OpState::Completed,
            s if s.contains("fail") || s == "error" || s == "aborted" || s == "cancelled" => {
                OpState::Failed(status.trim().to_string())
            }
            _ => OpState::Pending,
        }
    }
}

/// One partition update: the partition and its whole member list after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvPlan {
    pub partition: String,
    /// Sorted.
    pub members: Vec<String>,
}

/// An NMX-M operation the run started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvOperation {
    pub partition: String,
    pub id: String,
}

/// What an NVLink run pinned, committed with each step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NvPinned {
    /// The partition update the run planned and checks for drift.
    pub planned: Option<NvPlan>,
    /// Re-plans after drift (one is allowed).
    pub replans: u8,
    pub unknown_written: bool,
    pub operation: Option<NvOperation>,
    pub latch_written: bool,
}

/// The next move of an NVLink run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvNext {
    /// Pin the planned update (no write).
    Plan(NvPlan),
    /// The membership moved since planning: pin the new plan, counted.
    Replan(NvPlan),
    /// `Unknown` `MoveInProgress`, immediately before the first NMX-M
    /// write.
    WriteUnknown,
    /// `PUT /nmx/v1/partitions/<id>` with the planned members; pin the
    /// operation.
    Put(NvPlan),
    /// The pinned operation completed: unpin it and its plan, read again.
    OperationDone,
    Wait,
    WriteVerified,
    Done,
    Fail(FailureCode, String),
}

fn fail(code: FailureCode, message: String) -> NvNext {
    NvNext::Fail(code, message)
}

/// The next partition update towards the target, or `None` at it.
fn next_update(dir: NvDirection, m: &Membership, repair: &str, host: &[String]) -> Option<NvPlan> {
    let in_repair =
        |g: &String| m.partition_of.get(g).cloned().flatten().as_deref() == Some(repair);
    let sorted = |s: BTreeSet<String>| s.into_iter().collect::<Vec<_>>();
    match dir {
        NvDirection::Move => {
            if host.iter().all(in_repair) {
                return None;
            }
            // A GPU is in at most one partition: out of any other first.
            let elsewhere: BTreeSet<String> = host
                .iter()
                .filter_map(|g| m.partition_of.get(g).cloned().flatten())
                .filter(|p| p != repair)
                .collect();
            if let Some(p) = elsewhere.into_iter().next() {
                let mut members = m.members(&p);
                for g in host {
                    members.remove(g);
                }
                return Some(NvPlan {
                    partition: p,
                    members: sorted(members),
                });
            }
            let mut members = m.members(repair);
            members.extend(host.iter().cloned());
            Some(NvPlan {
                partition: repair.to_string(),
                members: sorted(members),
            })
        }
        NvDirection::Return => {
            if !host.iter().any(in_repair) {
                return None;
            }
            let mut members = m.members(repair);
            for g in host {
                members.remove(g);
            }
            Some(NvPlan {
                partition: repair.to_string(),
                members: sorted(members),
            })
        }
    }
}

/// The next move of an NVLink run for `host`. `custody`: the custody check
/// of this step (`custody_refusal`); `op`: the state of the pinned
/// operation; `simulated`: plan and report, write nothing.
pub fn nv_next(
    dir: NvDirection,
    host: &str,
    custody: Option<&str>,
    m: &Membership,
    op: Option<&OpState>,
    p: &NvPinned,
    simulated: bool,
) -> NvNext {
    use FailureCode as F;
    if p.latch_written {
        return NvNext::Done;
    }
    // Before planning and again before every write.
    if let Some(why) = custody {
        return fail(
            F::NvlinkCustodyRefused,
            format!("{host} is in customer custody: {why}"),
        );
    }
    let Some(repair) = m.repair_id.as_deref() else {
        return fail(
            F::SiteNotConfigured,
            "NMX-M lists no partition of the configured repair_partition name".into(),
        );
    };
    let host_gpus = match &m.host_gpus {
        None => {
            return fail(
                F::NvlinkMoveFailed,
                format!("NMX-M lists no compute node {host}"),
            )
        }
        Some(g) if g.is_empty() => {
            return fail(
                F::NvlinkMoveFailed,
                format!("NMX-M lists no GPU of compute node {host}"),
            )
        }
        Some(g) => g,
    };
    let unlisted: Vec<&str> = host_gpus
        .iter()
        .filter(|g| !m.partition_of.contains_key(*g))
        .map(String::as_str)
        .collect();
    if !unlisted.is_empty() {
        return fail(
            F::NvlinkMoveFailed,
            format!(
                "NMX-M's GPU list misses GPU(s) {} of {host}",
                unlisted.join(", ")
            ),
        );
    }
    if let Some(o) = &p.operation {
        return match op {
            Some(OpState::Completed) => NvNext::OperationDone,
            Some(OpState::Pending) => NvNext::Wait,
            Some(OpState::Failed(s)) => fail(
                F::NvlinkMoveFailed,
                format!("NMX-M operation {} on partition {}: {s}", o.id, o.partition),
            ),
            Some(OpState::Gone) | None => fail(
                F::NvlinkMoveFailed,
                format!("NMX-M no longer knows operation {}", o.id),
            ),
        };
    }
    let Some(next) = next_update(dir, m, repair, host_gpus) else {
        // At the target: "re-run the same move, which converges from live
        // membership and records the latch". "Simulated runs write
        // nothing."
        return if simulated {
            NvNext::Done
        } else {
            NvNext::WriteVerified
        };
    };
    if simulated {
        return NvNext::Done;
    }
    match &p.planned {
        None => NvNext::Plan(next),
        // The final drift check: what the run planned must still be what a
        // fresh read plans.
        Some(planned) if *planned != next => {
            if p.replans >= 1 {
                fail(
                    F::NvlinkDrift,
                    format!(
                        "partition {}'s membership moved again after a re-plan",
                        planned.partition
                    ),
                )
            } else {
                NvNext::Replan(next)
            }
        }
        Some(_) if !p.unknown_written => NvNext::WriteUnknown,
        Some(planned) => NvNext::Put(planned.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NvNext as N;

    fn gpus(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// `h1` has g1, g2; `h2` has g3. Partition 7 is repair, 1 the default.
    fn m(g1: Option<&str>, g2: Option<&str>, g3: Option<&str>) -> Membership {
        let p = |x: Option<&str>| x.map(str::to_string);
        Membership {
            partition_of: [("g1", p(g1)), ("g2", p(g2)), ("g3", p(g3))]
                .into_iter()
                .map(|(g, x)| (g.to_string(), x))
                .collect(),
            host_gpus: Some(gpus(&["g1", "g2"])),
            repair_id: Some("7".into()),
        }
    }

    fn plan(partition: &str, members: &[&str]) -> NvPlan {
        NvPlan {
            partition: partition.into(),
            members: gpus(members),
        }
    }

    fn mv(mm: &Membership, p: &NvPinned) -> NvNext {
        nv_next(NvDirection::Move, "h1", None, mm, None, p, false)
    }

    #[test]
    fn the_unknown_comes_after_custody_planning_and_the_drift_check() {
        // "The Unknown write is inside the real move activity after its
        // second custody check, planning, and final drift check,
        // immediately before the first NMX-M write".
        let mm = m(None, None, Some("7"));
        let p = NvPinned::default();
        let want = plan("7", &["g1", "g2", "g3"]);
        assert_eq!(mv(&mm, &p), N::Plan(want.clone()));
        let p = NvPinned {
            planned: Some(want.clone()),
            ..p
        };
        assert_eq!(mv(&mm, &p), N::WriteUnknown);
        let p = NvPinned {
            unknown_written: true,
            ..p
        };
        assert_eq!(mv(&mm, &p), N::Put(want.clone()));
        // "so a pre-write refusal cannot leave a false latch": a custody
        // refusal at the second check writes nothing, not even the Unknown.
        let planned = NvPinned {
            planned: Some(want),
            ..NvPinned::default()
        };
        let refused = nv_next(
            NvDirection::Move,
            "h1",
            Some("the device is delegated"),
            &mm,
            None,
            &planned,
            false,
        );
        assert!(
            matches!(refused, N::Fail(FailureCode::NvlinkCustodyRefused, _)),
            "{refused:?}"
        );
    }

    #[test]
    fn drift_re_plans_once_then_fails_before_any_write() {
        let planned = NvPinned {
            planned: Some(plan("7", &["g1", "g2"])),
            ..NvPinned::default()
        };
        // Another host's GPU joined the repair partition since planning.
        let moved = m(None, None, Some("7"));
        assert_eq!(
            mv(&moved, &planned),
            N::Replan(plan("7", &["g1", "g2", "g3"]))
        );
        let again = NvPinned {
            replans: 1,
            ..planned
        };
        let n = mv(&moved, &again);
        assert!(matches!(n, N::Fail(FailureCode::NvlinkDrift, _)), "{n:?}");
    }

    #[test]
    fn a_move_takes_the_gpus_out_of_another_partition_first() {
        // "A GPU is in at most one partition".
        let mm = m(Some("1"), Some("7"), Some("1"));
        assert_eq!(mv(&mm, &NvPinned::default()), N::Plan(plan("1", &["g3"])));
        let mm = m(None, Some("7"), Some("1"));
        assert_eq!(
            mv(&mm, &NvPinned::default()),
            N::Plan(plan("7", &["g1", "g2"]))
        );
    }

    #[test]
    fn operations_are_waited_on_and_judged() {
        let p = NvPinned {
            planned: Some(plan("7", &["g1", "g2"])),
            unknown_written: true,
            operation: Some(NvOperation {
                partition: "7".into(),
                id: "op-1".into(),
            }),
            ..NvPinned::default()
        };
        let mm = m(None, None, None);
        let at = |s: OpState| nv_next(NvDirection::Move, "h1", None, &mm, Some(&s), &p, false);
        assert_eq!(at(OpState::parse("running")), N::Wait);
        assert_eq!(at(OpState::parse("Completed")), N::OperationDone);
        assert!(matches!(
            at(OpState::parse("failed")),
            N::Fail(FailureCode::NvlinkMoveFailed, _)
        ));
        assert!(matches!(
            at(OpState::Gone),
            N::Fail(FailureCode::NvlinkMoveFailed, _)
        ));
    }

    #[test]
    fn a_re_run_converges_from_live_membership_and_records_the_latch() {
        // "re-run the same move, which converges from live membership and
        // records the latch".
        let in_repair = m(Some("7"), Some("7"), None);
        assert_eq!(mv(&in_repair, &NvPinned::default()), N::WriteVerified);
        // "until a verified return clears it".
        let out = m(None, Some("1"), Some("7"));
        assert_eq!(
            nv_next(
                NvDirection::Return,
                "h1",
                None,
                &out,
                None,
                &NvPinned::default(),
                false
            ),
            N::WriteVerified
        );
        assert_eq!(
            nv_next(
                NvDirection::Return,
                "h1",
                None,
                &in_repair,
                None,
                &NvPinned::default(),
                false
            ),
            N::Plan(plan("7", &[]))
        );
        let done = NvPinned {
            latch_written: true,
            ..NvPinned::default()
        };
        assert_eq!(mv(&in_repair, &done), N::Done);
    }

    #[test]
    fn simulated_runs_write_nothing() {
        // "Simulated runs write nothing."
        for mm in [m(None, None, None), m(Some("7"), Some("7"), None)] {
            assert_eq!(
                nv_next(
                    NvDirection::Move,
                    "h1",
                    None,
                    &mm,
                    None,
                    &NvPinned::default(),
                    true
                ),
                N::Done
            );
        }
    }

    #[test]
    fn what_nmx_m_must_list() {
        let mut mm = m(None, None, None);
        mm.repair_id = None;
        assert!(matches!(
            mv(&mm, &NvPinned::default()),
            N::Fail(FailureCode::SiteNotConfigured, _)
        ));
        let mut mm = m(None, None, None);
        mm.host_gpus = None;
        assert!(matches!(
            mv(&mm, &NvPinned::default()),
            N::Fail(FailureCode::NvlinkMoveFailed, _)
        ));
        let mut mm = m(None, None, None);
        mm.partition_of.remove("g2");
        let n = mv(&mm, &NvPinned::default());
        assert!(
            matches!(&n, N::Fail(FailureCode::NvlinkMoveFailed, message) if message.contains("g2")),
            "{n:?}"
        );
    }

    #[test]
    fn custody_that_refuses_a_move() {
        use OperationalStatus as O;
        assert!(custody_refusal(O::Delegated, None).is_some());
        assert!(custody_refusal(O::PendingHandover, None).is_some());
        assert!(custody_refusal(O::Quarantine, Some("GOOGLE_OWNED")).is_some());
        assert!(custody_refusal(O::Quarantine, Some("PARTNER_OWNED")).is_none());
        assert!(custody_refusal(O::Drained, None).is_none());
        assert_eq!(NvDirection::Move.verified_reason(), "MoveVerified");
        assert_eq!(NvDirection::Return.verified_reason(), "ReturnVerified");
    }
}
