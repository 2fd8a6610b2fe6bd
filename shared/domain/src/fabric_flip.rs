//! The fabric VRF flips (seed 002, "Front-end VRF custody latch contract"
//! and "Back-end VRF latch contract"): move a device's switch ports into a
//! target VRF through each switch's NVUE revisions, read them back, and
//! record the latch only for a verified, wholly real flip. Pure: the
//! workflow service reads the planned ports of every switch (and the state
//! of the revision it pinned on each), asks [`flip_next`], does it, reads
//! again. A worker killed anywhere resumes from a fresh read and what the
//! run pinned, so no switch is written twice for one change.
//!
//! One decision serves both planes ([`Plane`]); they differ in where the
//! in-progress `Unknown` goes: once per run before the first switch write
//! (front-end, reason `FlipInProgress`, an addition to the seed's reasons,
//! see `docs/consumers.md`) or before each switch with a port to move
//! (back-end, `ApplyInProgress`: "Each apply records Unknown after its
//! checks pass and just before it writes a switch with a port to move").

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::failure::FailureCode;

/// Which ports a flip moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// The front-end ports (`FrontendPortsInCustomerVrf`).
    Frontend,
    /// The RoCE back-end ports (`BackendPortsInMaintenanceVrf`).
    Backend,
}

/// Out of the customer's reach, or back into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Front-end: out of the customer VRF; back-end: into the maintenance
    /// VRF.
    Isolate,
    /// Front-end: into the device's customer VRF; back-end: into the
    /// tenant's back-end VRF.
    Return,
}

impl Plane {
    /// The code of a flip that did not apply or verify.
    pub fn flip_failed(self) -> FailureCode {
        match self {
            Plane::Frontend => FailureCode::SwitchVrfFlipFailed,
            Plane::Backend => FailureCode::BackendVrfFlipFailed,
        }
    }

    /// The reason of the `Unknown` written before a switch write.
    pub fn in_progress_reason(self) -> &'static str {
        match self {
            Plane::Frontend => "FlipInProgress",
            Plane::Backend => "ApplyInProgress",
        }
    }

    /// The reason a verified flip records (its status follows from it:
    /// `fleet_latch::Latch::reasons`). Front-end: the isolate writes False
    /// ("cleared by running the front-end VRF isolate, which writes
    /// False"), the return True; back-end: "isolate records True and return
    /// False".
    pub fn verified_reason(self, d: Direction) -> &'static str {
        match (self, d) {
            (Plane::Frontend, Direction::Isolate) => "IsolateFlipVerified",
            (Plane::Frontend, Direction::Return) => "CustomerVrfFlipVerified",
            (Plane::Backend, Direction::Isolate) => "IsolateVerified",
            (Plane::Backend, Direction::Return) => "ReturnVerified",
        }
    }

    /// The key of the in-progress `Unknown` a switch write needs: one per
    /// run (front-end) or one per switch (back-end).
    fn unknown_key(self, switch: &str) -> &str {
        match self {
            Plane::Frontend => RUN,
            Plane::Backend => switch,
        }
    }
}

/// The key of a run-wide `Unknown` in [`FlipPinned::unknown_written`].
const RUN: &str = "";

/// Whether the workflow writes a switch or only plans and reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchMode {
    Real,
    /// "A simulated run verified nothing": planned, read and reported,
    /// never written. The job's `simulate`, a switch the site lists in
    /// `simulated_switches`, or any back-end switch at a site without
    /// `backend_vrf_flip_allowed`.
    Simulated,
}

/// The state of an NVUE revision (`GET /nvue_v1/revision/<rev>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevState {
    /// Created, changes may be staged, not applied.
    Pending,
    /// Being applied (`apply`, `applying`, `ays`, `checking`, ...).
    Applying,
    Applied,
    /// The apply failed (`apply_fail`, `ays_fail`, `invalid`, ...).
    Failed(String),
    /// The switch does not know the revision (404).
    Gone,
}

impl RevState {
    /// NVUE's `state` of a revision.
    pub fn parse(state: &str) -> RevState {
        let s = state.trim().to_ascii_lowercase();
        match s.as_str() {
            "pending" => RevState::Pending,
            "applied" => RevState::Applied,
            _ if s.ends_with("fail") || s.ends_with("_failed") || s == "invalid" => {
                RevState::Failed(state.trim().to_string())
            }
            _ => RevState::Applying,
        }
    }
}

/// One switch as a step reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchRead {
    pub mode: SwitchMode,
    /// Each planned port and the VRF it reads back in, or why its VRF
    /// could not be resolved.
    pub ports: Vec<(String, Result<String, String>)>,
    /// The state of the revision the run pinned on this switch, when it
    /// pinned one.
    pub revision: Option<RevState>,
}

/// What a flip run pinned, committed with each step before the write that
/// follows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlipPinned {
    /// Switch -> the device's ports on it (from NetBox's cables), pinned
    /// once at the start; empty: not planned yet.
    pub plan: BTreeMap<String, Vec<String>>,
    /// The in-progress `Unknown`s written: `""` for the run (front-end) or
    /// a switch name (back-end).
    pub unknown_written: BTreeSet<String>,
    /// Switch -> the NVUE revision the run created on it.
    pub revisions: BTreeMap<String, String>,
    /// Switches whose revision holds the run's port changes.
    pub staged: BTreeSet<String>,
    /// Switches whose revision the run asked NVUE to apply.
    pub apply_requested: BTreeSet<String>,
    /// The verified latch is on record.
    pub latch_written: bool,
}

/// The next move of a flip run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlipNext {
    /// Record the latch `Unknown` (`Plane::in_progress_reason`) before a
    /// switch write: run-wide (`None`) or for `switch`.
    WriteUnknown {
        switch: Option<String>,
    },
    /// `POST /nvue_v1/revision` on the switch; pin the revision.
    CreateRevision {
        switch: String,
    },
    /// Stage the ports' target VRF in the pinned revision.
    Stage {
        switch: String,
        revision: String,
        ports: Vec<String>,
    },
    /// Apply the pinned revision.
    Apply {
        switch: String,
        revision: String,
    },
    /// A revision is being applied: read again later.
    Wait,
    /// Every switch is real and every port reads back in the target:
    /// record the verified latch.
    WriteVerified,
    Done,
    Fail(FailureCode, String),
}

fn fail(code: FailureCode, message: String) -> FlipNext {
    FlipNext::Fail(code, message)
}

/// The run's plan from the device's cabled ports `(switch, port)` on the
/// plane's switches (`FABRIC_PORT_MAP_MISSING` when there is none).
pub fn plan(
    device: &str,
    ports: &[(String, String)],
) -> Result<BTreeMap<String, Vec<String>>, (FailureCode, String)> {
    if ports.is_empty() {
        return Err((
            FailureCode::FabricPortMapMissing,
            format!("NetBox lists no cabled port of {device} on the plane's switches"),
        ));
    }
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (switch, port) in ports {
        let v = out.entry(switch.clone()).or_default();
        if !v.contains(port) {
            v.push(port.clone());
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    Ok(out)
}

/// The planned ports of a switch that do not read back in `target`.
fn off_target<'a>(r: &'a SwitchRead, target: &str) -> Vec<&'a str> {
    r.ports
        .iter()
        .filter(|(_, v)| v.as_deref() != Ok(target))
        .map(|(p, _)| p.as_str())
        .collect()
}

/// The next move of a flip of `plane` towards `target`, from this step's
/// read of every planned switch (`reads`, keyed by switch).
pub fn flip_next(
    plane: Plane,
    reads: &BTreeMap<String, SwitchRead>,
    pinned: &FlipPinned,
    target: &str,
) -> FlipNext {
    let failed = plane.flip_failed();
    if pinned.latch_written {
        return FlipNext::Done;
    }
    // Every planned port must resolve to one VRF: a port NetBox cables but
    // the switch does not list, or one in several VRFs, is not flipped.
    for (switch, r) in reads {
        for (port, vrf) in &r.ports {
            if let Err(e) = vrf {
                return fail(failed, format!("{switch}:{port}: {e}"));
            }
        }
    }
    // Revisions whose apply the run asked for: wait for them, and judge
    // the read-back once applied.
    for (switch, r) in reads {
        if !pinned.apply_requested.contains(switch) {
            continue;
        }
        let rev = pinned
            .revisions
            .get(switch)
            .map(String::as_str)
            .unwrap_or("?");
        match &r.revision {
            Some(RevState::Pending | RevState::Applying) => return FlipNext::Wait,
            Some(RevState::Applied) => {
                if let Some(port) = off_target(r, target).first() {
                    let vrf = r
                        .ports
                        .iter()
                        .find(|(p, _)| p == port)
                        .and_then(|(_, v)| v.as_ref().ok())
                        .map(String::as_str)
                        .unwrap_or("?");
                    return fail(
                        failed,
                        format!(
                            "revision {rev} is applied on {switch}, but {switch}:{port} reads back in {vrf}, not {target}"
                        ),
                    );
                }
            }
            Some(RevState::Failed(state)) => {
                return fail(failed, format!("revision {rev} on {switch}: {state}"))
            }
            Some(RevState::Gone) | None => {
                return fail(
                    failed,
                    format!("revision {rev} on {switch} vanished after its apply was asked for"),
                )
            }
        }
    }
    // The first real switch, in name order, with a port to move.
    let work = reads.iter().find(|(switch, r)| {
        r.mode == SwitchMode::Real
            && !pinned.apply_requested.contains(*switch)
            && !off_target(r, target).is_empty()
    });
    if let Some((switch, r)) = work {
        if !pinned.unknown_written.contains(plane.unknown_key(switch)) {
            return FlipNext::WriteUnknown {
                switch: (plane == Plane::Backend).then(|| switch.clone()),
            };
        }
        let revision = pinned.revisions.get(switch);
        return match (revision, &r.revision) {
            (None, _) | (Some(_), Some(RevState::Gone) | None) => FlipNext::CreateRevision {
                switch: switch.clone(),
            },
            (Some(rev), Some(RevState::Pending)) if !pinned.staged.contains(switch) => {
                FlipNext::Stage {
                    switch: switch.clone(),
                    revision: rev.clone(),
                    ports: off_target(r, target)
                        .into_iter()
                        .map(str::to_string)
                        .collect(),
                }
            }
            (Some(rev), Some(RevState::Pending)) => FlipNext::Apply {
                switch: switch.clone(),
                revision: rev.clone(),
            },
            // An apply the run sent but did not record (killed after the
            // request): the revision answers for it.
            (Some(_), Some(RevState::Applying)) => FlipNext::Wait,
            (Some(rev), Some(RevState::Applied)) => fail(
                failed,
                format!(
                    "revision {rev} is applied on {switch}, but its ports do not all read back in {target}"
                ),
            ),
            (Some(rev), Some(RevState::Failed(state))) => {
                fail(failed, format!("revision {rev} on {switch}: {state}"))
            }
        };
    }
    // Nothing left to write: every real switch reads back in the target.
    let real = reads.values().any(|r| r.mode == SwitchMode::Real);
    let simulated: Vec<&str> = reads
        .iter()
        .filter(|(_, r)| r.mode == SwitchMode::Simulated)
        .map(|(s, _)| s.as_str())
        .collect();
    match (real, simulated.is_empty()) {
        // "Both flip workflows write the latch only when every per-switch
        // result reports simulated=false."
        (true, true) => FlipNext::WriteVerified,
        // "A simulated run verified nothing": no write, no latch.
        (false, _) => FlipNext::Done,
        // Part real, part simulated: the run cannot vouch for the device's
        // ports, so the latch is left Unknown (fail closed).
        (true, false) if pinned.unknown_written.is_empty() => {
            FlipNext::WriteUnknown { switch: None }
        }
        (true, false) => fail(
            FailureCode::FabricFlipPartiallySimulated,
            format!(
                "switch(es) {} are simulated: the real ones were flipped, the latch stays Unknown",
                simulated.join(", ")
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use FlipNext as N;
    use SwitchMode::{Real, Simulated};

    const CUST: &str = "cust-0042";
    const ISOLATE: &str = "isolate";

    fn sw(mode: SwitchMode, ports: &[(&str, &str)], revision: Option<RevState>) -> SwitchRead {
        SwitchRead {
            mode,
            ports: ports
                .iter()
                .map(|(p, v)| (p.to_string(), Ok(v.to_string())))
                .collect(),
            revision,
        }
    }

    fn reads(r: Vec<(&str, SwitchRead)>) -> BTreeMap<String, SwitchRead> {
        r.into_iter().map(|(s, r)| (s.to_string(), r)).collect()
    }

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn revs(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    /// What a run pinned once it asked leaf01 to apply revision r1, after
    /// the device's one Unknown.
    fn apply_requested() -> FlipPinned {
        FlipPinned {
            unknown_written: set(&[""]),
            revisions: revs(&[("leaf01", "r1")]),
            staged: set(&["leaf01"]),
            apply_requested: set(&["leaf01"]),
            ..FlipPinned::default()
        }
    }

    fn code(n: FlipNext) -> Option<FailureCode> {
        match n {
            N::Fail(code, _) => Some(code),
            _ => None,
        }
    }

    #[test]
    fn the_plan_needs_a_cabled_port() {
        let ports = vec![
            ("leaf02".to_string(), "swp1".to_string()),
            ("leaf01".to_string(), "swp3".to_string()),
            ("leaf01".to_string(), "swp1".to_string()),
            ("leaf01".to_string(), "swp1".to_string()),
        ];
        let p = plan("gpu-1", &ports).unwrap();
        assert_eq!(p["leaf01"], vec!["swp1", "swp3"]);
        assert_eq!(p["leaf02"], vec!["swp1"]);
        assert_eq!(
            plan("gpu-1", &[]).unwrap_err().0,
            FailureCode::FabricPortMapMissing
        );
    }

    #[test]
    fn a_front_end_isolate_writes_unknown_once_then_each_switch_then_the_latch() {
        let p = FlipPinned::default();
        let two = || {
            reads(vec![
                ("leaf01", sw(Real, &[("swp1", CUST)], None)),
                ("leaf02", sw(Real, &[("swp1", CUST)], None)),
            ])
        };
        // The Unknown before the first switch write (FlipInProgress).
        assert_eq!(
            flip_next(Plane::Frontend, &two(), &p, ISOLATE),
            N::WriteUnknown { switch: None }
        );
        let p = FlipPinned {
            unknown_written: set(&[""]),
            ..p
        };
        assert_eq!(
            flip_next(Plane::Frontend, &two(), &p, ISOLATE),
            N::CreateRevision {
                switch: "leaf01".into()
            }
        );
        let mut r = two();
        r.get_mut("leaf01").unwrap().revision = Some(RevState::Pending);
        let p = FlipPinned {
            revisions: revs(&[("leaf01", "rev/1")]),
            ..p
        };
        assert_eq!(
            flip_next(Plane::Frontend, &r, &p, ISOLATE),
            N::Stage {
                switch: "leaf01".into(),
                revision: "rev/1".into(),
                ports: vec!["swp1".into()]
            }
        );
        let p = FlipPinned {
            staged: set(&["leaf01"]),
            ..p
        };
        assert_eq!(
            flip_next(Plane::Frontend, &r, &p, ISOLATE),
            N::Apply {
                switch: "leaf01".into(),
                revision: "rev/1".into()
            }
        );
        let p = FlipPinned {
            apply_requested: set(&["leaf01"]),
            ..p
        };
        r.get_mut("leaf01").unwrap().revision = Some(RevState::Applying);
        assert_eq!(flip_next(Plane::Frontend, &r, &p, ISOLATE), N::Wait);
        // Applied and read back: the second switch, no second Unknown.
        r.insert(
            "leaf01".into(),
            sw(Real, &[("swp1", ISOLATE)], Some(RevState::Applied)),
        );
        assert_eq!(
            flip_next(Plane::Frontend, &r, &p, ISOLATE),
            N::CreateRevision {
                switch: "leaf02".into()
            }
        );
        // Both read back: the latch.
        r.insert("leaf02".into(), sw(Real, &[("swp1", ISOLATE)], None));
        assert_eq!(
            flip_next(Plane::Frontend, &r, &p, ISOLATE),
            N::WriteVerified
        );
        let p = FlipPinned {
            latch_written: true,
            ..p
        };
        assert_eq!(flip_next(Plane::Frontend, &r, &p, ISOLATE), N::Done);
    }

    #[test]
    fn the_back_end_records_unknown_before_each_switch_with_a_port_to_move() {
        // "Each apply records Unknown after its checks pass and just before
        // it writes a switch with a port to move".
        let r = reads(vec![
            ("be01", sw(Real, &[("swp1", "maint")], None)),
            ("be02", sw(Real, &[("swp1", "tenant-be")], None)),
        ]);
        let p = FlipPinned::default();
        // be01 needs nothing: no Unknown for it.
        assert_eq!(
            flip_next(Plane::Backend, &r, &p, "maint"),
            N::WriteUnknown {
                switch: Some("be02".into())
            }
        );
        let p = FlipPinned {
            unknown_written: set(&["be02"]),
            ..p
        };
        assert_eq!(
            flip_next(Plane::Backend, &r, &p, "maint"),
            N::CreateRevision {
                switch: "be02".into()
            }
        );
        assert_eq!(Plane::Backend.in_progress_reason(), "ApplyInProgress");
        // "once every switch verified, isolate records True and return False"
        assert_eq!(
            Plane::Backend.verified_reason(Direction::Isolate),
            "IsolateVerified"
        );
        assert_eq!(
            Plane::Backend.verified_reason(Direction::Return),
            "ReturnVerified"
        );
    }

    #[test]
    fn the_latch_only_when_every_switch_is_real() {
        // "Both flip workflows write the latch only when every per-switch
        // result reports simulated=false."
        let p = FlipPinned::default();
        let pair = |leaf01: SwitchRead, leaf02: SwitchRead| {
            reads(vec![("leaf01", leaf01), ("leaf02", leaf02)])
        };
        let port = |mode, vrf| sw(mode, &[("swp1", vrf)], None);
        let cases = [
            (
                "every per-switch result reports simulated=false",
                pair(port(Real, CUST), port(Real, CUST)),
                N::WriteVerified,
            ),
            // "A simulated run verified nothing": no Unknown, no revision,
            // no latch, even with every port off target.
            (
                "all simulated",
                pair(port(Simulated, ISOLATE), port(Simulated, CUST)),
                N::Done,
            ),
            // Mixed: the real switch is flipped (Unknown first), and the
            // run fails closed with the latch left Unknown.
            (
                "mixed",
                pair(port(Real, ISOLATE), port(Simulated, ISOLATE)),
                N::WriteUnknown { switch: None },
            ),
            // Mixed with nothing to write on the real switch: Unknown all
            // the same, then the failure.
            (
                "mixed, nothing to write",
                pair(port(Real, CUST), port(Simulated, CUST)),
                N::WriteUnknown { switch: None },
            ),
        ];
        for (what, r, want) in cases {
            assert_eq!(flip_next(Plane::Frontend, &r, &p, CUST), want, "{what}");
        }
        let flipped = pair(
            sw(Real, &[("swp1", CUST)], Some(RevState::Applied)),
            port(Simulated, ISOLATE),
        );
        assert_eq!(
            code(flip_next(
                Plane::Frontend,
                &flipped,
                &apply_requested(),
                CUST
            )),
            Some(FailureCode::FabricFlipPartiallySimulated)
        );
    }

    #[test]
    fn a_re_run_no_ops_on_the_applied_switch_and_writes_the_latch() {
        // "the recovery is to re-run the same flip job, which no-ops on the
        // already-applied switch and writes the latch"; back-end: "Unknown
        // holds until a rerun records a definite value".
        for plane in [Plane::Frontend, Plane::Backend] {
            let r = reads(vec![(
                "sw1",
                sw(Real, &[("swp1", "t"), ("swp2", "t")], None),
            )]);
            assert_eq!(
                flip_next(plane, &r, &FlipPinned::default(), "t"),
                N::WriteVerified,
                "{plane:?}"
            );
        }
    }

    #[test]
    fn a_flip_that_does_not_apply_or_verify_fails() {
        let p = apply_requested();
        let with = |state: RevState, vrf: &str| {
            reads(vec![("leaf01", sw(Real, &[("swp1", vrf)], Some(state)))])
        };
        for (state, vrf, plane, want) in [
            (
                RevState::parse("apply_fail"),
                CUST,
                Plane::Frontend,
                FailureCode::SwitchVrfFlipFailed,
            ),
            (
                RevState::parse("invalid"),
                CUST,
                Plane::Backend,
                FailureCode::BackendVrfFlipFailed,
            ),
            // Applied, yet the port reads back elsewhere.
            (
                RevState::Applied,
                CUST,
                Plane::Frontend,
                FailureCode::SwitchVrfFlipFailed,
            ),
            (
                RevState::Gone,
                ISOLATE,
                Plane::Frontend,
                FailureCode::SwitchVrfFlipFailed,
            ),
        ] {
            assert_eq!(
                code(flip_next(plane, &with(state.clone(), vrf), &p, ISOLATE)),
                Some(want),
                "{state:?}"
            );
        }
        // A port the switch does not list, or whose VRF is ambiguous.
        let mut r = with(RevState::Pending, CUST);
        r.get_mut("leaf01").unwrap().ports[0].1 = Err("the switch lists no such interface".into());
        let m = flip_next(Plane::Frontend, &r, &FlipPinned::default(), ISOLATE);
        assert!(
            matches!(&m, N::Fail(FailureCode::SwitchVrfFlipFailed, message) if message.contains("leaf01:swp1")),
            "{m:?}"
        );
    }

    #[test]
    fn a_resumed_run_reads_before_it_writes_again() {
        // Killed after the apply was sent, before it was recorded: the
        // revision answers for it, nothing is applied twice.
        let p = FlipPinned {
            apply_requested: BTreeSet::new(),
            ..apply_requested()
        };
        let r = reads(vec![(
            "leaf01",
            sw(Real, &[("swp1", CUST)], Some(RevState::Applying)),
        )]);
        assert_eq!(flip_next(Plane::Frontend, &r, &p, ISOLATE), N::Wait);
        let r = reads(vec![(
            "leaf01",
            sw(Real, &[("swp1", ISOLATE)], Some(RevState::Applied)),
        )]);
        assert_eq!(
            flip_next(Plane::Frontend, &r, &p, ISOLATE),
            N::WriteVerified
        );
        // A pinned revision the switch lost before its apply: a new one.
        let r = reads(vec![(
            "leaf01",
            sw(Real, &[("swp1", CUST)], Some(RevState::Gone)),
        )]);
        assert_eq!(
            flip_next(Plane::Frontend, &r, &p, ISOLATE),
            N::CreateRevision {
                switch: "leaf01".into()
            }
        );
    }

    #[test]
    fn nvue_revision_states() {
        assert_eq!(RevState::parse("pending"), RevState::Pending);
        assert_eq!(RevState::parse("applied"), RevState::Applied);
        assert_eq!(RevState::parse("apply"), RevState::Applying);
        assert_eq!(RevState::parse("ays"), RevState::Applying);
        assert_eq!(
            RevState::parse("ays_fail"),
            RevState::Failed("ays_fail".into())
        );
        assert_eq!(
            RevState::parse("apply_fail"),
            RevState::Failed("apply_fail".into())
        );
    }
}
