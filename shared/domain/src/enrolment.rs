//! The Enrolment workflow against Ironic (seed 002, "Enrollment identity
//! proof"): take an existing node through `manageable`, inspection and
//! `provide` to `available`, and establish the enrollment proof for the
//! node it operated. Pure: the workflow service reads the node, asks
//! [`enrol_next`], does it, reads again; a worker killed anywhere resumes
//! from a fresh read and what the run pinned.
//!
//! The node's creation, its BMC and credentials are out of scope (seed 002,
//! "Intentionally out of scope": "Enrollment workflow steps (DHCP, BMC,
//! 1Password credential writes)"): the run starts from a node Ironic has.

use chrono::{DateTime, Utc};

use crate::failure::FailureCode;
use crate::ironic::is_failure;

/// What the run reads of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnrolNode<'a> {
    pub uuid: &'a str,
    pub provision_state: &'a str,
    /// Empty when no provision transition is in flight.
    pub target_provision_state: &'a str,
    /// Empty when no power transition is in flight.
    pub target_power_state: &'a str,
    pub maintenance: bool,
    pub driver: &'a str,
    pub last_error: Option<&'a str>,
    pub inspection_finished_at: Option<DateTime<Utc>>,
}

/// What the run pinned so far (committed before the write it precedes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pinned {
    /// The node identity the run operates: every later read must be it, and
    /// a failure write is guarded by it.
    pub identity: Option<String>,
    /// Pinned just before the inspection is asked for: the node's last
    /// `inspection_finished_at` then (`Some(None)`: never inspected). A
    /// later one is this run's inspection, whatever the two clocks read.
    pub inspect_baseline: Option<Option<DateTime<Utc>>>,
    pub power_cycle_requested: bool,
    pub proof_written: bool,
}

impl Pinned {
    /// Whether the inspection this run asked for has completed.
    fn inspected(&self, node: &EnrolNode<'_>) -> bool {
        match (&self.inspect_baseline, node.inspection_finished_at) {
            (Some(before), Some(now)) => before.is_none_or(|b| now > b),
            _ => false,
        }
    }
}

/// The job's and the site's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings<'a> {
    /// `false`: a diagnostic run, which proves nothing ("Diagnostic success
    /// (run_inspection=false) ... make no proof write").
    pub run_inspection: bool,
    /// Power-cycle the node before inspecting it, which needs
    /// `required_driver`.
    pub power_cycle: bool,
    pub required_driver: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnrolNext {
    /// Pin the node the run operates, before any write.
    PinIdentity(String),
    /// Pin the node's last inspection time, before asking for one.
    PinInspect {
        baseline: Option<DateTime<Utc>>,
    },
    /// `PUT /states/provision {"target": ...}`.
    Provision(&'static str),
    /// `PUT /states/power {"target": "rebooting"}`.
    PowerCycle,
    /// The qualifying typed completion: enrolled proof for the node.
    WriteProof {
        result_ref: String,
    },
    Wait,
    Done,
    Fail(FailureCode, String),
}

fn fail(code: FailureCode, message: String) -> EnrolNext {
    EnrolNext::Fail(code, message)
}

/// Text Ironic puts in `last_error` when inspection could not boot the
/// agent because its kernel or ramdisk image is missing.
const IPA_IMAGE: &[&str] = &[
    "deploy_kernel",
    "deploy_ramdisk",
    "deploy kernel",
    "deploy ramdisk",
    "ipa image",
    "agent image",
    "ramdisk image",
    "kernel image",
];
const NOT_FOUND: &[&str] = &[
    "not found",
    "could not be found",
    "cannot find",
    "can not find",
    "could not find",
    "does not exist",
    "no such file",
];

/// An `inspect failed` whose `last_error` says the agent's image is
/// missing (`IRONIC_INSPECTION_IPA_IMAGE_NOT_FOUND`), against any other
/// inspection failure.
pub fn ipa_image_not_found(last_error: &str) -> bool {
    // One clause must name both the image and its absence: "deploy_kernel
    // configured; BMC not found" is about something else.
    let e = last_error
        .to_ascii_lowercase()
        .replace(". ", ";")
        .replace('\n', ";");
    e.split(';').any(|clause| {
        IPA_IMAGE.iter().any(|m| clause.contains(m)) && NOT_FOUND.iter().any(|m| clause.contains(m))
    })
}

/// The next move of an Enrolment run. `device_ref`: the device's
/// `infrastructure_ref` (the node is looked up by it, else by name).
pub fn enrol_next(
    node: &EnrolNode<'_>,
    device_ref: Option<&str>,
    pinned: &Pinned,
    s: Settings<'_>,
) -> EnrolNext {
    use FailureCode as F;
    // "failures without a trustworthy pinned identity make no proof write":
    // the identity is pinned first, and only when the node is the device's.
    let Some(identity) = pinned.identity.as_deref() else {
        return match device_ref.filter(|r| !r.is_empty()) {
            Some(r) if r != node.uuid => fail(
                F::EnrollmentIdentityMismatch,
                format!(
                    "the device's infrastructure_ref is {r}, the node found is {}",
                    node.uuid
                ),
            ),
            _ => EnrolNext::PinIdentity(node.uuid.to_string()),
        };
    };
    if identity != node.uuid {
        return fail(
            F::EnrollmentIdentityMismatch,
            format!(
                "the run operates node {identity}, Ironic now answers with {}",
                node.uuid
            ),
        );
    }
    if node.maintenance {
        return fail(
            F::IronicNodeInMaintenance,
            format!("node {} is in maintenance", node.uuid),
        );
    }
    if !node.target_provision_state.is_empty() || !node.target_power_state.is_empty() {
        return EnrolNext::Wait;
    }
    let state = node.provision_state;
    if state == "inspect failed" {
        let e = node.last_error.unwrap_or("no last_error");
        return if ipa_image_not_found(e) {
            fail(
                F::IronicInspectionIpaImageNotFound,
                format!(
                    "inspection of node {} could not boot the agent: {e}",
                    node.uuid
                ),
            )
        } else {
            fail(
                F::IronicInspectionFailed,
                format!("inspection of node {} failed: {e}", node.uuid),
            )
        };
    }
    if is_failure(state) {
        return fail(
            F::IronicFailureState,
            format!("node {} is in the failure state {state}", node.uuid),
        );
    }
    match state {
        "enroll" => EnrolNext::Provision("manage"),
        "manageable" if !s.run_inspection => EnrolNext::Provision("provide"),
        "manageable" if pinned.inspected(node) => EnrolNext::Provision("provide"),
        "manageable" => {
            if s.power_cycle && !pinned.power_cycle_requested {
                // "an Ironic power cycle was requested for a node that does
                // not use the required ipmi driver": refused before any
                // power call is made.
                if node.driver != s.required_driver {
                    return fail(
                        F::IronicDriverMismatch,
                        format!(
                            "node {} uses driver {}, a power cycle needs {}",
                            node.uuid, node.driver, s.required_driver
                        ),
                    );
                }
                return EnrolNext::PowerCycle;
            }
            match pinned.inspect_baseline {
                None => EnrolNext::PinInspect {
                    baseline: node.inspection_finished_at,
                },
                // A lost request is sent again: nothing is in flight.
                Some(_) => EnrolNext::Provision("inspect"),
            }
        }
        "available" if !s.run_inspection => EnrolNext::Done,
        "available" if pinned.proof_written => EnrolNext::Done,
        "available" if pinned.inspected(node) => EnrolNext::WriteProof {
            result_ref: node.uuid.to_string(),
        },
        // Available but not inspected by this run: back to manageable.
        "available" => EnrolNext::Provision("manage"),
        other => fail(
            F::IronicNodeNotAvailable,
            format!(
                "node {} is {other}: only an enroll, manageable or available node is enrolled",
                node.uuid
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(state: &'static str) -> EnrolNode<'static> {
        EnrolNode {
            uuid: "uuid-1",
            provision_state: state,
            target_provision_state: "",
            target_power_state: "",
            maintenance: false,
            driver: "ipmi",
            last_error: None,
            inspection_finished_at: None,
        }
    }

    const S: Settings<'static> = Settings {
        run_inspection: true,
        power_cycle: false,
        required_driver: "ipmi",
    };

    fn pinned() -> Pinned {
        Pinned {
            identity: Some("uuid-1".into()),
            ..Pinned::default()
        }
    }

    fn code(n: EnrolNext) -> FailureCode {
        match n {
            EnrolNext::Fail(code, _) => code,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    /// "failures without a trustworthy pinned identity make no proof
    /// write": the identity is pinned before anything else, and only when
    /// the node is the device's.
    #[test]
    fn the_identity_is_pinned_first_and_must_stay_the_same() {
        let n = node("enroll");
        assert_eq!(
            enrol_next(&n, Some("uuid-1"), &Pinned::default(), S),
            EnrolNext::PinIdentity("uuid-1".into())
        );
        assert_eq!(
            enrol_next(&n, None, &Pinned::default(), S),
            EnrolNext::PinIdentity("uuid-1".into())
        );
        assert_eq!(
            code(enrol_next(&n, Some("uuid-2"), &Pinned::default(), S)),
            FailureCode::EnrollmentIdentityMismatch
        );
        let other = Pinned {
            identity: Some("uuid-9".into()),
            ..Pinned::default()
        };
        assert_eq!(
            code(enrol_next(&n, Some("uuid-1"), &other, S)),
            FailureCode::EnrollmentIdentityMismatch
        );
    }

    #[test]
    fn enroll_then_manage_then_inspect_then_provide() {
        let p = pinned();
        assert_eq!(
            enrol_next(&node("enroll"), None, &p, S),
            EnrolNext::Provision("manage")
        );
        let before = "2026-12-01T10:00:00Z".parse().ok();
        let mut m = node("manageable");
        m.inspection_finished_at = before;
        // The baseline is pinned before the inspection is asked for...
        assert_eq!(
            enrol_next(&m, None, &p, S),
            EnrolNext::PinInspect { baseline: before }
        );
        let asked = Pinned {
            inspect_baseline: Some(before),
            ..pinned()
        };
        // ...then asked for (again, if the request was lost)...
        assert_eq!(
            enrol_next(&m, None, &asked, S),
            EnrolNext::Provision("inspect")
        );
        // ...a node already inspecting is waited for, never re-fired...
        let mut busy = node("inspecting");
        busy.target_provision_state = "manageable";
        assert_eq!(enrol_next(&busy, None, &asked, S), EnrolNext::Wait);
        // ...and a later completion is this run's.
        m.inspection_finished_at = "2026-12-02T10:00:00Z".parse().ok();
        assert_eq!(
            enrol_next(&m, None, &asked, S),
            EnrolNext::Provision("provide")
        );
        let mut a = node("available");
        a.inspection_finished_at = m.inspection_finished_at;
        assert_eq!(
            enrol_next(&a, None, &asked, S),
            EnrolNext::WriteProof {
                result_ref: "uuid-1".into()
            }
        );
        let written = Pinned {
            proof_written: true,
            ..asked
        };
        assert_eq!(enrol_next(&a, None, &written, S), EnrolNext::Done);
    }

    /// "A qualifying typed completion establishes enrolled proof": an
    /// available node this run did not inspect goes back through
    /// inspection first.
    #[test]
    fn an_available_node_not_inspected_by_the_run_is_inspected_first() {
        let mut a = node("available");
        a.inspection_finished_at = "2026-12-01T10:00:00Z".parse().ok();
        assert_eq!(
            enrol_next(&a, None, &pinned(), S),
            EnrolNext::Provision("manage")
        );
        let asked = Pinned {
            inspect_baseline: Some(a.inspection_finished_at),
            ..pinned()
        };
        assert_eq!(
            enrol_next(&a, None, &asked, S),
            EnrolNext::Provision("manage")
        );
    }

    /// "Diagnostic success (run_inspection=false) ... make[s] no proof
    /// write".
    #[test]
    fn a_diagnostic_run_provides_without_inspection_and_proves_nothing() {
        let d = Settings {
            run_inspection: false,
            ..S
        };
        assert_eq!(
            enrol_next(&node("manageable"), None, &pinned(), d),
            EnrolNext::Provision("provide")
        );
        assert_eq!(
            enrol_next(&node("available"), None, &pinned(), d),
            EnrolNext::Done
        );
    }

    /// "IRONIC_DRIVER_MISMATCH: an Ironic power cycle was requested for a
    /// node that does not use the required ipmi driver".
    #[test]
    fn a_power_cycle_needs_the_required_driver() {
        let cycle = Settings {
            power_cycle: true,
            ..S
        };
        let mut m = node("manageable");
        assert_eq!(
            enrol_next(&m, None, &pinned(), cycle),
            EnrolNext::PowerCycle
        );
        m.driver = "redfish";
        assert_eq!(
            code(enrol_next(&m, None, &pinned(), cycle)),
            FailureCode::IronicDriverMismatch
        );
        // A power transition in flight is waited for.
        let mut rebooting = node("manageable");
        rebooting.target_power_state = "power on";
        let cycled = Pinned {
            power_cycle_requested: true,
            ..pinned()
        };
        assert_eq!(
            enrol_next(&rebooting, None, &cycled, cycle),
            EnrolNext::Wait
        );
        assert_eq!(
            enrol_next(&node("manageable"), None, &cycled, cycle),
            EnrolNext::PinInspect { baseline: None }
        );
    }

    /// "IRONIC_INSPECTION_IPA_IMAGE_NOT_FOUND" against any other
    /// inspection failure.
    #[test]
    fn an_inspection_failure_is_classified_by_its_last_error() {
        let mut f = node("inspect failed");
        f.last_error = Some(
            "Failed to prepare to inspect: Image deploy_kernel (glance://abc) could not be found.",
        );
        assert_eq!(
            code(enrol_next(&f, None, &pinned(), S)),
            FailureCode::IronicInspectionIpaImageNotFound
        );
        f.last_error = Some("Timeout reached while inspecting the node");
        assert_eq!(
            code(enrol_next(&f, None, &pinned(), S)),
            FailureCode::IronicInspectionFailed
        );
        assert!(ipa_image_not_found(
            "Cannot find deploy ramdisk /httpboot/ipa.initramfs"
        ));
        assert!(!ipa_image_not_found(
            "deploy_kernel configured; BMC not found"
        ));
    }

    #[test]
    fn maintenance_failure_states_and_deployed_nodes_fail() {
        let mut m = node("manageable");
        m.maintenance = true;
        assert_eq!(
            code(enrol_next(&m, None, &pinned(), S)),
            FailureCode::IronicNodeInMaintenance
        );
        assert_eq!(
            code(enrol_next(&node("clean failed"), None, &pinned(), S)),
            FailureCode::IronicFailureState
        );
        assert_eq!(
            code(enrol_next(&node("active"), None, &pinned(), S)),
            FailureCode::IronicNodeNotAvailable
        );
    }
}
