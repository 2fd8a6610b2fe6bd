//! Eligibility at job creation (seed 002, "Eligibility gate", the latch
//! contracts, "Inventory-only flag", Image admission): one pass over every
//! policy of a workflow for one device, every refusal typed. Pure: the
//! workflow service reads the device and its conditions, and asks this.

use crate::catalogue::ConditionType;
use crate::vocab::{vocab, ConditionStatus, OperationalStatus};

vocab!(
    /// The workflows of seed 002 a job runs, one per device.
    Workflow, "workflow" {
    Enrollment => "enrollment",
    MoveToTestCluster => "move_to_test_cluster",
    SingleNodeTest => "single_node_test",
    MultiNodeTest => "multi_node_test",
    ImageNode => "image_node",
    UnimageNode => "unimage_node",
    Release => "release",
    FrontendVrfIsolate => "frontend_vrf_isolate",
    FrontendVrfReturn => "frontend_vrf_return",
    NvlinkRepairMove => "nvlink_repair_move",
    NvlinkRepairReturn => "nvlink_repair_return",
    BackendVrfIsolate => "backend_vrf_isolate",
    BackendVrfReturn => "backend_vrf_return",
});

vocab!(
    /// Why a device may not join a job. `concurrent_workflow_running`: one
    /// workflow per device at a time, the device is in a job that is not
    /// over; `backend_not_run`: the workflow's arm for the device's site is
    /// not run by this build (Image and Unimage Node run the Ironic-direct
    /// arm only).
    Refusal, "eligibility refusal" {
    DeviceInventoryOnly => "DEVICE_INVENTORY_ONLY",
    EnrollmentProofMissing => "enrollment_proof_missing",
    ConditionDisqualifierAsserted => "condition_disqualifier_asserted",
    ConditionDisqualifierUnproven => "condition_disqualifier_unproven",
    RequiredConditionNotTrue => "required_condition_not_true",
    OperationalStatusNotAllowed => "operational_status_not_allowed",
    IronicMaintenanceNotFalse => "ironic_maintenance_not_false",
    IronicFailureState => "ironic_failure_state",
    ConcurrentWorkflowRunning => "concurrent_workflow_running",
    BackendNotRun => "backend_not_run",
});

/// A refusal and what it is about (the condition type, the status or the
/// Ironic state that failed the gate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub refusal: Refusal,
    pub detail: String,
}

/// What a workflow's policy asks of a device (`EligibilityPolicy`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    /// ADR-0038: `enrollment_validated_ref` non-empty and equal to
    /// `infrastructure_ref`.
    pub require_enrollment_proof: bool,
    /// Each must read `True`.
    pub required_condition_types: Vec<ConditionType>,
    /// "True and Unknown refuse, False and absence admit."
    pub disqualifying_condition_types: Vec<ConditionType>,
    /// Custody-hold statuses the workflow runs on besides the reclaim ones
    /// (`delegated`, `pending_handover`); the front-end VRF return admits
    /// `drained`.
    pub allowlist: Vec<OperationalStatus>,
    /// Image admission: authoritative `maintenance = false` and no Ironic
    /// failure state.
    pub ironic_shape: bool,
}

/// The statuses a custody reclaim runs on: exempt from the proof, condition
/// and Ironic-shape gates ("exactly as they are for the condition and
/// Ironic-shape gates").
pub const CUSTODY_RECLAIM: [OperationalStatus; 2] = [
    OperationalStatus::Delegated,
    OperationalStatus::PendingHandover,
];

impl Workflow {
    /// The workflow's policy, as seed 002 sets it.
    pub fn policy(self) -> Policy {
        use ConditionType as C;
        match self {
            // "ENROLLMENT declares this type in
            // EligibilityPolicy.disqualifying_condition_types"; "Enrollment
            // itself never requires proof (it produces it)".
            Workflow::Enrollment => Policy {
                disqualifying_condition_types: vec![C::FrontendPortsInCustomerVrf],
                ..Policy::default()
            },
            // "The flag is set on Move to Test Cluster (Quarantine)".
            Workflow::MoveToTestCluster => Policy {
                require_enrollment_proof: true,
                ..Policy::default()
            },
            // "Image admission requires authoritative maintenance=false and
            // rejects every Ironic failure state"; "Image Node stay[s]
            // proof-exempt".
            Workflow::ImageNode => Policy {
                ironic_shape: true,
                ..Policy::default()
            },
            // "drained is in that workflow's eligibility allowlist".
            Workflow::FrontendVrfReturn => Policy {
                allowlist: vec![OperationalStatus::Drained],
                ..Policy::default()
            },
            // Release's latches are read by its hand-back activities and by
            // the release_to_customer_pool gate, not at admission; "burn-in
            // and Image Node stay proof-exempt".
            Workflow::SingleNodeTest
            | Workflow::MultiNodeTest
            | Workflow::UnimageNode
            | Workflow::Release
            | Workflow::FrontendVrfIsolate
            | Workflow::NvlinkRepairMove
            | Workflow::NvlinkRepairReturn
            | Workflow::BackendVrfIsolate
            | Workflow::BackendVrfReturn => Policy::default(),
        }
    }
}

impl Workflow {
    /// The policy of a job with these options: Release's
    /// `release_to_customer_pool` adds the partition latches (back-end:
    /// "Admission refuses through the release_to_customer_pool gate";
    /// NVLink is read "exactly as" back-end). The front-end latch is not
    /// gated there: the seed records it "as unreachable rather than gated".
    pub fn policy_with(self, options: Options) -> Policy {
        let mut policy = self.policy();
        if self == Workflow::Release && options.release_to_customer_pool {
            policy.disqualifying_condition_types.extend([
                ConditionType::NvLinkGpusInRepairPartition,
                ConditionType::BackendPortsInMaintenanceVrf,
            ]);
        }
        policy
    }

    /// Whether the workflow's arm at a site with Nova and Placement
    /// (`placement_enabled`) differs from its Ironic-direct arm: imaging
    /// and un-imaging go through Nova there, and Move to Test Cluster's
    /// adopt is a Nova server (seed 002, "The backend is chosen from the
    /// site's current capability"). Enrolment is Ironic's at every site and
    /// Release's hand-back writes Placement's traits where it has them.
    pub fn has_nova_arm(self) -> bool {
        matches!(
            self,
            Workflow::ImageNode | Workflow::UnimageNode | Workflow::MoveToTestCluster
        )
    }
}

/// The facts of one device the gates read.
#[derive(Debug, Clone)]
pub struct DeviceFacts<'a> {
    pub inventory_only: bool,
    pub operational_status: OperationalStatus,
    pub infrastructure_ref: Option<&'a str>,
    pub enrollment_validated_ref: Option<&'a str>,
    /// Ironic's maintenance flag as last mirrored; `None` when not known.
    pub ironic_maintenance: Option<bool>,
    pub ironic_provision_state: Option<&'a str>,
}

/// A job's options: what it was asked to do besides its workflow. Each
/// belongs to one workflow (or, `simulate`, to the fabric flips); naming
/// it on another is refused ([`Options::check`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Options {
    /// Move to Test Cluster's `cordon_only`: "removes the customer-ready
    /// trait without adopting, so it stays runnable on an unproven
    /// customer node".
    pub cordon_only: bool,
    /// Move to Test Cluster's `force_reclaim`: a node bound to a customer
    /// instance is reclaimed instead of refused.
    pub force_reclaim: bool,
    /// Release's `release_to_customer_pool`.
    pub release_to_customer_pool: bool,
    /// A fabric flip that plans and reads back every switch and writes
    /// nothing: its per-switch results say `simulated`, and no latch is
    /// ever written for it.
    pub simulate: bool,
    /// Enrolment's `run_inspection` (absent: `true`); `false` is a
    /// diagnostic run, which proves nothing.
    pub run_inspection: Option<bool>,
    /// Release's `engagement_mode`, injected by the caller.
    pub engagement_mode: Option<crate::release::EngagementMode>,
}

impl Options {
    /// Refuses an option `workflow` does not take, by name.
    pub fn check(&self, workflow: Workflow) -> Result<(), String> {
        use Workflow as W;
        let fabric = matches!(
            workflow,
            W::FrontendVrfIsolate
                | W::FrontendVrfReturn
                | W::NvlinkRepairMove
                | W::NvlinkRepairReturn
                | W::BackendVrfIsolate
                | W::BackendVrfReturn
        );
        let taken = [
            (
                "cordon_only",
                self.cordon_only,
                workflow == W::MoveToTestCluster,
            ),
            (
                "force_reclaim",
                self.force_reclaim,
                workflow == W::MoveToTestCluster,
            ),
            (
                "release_to_customer_pool",
                self.release_to_customer_pool,
                workflow == W::Release,
            ),
            ("simulate", self.simulate, fabric),
            (
                "run_inspection",
                self.run_inspection.is_some(),
                workflow == W::Enrollment,
            ),
            (
                "engagement_mode",
                self.engagement_mode.is_some(),
                workflow == W::Release,
            ),
        ];
        match taken.iter().find(|(_, set, takes)| *set && !*takes) {
            Some((name, _, _)) => Err(format!("{workflow} does not take {name}")),
            None => Ok(()),
        }
    }
}

/// Seed 002: "refuses a device unless enrollment_validated_ref is non-empty
/// and equal to infrastructure_ref — a pure comparison of the two
/// references". Used again inside every customer-facing activity.
pub fn has_enrollment_proof(facts: &DeviceFacts<'_>) -> bool {
    match (facts.enrollment_validated_ref, facts.infrastructure_ref) {
        (Some(v), Some(r)) => !v.is_empty() && v == r,
        _ => false,
    }
}

/// The proof a mutation re-reads immediately before its write, bound to the
/// node it resolved: "the mutation refuses if the Ironic node it resolved
/// does not carry the proven infrastructure_ref UUID"; "failing
/// non-retryably with ENROLLMENT_PROOF_MISSING when proof is absent".
pub fn proof_verdict(
    infrastructure_ref: Option<&str>,
    enrollment_validated_ref: Option<&str>,
    resolved_node: &str,
) -> Result<(), (crate::failure::FailureCode, String)> {
    use crate::failure::FailureCode as F;
    match (enrollment_validated_ref, infrastructure_ref) {
        (Some(v), Some(r)) if !v.is_empty() && v == r => {
            if r == resolved_node {
                Ok(())
            } else {
                Err((
                    F::EnrollmentProofMissing,
                    format!("the resolved node {resolved_node} is not the proven identity {r}"),
                ))
            }
        }
        _ => Err((
            F::EnrollmentProofMissing,
            "the device has no enrollment proof for its infrastructure_ref".into(),
        )),
    }
}

/// Every refusal of `workflow`'s policy for one device, in one pass (empty:
/// eligible). `condition` reads the device's condition of a type, `None`
/// when it has no row.
pub fn check(
    workflow: Workflow,
    options: Options,
    facts: &DeviceFacts<'_>,
    condition: impl Fn(ConditionType) -> Option<ConditionStatus>,
) -> Vec<Refused> {
    let mut out = Vec::new();
    let mut refuse = |refusal: Refusal, detail: String| out.push(Refused { refusal, detail });
    // "Always ineligible for workflows (eligibility DEVICE_INVENTORY_ONLY)".
    if facts.inventory_only {
        refuse(Refusal::DeviceInventoryOnly, "inventory-only device".into());
        return out;
    }
    let policy = workflow.policy_with(options);
    let reclaim = CUSTODY_RECLAIM.contains(&facts.operational_status);
    // A custody hold other than the reclaim statuses (`drained`) admits
    // only the workflows that allowlist it: seed 002 names `drained` in the
    // front-end VRF return's allowlist, which is why that return can run
    // before the hand-back.
    if facts.operational_status.is_custody_hold()
        && !reclaim
        && !policy.allowlist.contains(&facts.operational_status)
    {
        refuse(
            Refusal::OperationalStatusNotAllowed,
            facts.operational_status.as_str().into(),
        );
    }
    if reclaim {
        return out;
    }
    let proof_exempt = workflow == Workflow::MoveToTestCluster && options.cordon_only;
    if policy.require_enrollment_proof && !proof_exempt && !has_enrollment_proof(facts) {
        let detail = match (facts.enrollment_validated_ref, facts.infrastructure_ref) {
            (None, _) | (Some(""), _) => "no enrollment proof".to_string(),
            (Some(v), r) => format!(
                "enrollment proof is for {v}, the device's infrastructure_ref is {}",
                r.unwrap_or("empty")
            ),
        };
        refuse(Refusal::EnrollmentProofMissing, detail);
    }
    for t in &policy.disqualifying_condition_types {
        match condition(*t) {
            Some(ConditionStatus::True) => {
                refuse(Refusal::ConditionDisqualifierAsserted, t.as_str().into())
            }
            Some(ConditionStatus::Unknown) => {
                refuse(Refusal::ConditionDisqualifierUnproven, t.as_str().into())
            }
            Some(ConditionStatus::False) | None => {}
        }
    }
    for t in &policy.required_condition_types {
        if condition(*t) != Some(ConditionStatus::True) {
            refuse(Refusal::RequiredConditionNotTrue, t.as_str().into());
        }
    }
    if policy.ironic_shape {
        if facts.ironic_maintenance != Some(false) {
            let detail = match facts.ironic_maintenance {
                Some(true) => "Ironic maintenance is on",
                _ => "Ironic maintenance is not known",
            };
            refuse(Refusal::IronicMaintenanceNotFalse, detail.into());
        }
        if let Some(state) = facts
            .ironic_provision_state
            .filter(|s| crate::ironic::is_failure(s))
        {
            refuse(Refusal::IronicFailureState, state.into());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_option_another_workflow_takes_is_refused_by_name() {
        let force = Options {
            force_reclaim: true,
            ..Options::default()
        };
        assert!(force.check(Workflow::MoveToTestCluster).is_ok());
        let e = force.check(Workflow::ImageNode).unwrap_err();
        assert!(
            e.contains("image_node") && e.contains("force_reclaim"),
            "{e}"
        );
        let simulate = Options {
            simulate: true,
            ..Options::default()
        };
        assert!(simulate.check(Workflow::FrontendVrfReturn).is_ok());
        assert!(simulate.check(Workflow::Release).is_err());
        assert!(Options::default().check(Workflow::Release).is_ok());
    }
    use ConditionStatus as S;
    use ConditionType as C;
    use OperationalStatus as O;

    fn facts() -> DeviceFacts<'static> {
        DeviceFacts {
            inventory_only: false,
            operational_status: O::Quarantine,
            infrastructure_ref: Some("node-1"),
            enrollment_validated_ref: Some("node-1"),
            ironic_maintenance: Some(false),
            ironic_provision_state: Some("available"),
        }
    }

    fn refusals(
        w: Workflow,
        o: Options,
        f: &DeviceFacts<'_>,
        c: &[(C, S)],
    ) -> Vec<(Refusal, String)> {
        check(w, o, f, |t| {
            c.iter().find(|(x, _)| *x == t).map(|(_, s)| *s)
        })
        .into_iter()
        .map(|r| (r.refusal, r.detail))
        .collect()
    }

    #[test]
    fn inventory_only_is_always_ineligible() {
        // "Always ineligible for workflows (eligibility DEVICE_INVENTORY_ONLY)"
        let f = DeviceFacts {
            inventory_only: true,
            ..facts()
        };
        for w in Workflow::ALL {
            let got = refusals(*w, Options::default(), &f, &[]);
            assert_eq!(got.len(), 1, "{w}");
            assert_eq!(got[0].0, Refusal::DeviceInventoryOnly);
        }
    }

    #[test]
    fn the_enrollment_proof_gate_fails_closed() {
        let w = Workflow::MoveToTestCluster;
        let none = Options::default();
        let cases: &[(&str, Option<&str>, Option<&str>, bool)] = &[
            (
                "equal references admit",
                Some("node-1"),
                Some("node-1"),
                true,
            ),
            (
                "'an empty validated ref (new device, ...) ... block[s]'",
                None,
                Some("node-1"),
                false,
            ),
            ("an empty string is empty", Some(""), Some("node-1"), false),
            (
                "'a mismatched ref ... block[s]'",
                Some("node-0"),
                Some("node-1"),
                false,
            ),
            (
                "no infrastructure_ref: nothing to compare",
                Some("node-1"),
                None,
                false,
            ),
        ];
        for (sentence, validated, current, admitted) in cases {
            let f = DeviceFacts {
                enrollment_validated_ref: *validated,
                infrastructure_ref: *current,
                ..facts()
            };
            let got = refusals(w, none, &f, &[]);
            assert_eq!(got.is_empty(), *admitted, "{sentence}: {got:?}");
            if !admitted {
                assert_eq!(got[0].0, Refusal::EnrollmentProofMissing, "{sentence}");
            }
        }
        let unproven = DeviceFacts {
            enrollment_validated_ref: None,
            ..facts()
        };
        // "cordon_only is exempt"
        let cordon_only = Options {
            cordon_only: true,
            ..Options::default()
        };
        assert!(refusals(w, cordon_only, &unproven, &[]).is_empty());
        // "Enrollment itself never requires proof (it produces it), and
        // burn-in and Image Node stay proof-exempt."
        for w in [
            Workflow::Enrollment,
            Workflow::SingleNodeTest,
            Workflow::MultiNodeTest,
            Workflow::ImageNode,
        ] {
            assert!(refusals(w, none, &unproven, &[]).is_empty(), "{w}");
        }
        // "the custody-reclaim statuses (delegated, pending_handover) are exempt"
        for status in CUSTODY_RECLAIM {
            let f = DeviceFacts {
                operational_status: status,
                ..unproven.clone()
            };
            assert!(refusals(Workflow::MoveToTestCluster, none, &f, &[]).is_empty());
        }
    }

    #[test]
    fn disqualifiers_refuse_on_true_and_unknown() {
        // "an enrolment job is refused while the latch reads True or Unknown,
        // and admitted on False or absence ... condition_disqualifier_asserted
        // / condition_disqualifier_unproven carrying the failing condition_type"
        let w = Workflow::Enrollment;
        let latch = C::FrontendPortsInCustomerVrf;
        let cases = [
            (Some(S::True), Some(Refusal::ConditionDisqualifierAsserted)),
            (
                Some(S::Unknown),
                Some(Refusal::ConditionDisqualifierUnproven),
            ),
            (Some(S::False), None),
            (None, None),
        ];
        for (status, want) in cases {
            let rows: Vec<(C, S)> = status.map(|s| (latch, s)).into_iter().collect();
            let got = refusals(w, Options::default(), &facts(), &rows);
            assert_eq!(
                got,
                want.map(|r| (r, latch.as_str().to_string()))
                    .into_iter()
                    .collect::<Vec<_>>(),
                "{status:?}"
            );
        }
        // Custody reclaim is exempt from the condition gates too.
        let f = DeviceFacts {
            operational_status: O::Delegated,
            ..facts()
        };
        assert!(refusals(w, Options::default(), &f, &[(latch, S::True)]).is_empty());
    }

    #[test]
    fn image_admission_needs_maintenance_false_and_no_failure_state() {
        // "Image admission requires authoritative maintenance=false and
        // rejects every Ironic failure state"
        let w = Workflow::ImageNode;
        let o = Options::default();
        assert!(refusals(w, o, &facts(), &[]).is_empty());
        let on = DeviceFacts {
            ironic_maintenance: Some(true),
            ..facts()
        };
        assert_eq!(
            refusals(w, o, &on, &[])[0].0,
            Refusal::IronicMaintenanceNotFalse
        );
        let unknown = DeviceFacts {
            ironic_maintenance: None,
            ..facts()
        };
        assert_eq!(
            refusals(w, o, &unknown, &[])[0].0,
            Refusal::IronicMaintenanceNotFalse,
            "authoritative: not known is not false"
        );
        for state in crate::ironic::FAILURE_STATES {
            let f = DeviceFacts {
                ironic_provision_state: Some(state),
                ..facts()
            };
            assert_eq!(
                refusals(w, o, &f, &[]),
                vec![(Refusal::IronicFailureState, state.to_string())],
                "{state}"
            );
        }
    }

    #[test]
    fn every_refusal_comes_in_one_pass() {
        // "The gate is evaluated on the same eligibility pass as every other
        // policy at job creation."
        let w = Workflow::Enrollment;
        let f = facts();
        let got = refusals(
            w,
            Options::default(),
            &f,
            &[(C::FrontendPortsInCustomerVrf, S::True)],
        );
        assert_eq!(got.len(), 1);
        let image = DeviceFacts {
            ironic_maintenance: Some(true),
            ironic_provision_state: Some("deploy failed"),
            ..facts()
        };
        let got = refusals(Workflow::ImageNode, Options::default(), &image, &[]);
        assert_eq!(
            got.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            [
                Refusal::IronicMaintenanceNotFalse,
                Refusal::IronicFailureState
            ]
        );
    }

    #[test]
    fn drained_is_in_the_frontend_vrf_returns_allowlist() {
        // "re-run the front-end VRF return before the CUJ2 PATCH, which is
        // why drained is in that workflow's eligibility allowlist"
        let drained = DeviceFacts {
            operational_status: O::Drained,
            ..facts()
        };
        assert!(refusals(
            Workflow::FrontendVrfReturn,
            Options::default(),
            &drained,
            &[]
        )
        .is_empty());
        for w in Workflow::ALL
            .iter()
            .filter(|w| **w != Workflow::FrontendVrfReturn)
        {
            assert_eq!(
                refusals(*w, Options::default(), &drained, &[]),
                vec![(Refusal::OperationalStatusNotAllowed, "drained".to_string())],
                "{w}"
            );
        }
    }
}
