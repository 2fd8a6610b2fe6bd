//! Acceptance gates ("site conditions", seed 002): what a burn-in stage
//! must pass, beyond its own job, before the standup pipeline advances a
//! device out of it. A site's (or pool's) policy names its gates; each is
//! evaluated per request from stored evidence, never stored:
//!
//! - `device`: the device's own hardware health (the health source's
//!   `health_status`) after its test;
//! - `rack`: a collective gate over the device's rack (its NVLink domain):
//!   every device of the rack whose sequence has the stage passed it;
//! - `pool`: the same over the device's pool (a pod).
//!
//! "Any configured gate that can't yet be evaluated (missing evidence /
//! topology) holds too": unknown health, a device without a rack or pool,
//! or a member that has not run the stage yet is `unevaluated`.

use crate::jobs::DeviceRunStatus;
use crate::standup::{Execution, GateOutcome, Stage};
use crate::vocab::{vocab, HealthStatus};

vocab!(
    /// What a gate looks at: the device itself, its rack (NVLink domain)
    /// or its pool (pod).
    GateScope, "acceptance gate scope" {
    Device => "device",
    Rack => "rack",
    Pool => "pool",
});

/// The `device` gate: "missing evidence" (health never read) holds.
pub fn device_gate(health: HealthStatus) -> GateOutcome {
    match health {
        HealthStatus::Healthy => GateOutcome::Passed,
        HealthStatus::Degraded | HealthStatus::Critical => GateOutcome::Failed,
        HealthStatus::Unknown => GateOutcome::Unevaluated,
    }
}

/// Where one member of a collective stands on the gated stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Members {
    /// Devices of the rack or pool whose sequence has the stage.
    pub total: usize,
    /// Of them, those whose placement-relevant execution of the stage
    /// succeeded...
    pub succeeded: usize,
    /// ...and those whose one failed.
    pub failed: usize,
}

impl Members {
    /// Counts one member from its newest placement-relevant execution of
    /// the stage (`None`: it has none).
    pub fn add(&mut self, newest: Option<Option<DeviceRunStatus>>) {
        self.total += 1;
        match newest {
            Some(Some(DeviceRunStatus::Succeeded)) => self.succeeded += 1,
            Some(Some(DeviceRunStatus::Failed)) => self.failed += 1,
            _ => {}
        }
    }
}

/// A `rack` or `pool` gate; `None` members: the device has no rack or pool
/// (missing topology).
pub fn collective_gate(members: Option<Members>) -> GateOutcome {
    match members {
        Some(m) if m.failed > 0 => GateOutcome::Failed,
        Some(m) if m.total > 0 && m.succeeded == m.total => GateOutcome::Passed,
        _ => GateOutcome::Unevaluated,
    }
}

/// The status of the newest placement-relevant execution of `stage` among
/// `executions` (`None` when there is none): what a member contributes.
pub fn newest_result(executions: &[Execution], stage: Stage) -> Option<Option<DeviceRunStatus>> {
    executions
        .iter()
        .filter(|e| Stage::of_workflow(e.workflow) == Some(stage) && e.placement_relevant())
        .max_by(|a, b| a.history_order().cmp(&b.history_order()))
        .map(|e| e.status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eligibility::Workflow;
    use crate::standup::tests::ex;
    use DeviceRunStatus as D;
    use GateOutcome::*;

    #[test]
    fn the_device_gate_reads_the_devices_health() {
        let cases = [
            ("a healthy device passes", HealthStatus::Healthy, Passed),
            (
                "degraded hardware fails the stage",
                HealthStatus::Degraded,
                Failed,
            ),
            (
                "critical hardware fails the stage",
                HealthStatus::Critical,
                Failed,
            ),
            (
                "'missing evidence ... holds too'",
                HealthStatus::Unknown,
                Unevaluated,
            ),
        ];
        for (sentence, health, want) in cases {
            assert_eq!(device_gate(health), want, "{sentence}");
        }
    }

    #[test]
    fn a_collective_gate_passes_only_when_every_member_passed() {
        let m = |total, succeeded, failed| {
            Some(Members {
                total,
                succeeded,
                failed,
            })
        };
        let cases = [
            (
                "'the device advances only once all of them pass'",
                m(4, 4, 0),
                Passed,
            ),
            ("one member failed: the gate fails", m(4, 3, 1), Failed),
            (
                "a member not yet run: 'can't yet be evaluated ... holds'",
                m(4, 3, 0),
                Unevaluated,
            ),
            (
                "'missing ... topology' (no rack or pool) holds",
                None,
                Unevaluated,
            ),
            (
                "an empty collective has no evidence",
                m(0, 0, 0),
                Unevaluated,
            ),
        ];
        for (sentence, members, want) in cases {
            assert_eq!(collective_gate(members), want, "{sentence}");
        }
    }

    #[test]
    fn a_member_counts_by_its_newest_placement_relevant_execution() {
        let snt = Workflow::SingleNodeTest;
        let mnt = Workflow::MultiNodeTest;
        let cases: Vec<(&str, Vec<Execution>, Option<Option<D>>)> = vec![
            (
                "no execution of the stage",
                vec![ex(1, snt, Some(D::Succeeded))],
                None,
            ),
            (
                "the newest decides",
                vec![ex(1, mnt, Some(D::Failed)), ex(2, mnt, Some(D::Succeeded))],
                Some(Some(D::Succeeded)),
            ),
            (
                "'cancelled, terminated, and superseded attempts are ignored for placement'",
                vec![
                    ex(1, mnt, Some(D::Succeeded)),
                    ex(2, mnt, Some(D::Cancelled)),
                ],
                Some(Some(D::Succeeded)),
            ),
            (
                "a pending run is neither a pass nor a failure",
                vec![ex(1, mnt, Some(D::Failed)), ex(2, mnt, None)],
                Some(None),
            ),
        ];
        for (sentence, executions, want) in cases {
            let got = newest_result(&executions, Stage::MultiNodeTest);
            assert_eq!(got, want, "{sentence}");
            let mut members = Members::default();
            members.add(got);
            assert_eq!(members.total, 1);
        }
    }
}
