//! The standup pipeline (seed 002, "Standup pipeline (derived UI view)"):
//! where a device stands in the Operational Racks matrix, derived per
//! request from its `operational_status` and its job history, never stored.
//! Pure: a reader gives the device's class, its policy, its executions and
//! the evaluations of its acceptance gates, and gets the cell.

use chrono::{DateTime, Utc};

use crate::eligibility::Workflow;
use crate::jobs::DeviceRunStatus;
use crate::vocab::{vocab, DeviceClass, OperationalStatus};

vocab!(
    /// The matrix's columns: "the real stage a device is at or awaiting,
    /// not the last it completed".
    Stage, "standup stage" {
    Enrolment => "enrolment",
    Quarantine => "quarantine",
    SingleNodeTest => "single_node_test",
    MultiNodeTest => "multi_node_test",
    Release => "release",
});

vocab!(
    /// A cell's status. `not_started` is a status, never a column.
    CellStatus, "standup cell status" {
    NotStarted => "not_started",
    Pending => "pending",
    Running => "running",
    Succeeded => "succeeded",
    Failed => "failed",
});

vocab!(
    /// Why a cell offers no action. Read-path decisions only: the jobs API
    /// stays authoritative for eligibility when a job is submitted.
    /// `concurrent_workflow_running`: a workflow of the device is pending
    /// or running; `no_next_stage`: the device is at its terminal stage;
    /// `acceptance_gate_failed`: a configured acceptance gate of the stage
    /// did not pass; `acceptance_gate_unevaluated`: one cannot be evaluated
    /// yet (missing evidence or topology).
    Suppression, "action suppression reason" {
    ConcurrentWorkflowRunning => "concurrent_workflow_running",
    NoNextStage => "no_next_stage",
    AcceptanceGateFailed => "acceptance_gate_failed",
    AcceptanceGateUnevaluated => "acceptance_gate_unevaluated",
});

vocab!(
    /// One acceptance gate's evaluation ("site conditions").
    GateOutcome, "acceptance gate outcome" {
    Passed => "passed",
    Failed => "failed",
    Unevaluated => "unevaluated",
});

impl Stage {
    /// The workflow a job runs for this stage.
    pub const fn workflow(self) -> Workflow {
        match self {
            Stage::Enrolment => Workflow::Enrollment,
            Stage::Quarantine => Workflow::MoveToTestCluster,
            Stage::SingleNodeTest => Workflow::SingleNodeTest,
            Stage::MultiNodeTest => Workflow::MultiNodeTest,
            Stage::Release => Workflow::Release,
        }
    }

    /// The stage a workflow's executions place; `None` for the workflows
    /// outside the pipeline (imaging, VRF moves, ...).
    pub fn of_workflow(w: Workflow) -> Option<Stage> {
        Stage::ALL.iter().copied().find(|s| s.workflow() == w)
    }

    /// "Advancement out of single_node_test / multi_node_test is held ...
    /// until its burn-in acceptance gate passes."
    pub const fn gated(self) -> bool {
        matches!(self, Stage::SingleNodeTest | Stage::MultiNodeTest)
    }
}

const FULL: &[Stage] = &[
    Stage::Enrolment,
    Stage::Quarantine,
    Stage::SingleNodeTest,
    Stage::MultiNodeTest,
    Stage::Release,
];
const WITH_SINGLE_NODE: &[Stage] = &[
    Stage::Enrolment,
    Stage::Quarantine,
    Stage::SingleNodeTest,
    Stage::Release,
];
const BASE: &[Stage] = &[Stage::Enrolment, Stage::Quarantine, Stage::Release];
const HYPERVISOR: &[Stage] = &[Stage::Enrolment];

/// The effective sequence of a device; `None` for a switch ("Switches have
/// no pipeline"). `acceptance_policy`: its site or pool has an acceptance
/// policy. The seed names GPU compute only "policy-backed"; GPU compute
/// without a policy is given the CPU bare-metal base chain, so it still
/// goes through quarantine.
pub fn sequence(class: DeviceClass, acceptance_policy: bool) -> Option<&'static [Stage]> {
    Some(match (class, acceptance_policy) {
        (DeviceClass::Switch, _) => return None,
        (DeviceClass::CpuHypervisor, _) => HYPERVISOR,
        (DeviceClass::GpuCompute, true) => FULL,
        (DeviceClass::CpuBaremetal, true) => WITH_SINGLE_NODE,
        (DeviceClass::GpuCompute | DeviceClass::CpuBaremetal, false) => BASE,
    })
}

/// One execution of a workflow on the device (a `JobDeviceStatus` row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    pub job_id: String,
    pub workflow: Workflow,
    /// `None`: the job has not started the device yet (pending).
    pub status: Option<DeviceRunStatus>,
    /// When the job was created: the order of executions.
    pub created_at: DateTime<Utc>,
}

impl Execution {
    /// "cancelled, terminated, and superseded attempts are ignored for
    /// placement but kept in Job history."
    pub(crate) fn placement_relevant(&self) -> bool {
        !matches!(
            self.status,
            Some(
                DeviceRunStatus::Cancelled
                    | DeviceRunStatus::Terminated
                    | DeviceRunStatus::Superseded
            )
        )
    }

    /// The order of a device's executions: by creation, then job id.
    pub(crate) fn history_order(&self) -> (DateTime<Utc>, &str) {
        (self.created_at, &self.job_id)
    }

    fn active(&self) -> bool {
        matches!(self.status, None | Some(DeviceRunStatus::Running))
    }

    fn cell_status(&self) -> CellStatus {
        match self.status {
            None => CellStatus::Pending,
            Some(DeviceRunStatus::Running) => CellStatus::Running,
            Some(DeviceRunStatus::Succeeded) => CellStatus::Succeeded,
            // Interrupted executions never reach here (placement_relevant).
            Some(_) => CellStatus::Failed,
        }
    }
}

/// A configured acceptance gate of a stage and its evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    pub stage: Stage,
    /// The gate's name in the policy (`nvlink_domain`, `pod`, ...).
    pub name: String,
    pub outcome: GateOutcome,
}

/// What the cell of a device is derived from.
#[derive(Debug, Clone, Copy)]
pub struct Device<'a> {
    pub class: DeviceClass,
    pub acceptance_policy: bool,
    pub operational_status: OperationalStatus,
    /// Every execution of the device, in any order.
    pub executions: &'a [Execution],
    /// Every configured gate of the device's policy.
    pub gates: &'a [Gate],
}

/// The device's cell of the matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    pub stage: Stage,
    pub status: CellStatus,
    /// The workflows an operator can submit from this cell.
    pub available_actions: Vec<Workflow>,
    /// At least one when `available_actions` is empty.
    pub action_suppression_reasons: Vec<Suppression>,
    /// Drill-through: the newest execution of any stage of the sequence,
    /// interrupted ones included.
    pub latest_in_sequence_workflow: Option<Execution>,
    /// The execution whose result placed the cell (a failed cell's failure
    /// detail); `None` when no execution did.
    pub placed_by: Option<Execution>,
}

/// The cell of one device; `None` for a switch (it has no sequence).
pub fn place(d: &Device<'_>) -> Option<Cell> {
    let seq = sequence(d.class, d.acceptance_policy)?;
    let &terminal = seq.last()?;
    let mut in_sequence: Vec<&Execution> = d
        .executions
        .iter()
        .filter(|e| Stage::of_workflow(e.workflow).is_some_and(|s| seq.contains(&s)))
        .collect();
    in_sequence.sort_by(|a, b| a.history_order().cmp(&b.history_order()));
    let latest = in_sequence.last().map(|e| (*e).clone());
    let newest_relevant = |stage: Option<Stage>| {
        in_sequence
            .iter()
            .rev()
            .find(|e| {
                e.placement_relevant()
                    && stage.is_none_or(|s| Stage::of_workflow(e.workflow) == Some(s))
            })
            .copied()
    };
    let any_active = in_sequence.iter().any(|e| e.active());

    // "Placement precedence: current customer handover state is the first
    // decision." Gate holds and the prefix clamp are skipped.
    if matches!(
        d.operational_status,
        OperationalStatus::Available | OperationalStatus::InUse
    ) {
        let mut reasons = Vec::new();
        if newest_relevant(None).is_some_and(|e| e.active()) {
            reasons.push(Suppression::ConcurrentWorkflowRunning);
        }
        reasons.push(Suppression::NoNextStage);
        return Some(Cell {
            stage: terminal,
            status: CellStatus::Succeeded,
            available_actions: Vec::new(),
            action_suppression_reasons: reasons,
            latest_in_sequence_workflow: latest,
            placed_by: None,
        });
    }

    // Job history, advance on success, gate holds, the prefix clamp: the
    // first stage of the sequence not cleared owns the cell.
    for (i, &stage) in seq.iter().enumerate() {
        let placed = newest_relevant(Some(stage));
        let status = placed.map_or(CellStatus::NotStarted, Execution::cell_status);
        let mut reasons = Vec::new();
        if status == CellStatus::Succeeded {
            let holds: Vec<Suppression> = if stage.gated() {
                gate_holds(d.gates, stage)
            } else {
                Vec::new()
            };
            let last = i + 1 == seq.len();
            if holds.is_empty() && !last {
                continue;
            }
            reasons = holds;
            if last {
                reasons.push(Suppression::NoNextStage);
            }
        }
        let mut actions = Vec::new();
        if any_active {
            reasons.insert(0, Suppression::ConcurrentWorkflowRunning);
        } else if matches!(status, CellStatus::NotStarted | CellStatus::Failed) {
            actions.push(stage.workflow());
        }
        return Some(Cell {
            stage,
            status,
            available_actions: actions,
            action_suppression_reasons: reasons,
            latest_in_sequence_workflow: latest,
            placed_by: placed.cloned(),
        });
    }
    // The terminal stage always returns above.
    None
}

/// What holds a succeeded gated stage: "multi_node_test composes across
/// every configured multi-node collective gate ... the device advances
/// only once all of them pass. Any configured gate that can't yet be
/// evaluated ... holds too."
fn gate_holds(gates: &[Gate], stage: Stage) -> Vec<Suppression> {
    let mut out = Vec::new();
    for g in gates.iter().filter(|g| g.stage == stage) {
        let r = match g.outcome {
            GateOutcome::Passed => continue,
            GateOutcome::Failed => Suppression::AcceptanceGateFailed,
            GateOutcome::Unevaluated => Suppression::AcceptanceGateUnevaluated,
        };
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::TimeZone;
    use CellStatus::{Failed as F, NotStarted as N, Pending as P, Running as R, Succeeded as S};
    use DeviceClass::*;
    use DeviceRunStatus as D;
    use Stage::*;

    /// Job `n`'s execution of `w`, created `n` minutes into the test.
    pub(crate) fn ex(n: i64, w: Workflow, status: Option<D>) -> Execution {
        Execution {
            job_id: format!("job-{n}"),
            workflow: w,
            status,
            created_at: Utc.timestamp_opt(1_700_000_000 + n * 60, 0).unwrap(),
        }
    }
    const EN: Workflow = Workflow::Enrollment;
    const MTC: Workflow = Workflow::MoveToTestCluster;
    const SNT: Workflow = Workflow::SingleNodeTest;
    const MNT: Workflow = Workflow::MultiNodeTest;
    const REL: Workflow = Workflow::Release;

    fn gate(stage: Stage, name: &str, outcome: GateOutcome) -> Gate {
        Gate {
            stage,
            name: name.into(),
            outcome,
        }
    }

    fn cell(
        class: DeviceClass,
        policy: bool,
        op: OperationalStatus,
        executions: &[Execution],
        gates: &[Gate],
    ) -> Option<Cell> {
        place(&Device {
            class,
            acceptance_policy: policy,
            operational_status: op,
            executions,
            gates,
        })
    }

    /// The cell of a quarantined device whose policy configures no gate.
    fn quarantined(class: DeviceClass, policy: bool, executions: &[Execution]) -> Cell {
        cell(
            class,
            policy,
            OperationalStatus::Quarantine,
            executions,
            &[],
        )
        .unwrap()
    }

    #[test]
    fn effective_sequence_per_device_class() {
        let cases: Vec<(&str, DeviceClass, bool, Option<&[Stage]>)> = vec![
            ("'Policy-backed GPU compute uses the full chain.'", GpuCompute, true, Some(FULL)),
            ("'CPU bare-metal always includes quarantine ... even without an acceptance policy — enrolment → quarantine → release'", CpuBaremetal, false, Some(BASE)),
            ("'a policy adds single-node acceptance'", CpuBaremetal, true, Some(WITH_SINGLE_NODE)),
            ("'CPU hypervisors terminate at enrolment.'", CpuHypervisor, true, Some(HYPERVISOR)),
            ("'Switches have no pipeline: they are excluded from device cells'", Switch, true, None),
        ];
        for (sentence, class, policy, want) in cases {
            assert_eq!(sequence(class, policy), want, "{sentence}");
        }
    }

    /// Each row: the seed sentence it checks, the device, and the cell's
    /// stage, status, actions and suppression reasons.
    #[test]
    fn placement_table() {
        use OperationalStatus::{Available, InUse, Quarantine as Q, Unknown as U};
        use Suppression::*;
        let pass = |s| gate(s, "nvlink_domain", GateOutcome::Passed);
        type Case = (
            &'static str,
            DeviceClass,
            OperationalStatus,
            Vec<Execution>,
            Vec<Gate>,
            (Stage, CellStatus, Vec<Workflow>, Vec<Suppression>),
        );
        let cases: Vec<Case> = vec![
            ("'A fresh device is column=enrolment, status=not_started'",
             GpuCompute, U, vec![], vec![],
             (Enrolment, N, vec![EN], vec![])),
            ("'a completed enrolment appears under quarantine' as not_started",
             GpuCompute, U, vec![ex(1, EN, Some(D::Succeeded))], vec![],
             (Quarantine, N, vec![MTC], vec![])),
            ("a running stage is running and offers nothing: 'An in-flight cell never offers actions'",
             GpuCompute, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Running))], vec![],
             (Quarantine, R, vec![], vec![ConcurrentWorkflowRunning])),
            ("a job that has not started the device is pending",
             GpuCompute, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, None)], vec![],
             (Quarantine, P, vec![], vec![ConcurrentWorkflowRunning])),
            ("'failed is a genuine negative placement result': the stage can be run again",
             GpuCompute, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Failed))], vec![],
             (Quarantine, F, vec![MTC], vec![])),
            ("'Interrupted executions (cancelled / terminated / superseded) never own the cell status'",
             GpuCompute, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Failed)), ex(3, MTC, Some(D::Cancelled))], vec![],
             (Quarantine, F, vec![MTC], vec![])),
            ("'An interruption is not a success. If the stage has no earlier successful result, it remains incomplete.'",
             GpuCompute, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Terminated))], vec![],
             (Quarantine, N, vec![MTC], vec![])),
            ("'If it does have an earlier success, the interruption does not revoke it.'",
             GpuCompute, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Succeeded)), ex(3, MTC, Some(D::Superseded))], vec![],
             (SingleNodeTest, N, vec![SNT], vec![])),
            ("'Advancement out of single_node_test ... is held — the device stays succeeded in that column — until its burn-in acceptance gate passes'",
             GpuCompute, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Succeeded)), ex(3, SNT, Some(D::Succeeded))], vec![gate(SingleNodeTest, "node_burn_in", GateOutcome::Failed)],
             (SingleNodeTest, S, vec![], vec![AcceptanceGateFailed])),
            ("the gate passes: the device advances to multi_node_test, not_started",
             GpuCompute, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Succeeded)), ex(3, SNT, Some(D::Succeeded))], vec![pass(SingleNodeTest)],
             (MultiNodeTest, N, vec![MNT], vec![])),
            ("'multi_node_test composes across every configured multi-node collective gate ... the device advances only once all of them pass'",
             GpuCompute, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Succeeded)), ex(3, SNT, Some(D::Succeeded)), ex(4, MNT, Some(D::Succeeded))],
             vec![pass(MultiNodeTest), gate(MultiNodeTest, "pod", GateOutcome::Failed)],
             (MultiNodeTest, S, vec![], vec![AcceptanceGateFailed])),
            ("'Any configured gate that can’t yet be evaluated (missing evidence / topology) holds too.'",
             GpuCompute, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Succeeded)), ex(3, SNT, Some(D::Succeeded)), ex(4, MNT, Some(D::Succeeded))],
             vec![pass(MultiNodeTest), gate(MultiNodeTest, "pod", GateOutcome::Unevaluated)],
             (MultiNodeTest, S, vec![], vec![AcceptanceGateUnevaluated])),
            ("every gate passes: on to release",
             GpuCompute, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Succeeded)), ex(3, SNT, Some(D::Succeeded)), ex(4, MNT, Some(D::Succeeded))],
             vec![pass(MultiNodeTest), gate(MultiNodeTest, "pod", GateOutcome::Passed)],
             (Release, N, vec![REL], vec![])),
            ("'The prefix clamp then prevents the cell from appearing beyond the first incomplete stage': a newer failed enrolment owns the column",
             GpuCompute, U, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Succeeded)), ex(3, EN, Some(D::Failed))], vec![],
             (Enrolment, F, vec![EN], vec![])),
            ("'a clamped cell whose own stage Job is still pending or running also reports concurrent_workflow_running — including when the newest placement-relevant workflow is a later stage that already reached a terminal state'",
             GpuCompute, U, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Succeeded)), ex(3, EN, Some(D::Running)), ex(4, SNT, Some(D::Failed))], vec![],
             (Enrolment, R, vec![], vec![ConcurrentWorkflowRunning])),
            ("'If operational_status is available or in_use, the device is placed at its effective terminal stage with status=succeeded (release for customer hosts'",
             GpuCompute, Available, vec![], vec![],
             (Release, S, vec![], vec![NoNextStage])),
            ("'... enrolment for hypervisors)'",
             CpuHypervisor, InUse, vec![], vec![],
             (Enrolment, S, vec![], vec![NoNextStage])),
            ("'newer failed, pending, or running Jobs ... do not move the cell'; 'The override skips both gate holds and the prefix clamp.'",
             GpuCompute, InUse, vec![ex(1, EN, Some(D::Failed)), ex(2, SNT, Some(D::Succeeded))], vec![gate(SingleNodeTest, "node_burn_in", GateOutcome::Failed)],
             (Release, S, vec![], vec![NoNextStage])),
            ("'A customer-ready terminal cell whose newest placement-relevant workflow is still pending or running reports both concurrent_workflow_running and no_next_stage'",
             GpuCompute, Available, vec![ex(1, MTC, Some(D::Running))], vec![],
             (Release, S, vec![], vec![ConcurrentWorkflowRunning, NoNextStage])),
            ("'a policy adds single-node acceptance': CPU bare-metal after quarantine",
             CpuBaremetal, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Succeeded))], vec![],
             (SingleNodeTest, N, vec![SNT], vec![])),
            ("CPU bare-metal has no multi-node stage: single-node acceptance leads to release",
             CpuBaremetal, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Succeeded)), ex(3, SNT, Some(D::Succeeded))], vec![],
             (Release, N, vec![REL], vec![])),
            ("a hypervisor's enrolment is its terminal stage",
             CpuHypervisor, U, vec![ex(1, EN, Some(D::Succeeded))], vec![],
             (Enrolment, S, vec![], vec![NoNextStage])),
            ("a released device not yet customer-ready stays succeeded at release",
             GpuCompute, Q, vec![ex(1, EN, Some(D::Succeeded)), ex(2, MTC, Some(D::Succeeded)), ex(3, SNT, Some(D::Succeeded)), ex(4, MNT, Some(D::Succeeded)), ex(5, REL, Some(D::Succeeded))], vec![],
             (Release, S, vec![], vec![NoNextStage])),
            ("a workflow outside the pipeline (imaging) never places the device",
             GpuCompute, U, vec![ex(1, EN, Some(D::Succeeded)), ex(2, Workflow::ImageNode, Some(D::Running))], vec![],
             (Quarantine, N, vec![MTC], vec![])),
        ];
        for (sentence, class, op, executions, gates, want) in cases {
            let c = cell(class, true, op, &executions, &gates).unwrap();
            let got = (
                c.stage,
                c.status,
                c.available_actions.clone(),
                c.action_suppression_reasons.clone(),
            );
            assert_eq!(got, want, "{sentence}");
            assert!(
                !c.available_actions.is_empty() || !c.action_suppression_reasons.is_empty(),
                "'every cell with an empty available_actions list carries at least one typed action_suppression_reasons value': {sentence}"
            );
        }
    }

    #[test]
    fn drill_through_names_the_latest_job_and_the_placing_execution() {
        // "Drill-through (latest_in_sequence_workflow / job ids) still names
        // the overall latest observed Job; a clamped failed cell’s failure
        // detail follows the uncleared stage’s placement-relevant execution."
        let executions = vec![
            ex(1, EN, Some(D::Succeeded)),
            ex(2, MTC, Some(D::Failed)),
            ex(3, SNT, Some(D::Cancelled)),
        ];
        let c = quarantined(GpuCompute, true, &executions);
        assert_eq!((c.stage, c.status), (Quarantine, F));
        assert_eq!(c.latest_in_sequence_workflow.unwrap().job_id, "job-3");
        assert_eq!(c.placed_by.unwrap().job_id, "job-2");

        // "newer failed, pending, or running Jobs remain available through
        // drill-through context but do not move the cell."
        let executions = vec![ex(1, REL, Some(D::Succeeded)), ex(2, MTC, None)];
        let c = cell(GpuCompute, true, OperationalStatus::InUse, &executions, &[]).unwrap();
        assert_eq!((c.stage, c.status), (Release, S));
        assert_eq!(c.latest_in_sequence_workflow.unwrap().job_id, "job-2");
        assert_eq!(c.placed_by, None);
    }

    #[test]
    fn without_a_policy_quarantine_leads_to_release() {
        // "CPU bare-metal always includes quarantine ... even without an
        // acceptance policy — enrolment → quarantine → release".
        let executions = vec![
            ex(1, EN, Some(D::Succeeded)),
            ex(2, MTC, Some(D::Succeeded)),
        ];
        for class in [CpuBaremetal, GpuCompute] {
            let c = quarantined(class, false, &executions);
            assert_eq!(
                (c.stage, c.status, c.available_actions),
                (Release, N, vec![REL]),
                "{class}"
            );
        }
    }

    #[test]
    fn a_switch_has_no_cell() {
        let executions = vec![ex(1, EN, Some(D::Succeeded))];
        assert_eq!(
            cell(Switch, true, OperationalStatus::Available, &executions, &[]),
            None
        );
    }

    #[test]
    fn the_order_executions_are_given_in_does_not_matter() {
        let mut executions = vec![
            ex(1, EN, Some(D::Succeeded)),
            ex(2, MTC, Some(D::Succeeded)),
            ex(3, SNT, Some(D::Failed)),
            ex(4, SNT, Some(D::Superseded)),
        ];
        let want = quarantined(GpuCompute, true, &executions);
        executions.reverse();
        assert_eq!(quarantined(GpuCompute, true, &executions), want);
        executions.swap(0, 2);
        assert_eq!(quarantined(GpuCompute, true, &executions), want);
    }
}
