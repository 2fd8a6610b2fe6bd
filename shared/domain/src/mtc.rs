//! Move to Test Cluster (seed 002: "The flag is set on Move to Test Cluster
//! (Quarantine)"): take a host from wherever it is into the SLURM test
//! cluster. Three phases, each a pure decision over a fresh read:
//!
//! 1. **cordon**: the customer-ready trait removed (proof-exempt;
//!    `cordon_only` "removes the customer-ready trait without adopting" and
//!    ends here);
//! 2. **reclaim**: a node bound to another instance is torn down only with
//!    `force_reclaim` ("it deletes the customer instance before the adopt,
//!    so it is bound to the proven identity too");
//! 3. **adopt**: the maintenance (SLURM) lease, the SLURM image (through
//!    [`crate::ironic_direct::image_next`]), then the SLURM node: listed,
//!    resumed when drained for a reason the workflow owns, then the hub's
//!    `validation`.
//!
//! The proof is checked by the workflow service immediately before each
//! write of phases 2 and 3 ("Move to Test Cluster re-checks inside
//! adopt_host_activity, just before the SLURM adoption, and inside
//! force_reclaim_host_activity when force_reclaim is set").

use crate::failure::FailureCode;
use crate::ironic::is_failure;
use crate::slurm::normalise;
use crate::vocab::OperationalStatus;

/// Where a run is (pinned as `phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Cordon,
    Reclaim,
    Adopt,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Cordon => "cordon",
            Phase::Reclaim => "reclaim",
            Phase::Adopt => "adopt",
        }
    }

    pub fn parse(s: &str) -> Phase {
        match s {
            "reclaim" => Phase::Reclaim,
            "adopt" => Phase::Adopt,
            _ => Phase::Cordon,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cordon {
    RemoveTrait,
    /// `cordon_only`: done.
    Done,
    Next(Phase),
}

/// Phase 1 on a read of the trait.
pub fn cordon_next(trait_present: bool, cordon_only: bool) -> Cordon {
    match (trait_present, cordon_only) {
        (true, _) => Cordon::RemoveTrait,
        (false, true) => Cordon::Done,
        (false, false) => Cordon::Next(Phase::Reclaim),
    }
}

/// What phase 2 reads of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRead<'a> {
    pub uuid: &'a str,
    pub provision_state: &'a str,
    pub target_provision_state: &'a str,
    pub instance_uuid: Option<&'a str>,
    pub maintenance: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reclaim {
    /// Tear the node down (Ironic `deleted`): after the proof check.
    TearDown,
    Wait,
    Next(Phase),
    Fail(FailureCode, String),
}

/// Phase 2. `ours`: the instance this run's own imaging bound (a re-run
/// after the adopt started is not a reclaim); `requested`: the teardown
/// was asked for already (never fired twice).
pub fn reclaim_next(
    n: &NodeRead<'_>,
    ours: Option<&str>,
    force_reclaim: bool,
    requested: bool,
) -> Reclaim {
    if n.maintenance {
        return Reclaim::Fail(
            FailureCode::IronicNodeInMaintenance,
            format!("node {} is in maintenance", n.uuid),
        );
    }
    if is_failure(n.provision_state) && n.provision_state != "deploy failed" {
        return Reclaim::Fail(
            FailureCode::IronicFailureState,
            format!(
                "node {} is in the failure state {}",
                n.uuid, n.provision_state
            ),
        );
    }
    if !n.target_provision_state.is_empty() {
        return Reclaim::Wait;
    }
    let foreign = match n.instance_uuid {
        Some(u) => Some(u) != ours,
        None => matches!(n.provision_state, "active" | "deploy failed"),
    };
    if !foreign {
        return Reclaim::Next(Phase::Adopt);
    }
    if requested {
        // The teardown was asked for; Ironic has not started it yet.
        return Reclaim::Wait;
    }
    if !force_reclaim {
        return Reclaim::Fail(
            FailureCode::MtcCustomerInstancePresent,
            format!(
                "node {} is bound to instance {}: set force_reclaim to reclaim it",
                n.uuid,
                n.instance_uuid.unwrap_or("(none recorded)")
            ),
        );
    }
    Reclaim::TearDown
}

/// What phase 3 reads of SLURM and the hub, once the node runs the SLURM
/// image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmRead<'a> {
    /// `None`: SLURM does not list the node (yet).
    pub states: Option<Vec<String>>,
    pub reason: &'a str,
    /// The site's slurmrestd updates nodes over REST (v0.0.39 and later).
    pub update_supported: bool,
    pub operational_status: OperationalStatus,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adopt {
    /// SLURM does not list the node yet (slurmd registers at boot).
    WaitRegistered,
    /// `POST /node/{name} {"state": ["RESUME"]}`: after the proof check.
    Resume,
    /// The hub has not derived `validation` yet.
    WaitValidation,
    Done,
    Fail(FailureCode, String),
}

/// A drain or down reason the workflow may clear: none, a reboot, or one a
/// fleet workflow wrote (`fleet:`).
pub fn resumable(reason: &str) -> bool {
    let r = reason.trim();
    r.is_empty() || r.starts_with("fleet:") || r.eq_ignore_ascii_case("Node unexpectedly rebooted")
}

/// Phase 3, SLURM half. `resume_requested`: a RESUME was sent already
/// ("A 200 is never trusted: the next read must show no DRAIN/DOWN").
pub fn adopt_next(s: &SlurmRead<'_>, resume_requested: bool) -> Adopt {
    let Some(states) = &s.states else {
        return Adopt::WaitRegistered;
    };
    let n = normalise(states);
    if let Some(bad) = n.first_bad() {
        if !resumable(s.reason) {
            return Adopt::Fail(
                FailureCode::SlurmNodeDrainedByOperator,
                format!(
                    "SLURM holds the node {} for {:?}: not the workflow's to clear",
                    bad.as_str(),
                    s.reason
                ),
            );
        }
        if !s.update_supported {
            return Adopt::Fail(FailureCode::SlurmNodeUpdateUnsupported, format!(
                    "SLURM holds the node {} and this slurmrestd has no node update (v0.0.38, SLURM 22.05): resume it with scontrol",
                    bad.as_str()
                ));
        }
        if resume_requested {
            return Adopt::Fail(
                FailureCode::SlurmRequestRefused,
                format!(
                    "SLURM still holds the node {} after a RESUME it accepted",
                    bad.as_str()
                ),
            );
        }
        return Adopt::Resume;
    }
    if s.operational_status == OperationalStatus::Validation {
        Adopt::Done
    } else {
        Adopt::WaitValidation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(state: &'static str, instance: Option<&'static str>) -> NodeRead<'static> {
        NodeRead {
            uuid: "uuid-1",
            provision_state: state,
            target_provision_state: "",
            instance_uuid: instance,
            maintenance: false,
        }
    }

    /// "cordon_only returns before the adopt and is exempt": it removes the
    /// customer-ready trait and ends.
    #[test]
    fn the_cordon_removes_the_trait_and_cordon_only_ends_there() {
        assert_eq!(cordon_next(true, true), Cordon::RemoveTrait);
        assert_eq!(cordon_next(false, true), Cordon::Done);
        assert_eq!(cordon_next(true, false), Cordon::RemoveTrait);
        assert_eq!(cordon_next(false, false), Cordon::Next(Phase::Reclaim));
    }

    /// "force_reclaim ... deletes the customer instance before the adopt":
    /// without it a bound node is refused; a teardown is never fired twice.
    #[test]
    fn a_customer_instance_is_reclaimed_only_with_force_reclaim() {
        let bound = node("active", Some("cust-1"));
        assert!(matches!(
            reclaim_next(&bound, None, false, false),
            Reclaim::Fail(FailureCode::MtcCustomerInstancePresent, _)
        ));
        assert_eq!(reclaim_next(&bound, None, true, false), Reclaim::TearDown);
        assert_eq!(reclaim_next(&bound, None, true, true), Reclaim::Wait);
        // The run's own imaging is not a customer's.
        assert_eq!(
            reclaim_next(&bound, Some("cust-1"), false, false),
            Reclaim::Next(Phase::Adopt)
        );
        assert_eq!(
            reclaim_next(&node("available", None), None, false, false),
            Reclaim::Next(Phase::Adopt)
        );
        let mut tearing = node("deleting", Some("cust-1"));
        tearing.target_provision_state = "available";
        assert_eq!(reclaim_next(&tearing, None, true, true), Reclaim::Wait);
    }

    fn slurm(states: Option<&[&str]>, reason: &'static str, rest: bool) -> SlurmRead<'static> {
        SlurmRead {
            states: states.map(|s| s.iter().map(|x| x.to_string()).collect()),
            reason,
            update_supported: rest,
            operational_status: OperationalStatus::Quarantine,
        }
    }

    /// The SLURM adoption: registered, resumed when the workflow owns the
    /// hold, then the hub's `validation`.
    #[test]
    fn the_adopt_waits_for_registration_resumes_what_it_owns_then_validation() {
        assert_eq!(
            adopt_next(&slurm(None, "", true), false),
            Adopt::WaitRegistered
        );
        assert_eq!(
            adopt_next(&slurm(Some(&["IDLE"]), "", true), false),
            Adopt::WaitValidation
        );
        let mut ok = slurm(Some(&["IDLE"]), "", true);
        ok.operational_status = OperationalStatus::Validation;
        assert_eq!(adopt_next(&ok, false), Adopt::Done);
        let drained = slurm(
            Some(&["IDLE", "DRAIN"]),
            "fleet:move_to_test_cluster:job_1",
            true,
        );
        assert_eq!(adopt_next(&drained, false), Adopt::Resume);
        // "A 200 is never trusted": still drained after the RESUME.
        assert!(matches!(
            adopt_next(&drained, true),
            Adopt::Fail(FailureCode::SlurmRequestRefused, _)
        ));
    }

    #[test]
    fn a_hold_the_workflow_does_not_own_or_cannot_clear_fails_closed() {
        let operator = slurm(Some(&["IDLE", "DRAIN"]), "bad dimm, ticket 42", true);
        assert!(matches!(
            adopt_next(&operator, false),
            Adopt::Fail(FailureCode::SlurmNodeDrainedByOperator, _)
        ));
        let old = slurm(Some(&["DOWN"]), "Node unexpectedly rebooted", false);
        assert!(matches!(
            adopt_next(&old, false),
            Adopt::Fail(FailureCode::SlurmNodeUpdateUnsupported, _)
        ));
        assert!(resumable(""));
        assert!(resumable("fleet:x"));
        assert!(!resumable("maintenance"));
    }
}
