//! Release (seed 002, "Inventory status", "Enrollment identity proof", the
//! NVLink and back-end latch contracts): the hand-back of a device to a
//! customer pool. Pure: the workflow service reads the node, the trait,
//! NetBox, the proof and the latches immediately before each
//! customer-facing write, and asks [`handoff_verdict`] and [`r1_next`].

use crate::failure::FailureCode;
use crate::ironic::is_failure;
use crate::vocab::{vocab, ConditionStatus, OperationalStatus};

vocab!(
    /// Who runs the customer's side of a hand-back, as the caller (the
    /// satellite) injects it: "Release keys on engagement_mode=fully_managed
    /// + release_to_customer_pool".
    EngagementMode, "engagement mode" {
    FullyManaged => "fully_managed",
    Metal => "metal",
    SelfManaged => "self_managed",
});

/// Which hand-back a Release job makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// `release_to_customer_pool = false`: "internal Release ... returns to
    /// no customer": the device is left validated in the maintenance pool,
    /// nothing customer-facing is written.
    Internal,
    /// Fully managed: the maintenance lessee cleared, then the
    /// customer-ready trait added, each after the four checks.
    FullyManagedPool,
    /// Metal managed: the hub writes `operational_status = delegated`
    /// after NetBox and both latches ("the Metal hand-back always does");
    /// no proof ("metal / self-managed returns hand off through their own
    /// (non-Ironic) paths").
    MetalPool,
}

/// The path of a Release with these options; one this build does not run
/// is refused by name.
pub fn path(release_to_customer_pool: bool, mode: Option<EngagementMode>) -> Result<Path, String> {
    match (release_to_customer_pool, mode) {
        (false, None) => Ok(Path::Internal),
        (false, Some(m)) => Err(format!(
            "engagement_mode {m} goes with release_to_customer_pool (an internal Release returns to no customer)"
        )),
        (true, Some(EngagementMode::FullyManaged)) => Ok(Path::FullyManagedPool),
        (true, Some(EngagementMode::Metal)) => Ok(Path::MetalPool),
        (true, None) => Err(
            "release_to_customer_pool needs the engagement_mode (fully_managed, metal or self_managed)".into(),
        ),
        (true, Some(m)) => Err(format!(
            "a {m} hand-back is not run by this build of the workflow service (it runs fully_managed)"
        )),
    }
}

/// What a customer-facing step reads immediately before its one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handoff<'a> {
    /// NetBox's `status.value` of the device; `None` when NetBox has no
    /// such device.
    pub netbox_status: Option<&'a str>,
    pub infrastructure_ref: Option<&'a str>,
    pub enrollment_validated_ref: Option<&'a str>,
    /// The Ironic node the step resolved and is about to write.
    pub resolved_node: &'a str,
    pub nvlink_latch: Option<ConditionStatus>,
    pub backend_latch: Option<ConditionStatus>,
}

/// The checks of a fully managed hand-back's customer-facing step, in the
/// seed's order; the first that fails refuses the write.
///
/// - "the final handoff activity therefore re-reads NetBox and requires
///   active: adding the customer-ready trait, clearing a maintenance
///   lessee, and writing operational_status=delegated all refuse a missing
///   or non-active device";
/// - "fully managed Release re-checks inside the customer-return
///   activities ... the write is bound to that identity: the mutation
///   refuses if the Ironic node it resolved does not carry the proven
///   infrastructure_ref UUID";
/// - NVLink: "True and Unknown refuse the handoff, while False and absence
///   are permissive"; back-end: "A back-end refusal fails with
///   RELEASE_BACKEND_VRF_LATCH_REFUSED".
pub fn handoff_verdict(h: &Handoff<'_>) -> Result<(), (FailureCode, String)> {
    inventory_verdict(h.netbox_status)?;
    crate::eligibility::proof_verdict(
        h.infrastructure_ref,
        h.enrollment_validated_ref,
        h.resolved_node,
    )?;
    latch_verdict(h.nvlink_latch, h.backend_latch)
}

/// The Metal hand-back's checks before the hub's `delegate`: NetBox
/// `active`, then both latches ("In flight, each hand-back activity
/// re-reads both latches ... the Metal hand-back always does"); no proof.
pub fn metal_verdict(
    netbox_status: Option<&str>,
    nvlink_latch: Option<ConditionStatus>,
    backend_latch: Option<ConditionStatus>,
) -> Result<(), (FailureCode, String)> {
    inventory_verdict(netbox_status)?;
    latch_verdict(nvlink_latch, backend_latch)
}

/// "re-reads NetBox and requires active".
fn inventory_verdict(netbox_status: Option<&str>) -> Result<(), (FailureCode, String)> {
    match netbox_status {
        Some("active") => Ok(()),
        Some(other) => Err((
            FailureCode::ReleaseInventoryNotActive,
            format!("NetBox now reads the device {other}, not active"),
        )),
        None => Err((
            FailureCode::ReleaseInventoryNotActive,
            "NetBox no longer has the device".into(),
        )),
    }
}

/// NVLink: "True and Unknown refuse the handoff, while False and absence
/// are permissive"; the back-end latch is read "exactly as" NVLink.
pub fn latch_verdict(
    nvlink_latch: Option<ConditionStatus>,
    backend_latch: Option<ConditionStatus>,
) -> Result<(), (FailureCode, String)> {
    for (latch, code, condition) in [
        (
            nvlink_latch,
            FailureCode::ReleaseNvlinkLatchRefused,
            "NvLinkGpusInRepairPartition",
        ),
        (
            backend_latch,
            FailureCode::ReleaseBackendVrfLatchRefused,
            "BackendPortsInMaintenanceVrf",
        ),
    ] {
        if let Some(s @ (ConditionStatus::True | ConditionStatus::Unknown)) = latch {
            return Err((code, format!("{condition} is {}", s.as_str())));
        }
    }
    Ok(())
}

/// What the fully managed path reads of the node, the trait and the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R1Read<'a> {
    pub node: &'a str,
    pub provision_state: &'a str,
    pub target_provision_state: &'a str,
    pub instance_uuid: Option<&'a str>,
    pub lessee: Option<&'a str>,
    /// The site's maintenance (SLURM) project: the only lessee the
    /// hand-back clears.
    pub maintenance_project: &'a str,
    /// The customer-ready trait is on the node (its Placement resource
    /// provider, or the node's own traits at a standalone site).
    pub trait_present: bool,
    pub operational_status: OperationalStatus,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum R1Next {
    /// `release_to_customer_pool_activity`: remove the maintenance lessee.
    ClearLessee,
    /// `add_customer_ready_trait`, last: the trait is "authoritative proof
    /// of customer handover".
    AddTrait,
    /// Both written: the hub has not derived `available` yet.
    WaitAvailable,
    Done,
    Fail(FailureCode, String),
}

/// The fully managed hand-back's next step on a fresh read; each step skips
/// itself when the read shows it done, so a re-run repeats no write.
pub fn r1_next(r: &R1Read<'_>) -> R1Next {
    let fail = |code, message| R1Next::Fail(code, message);
    if is_failure(r.provision_state) {
        return fail(
            FailureCode::IronicFailureState,
            format!(
                "node {} is in the failure state {}",
                r.node, r.provision_state
            ),
        );
    }
    if r.provision_state != "available" || !r.target_provision_state.is_empty() {
        return fail(
            FailureCode::IronicNodeNotAvailable,
            format!(
                "node {} is {} (target {:?}): a hand-back needs an idle available node, run Unimage Node first",
                r.node, r.provision_state, r.target_provision_state
            ),
        );
    }
    if let Some(u) = r.instance_uuid {
        return fail(
            FailureCode::IronicNodeNotAvailable,
            format!(
                "node {} is still bound to instance {u}: run Unimage Node first",
                r.node
            ),
        );
    }
    match r.lessee.filter(|l| !l.is_empty()) {
        Some(l) if !r.maintenance_project.is_empty() && l == r.maintenance_project => {
            return R1Next::ClearLessee
        }
        Some(l) => {
            return fail(
                FailureCode::IronicLesseeUnexpected,
                format!(
                    "node {} is leased to {l}, not the maintenance project {:?}: a hand-back clears only the maintenance lease",
                    r.node, r.maintenance_project
                ),
            )
        }
        None => {}
    }
    if !r.trait_present {
        return R1Next::AddTrait;
    }
    if r.operational_status == OperationalStatus::Available {
        R1Next::Done
    } else {
        R1Next::WaitAvailable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ConditionStatus as S;

    fn handoff() -> Handoff<'static> {
        Handoff {
            netbox_status: Some("active"),
            infrastructure_ref: Some("uuid-1"),
            enrollment_validated_ref: Some("uuid-1"),
            resolved_node: "uuid-1",
            nvlink_latch: None,
            backend_latch: Some(S::False),
        }
    }

    fn code(r: Result<(), (FailureCode, String)>) -> FailureCode {
        r.unwrap_err().0
    }

    #[test]
    fn the_paths_release_takes() {
        assert_eq!(path(false, None), Ok(Path::Internal));
        assert_eq!(
            path(true, Some(EngagementMode::FullyManaged)),
            Ok(Path::FullyManagedPool)
        );
        assert!(path(true, None).unwrap_err().contains("engagement_mode"));
        assert_eq!(path(true, Some(EngagementMode::Metal)), Ok(Path::MetalPool));
        assert!(path(true, Some(EngagementMode::SelfManaged))
            .unwrap_err()
            .contains("not run by this build"));
        assert!(path(false, Some(EngagementMode::FullyManaged)).is_err());
    }

    /// "re-reads NetBox and requires active: adding the customer-ready
    /// trait, clearing a maintenance lessee, and writing
    /// operational_status=delegated all refuse a missing or non-active
    /// device. This closes the window where NetBox can move a device to rma
    /// after the release job was admitted."
    #[test]
    fn netbox_must_read_active_immediately_before_the_write() {
        assert!(handoff_verdict(&handoff()).is_ok());
        // rma, and gone from NetBox.
        for netbox_status in [Some("rma"), None] {
            let h = Handoff {
                netbox_status,
                ..handoff()
            };
            assert_eq!(
                code(handoff_verdict(&h)),
                FailureCode::ReleaseInventoryNotActive,
                "{netbox_status:?}"
            );
        }
    }

    /// "metal / self-managed returns hand off through their own (non-Ironic)
    /// paths" (no proof), yet "writing operational_status=delegated"
    /// refuses a non-active device, and "the Metal hand-back always" reads
    /// both latches.
    #[test]
    fn the_metal_hand_back_reads_netbox_and_both_latches_not_the_proof() {
        use ConditionStatus as C;
        assert!(metal_verdict(Some("active"), None, Some(C::False)).is_ok());
        assert_eq!(
            code(metal_verdict(Some("rma"), None, None)),
            FailureCode::ReleaseInventoryNotActive
        );
        assert_eq!(
            code(metal_verdict(None, None, None)),
            FailureCode::ReleaseInventoryNotActive
        );
        assert_eq!(
            code(metal_verdict(Some("active"), Some(C::Unknown), None)),
            FailureCode::ReleaseNvlinkLatchRefused
        );
        assert_eq!(
            code(metal_verdict(Some("active"), Some(C::False), Some(C::True))),
            FailureCode::ReleaseBackendVrfLatchRefused
        );
    }

    /// "the mutation refuses if the Ironic node it resolved does not carry
    /// the proven infrastructure_ref UUID"; "ENROLLMENT_PROOF_MISSING when
    /// proof is absent".
    #[test]
    fn the_write_is_bound_to_the_proven_identity() {
        let unproven = Handoff {
            enrollment_validated_ref: None,
            ..handoff()
        };
        let stale = Handoff {
            enrollment_validated_ref: Some("uuid-0"),
            ..handoff()
        };
        let other_node = Handoff {
            resolved_node: "uuid-2",
            ..handoff()
        };
        for h in [unproven, stale, other_node] {
            assert_eq!(
                code(handoff_verdict(&h)),
                FailureCode::EnrollmentProofMissing,
                "{h:?}"
            );
        }
    }

    /// NVLink: "True and Unknown refuse the handoff, while False and absence
    /// are permissive"; back-end: "A back-end refusal fails with
    /// RELEASE_BACKEND_VRF_LATCH_REFUSED".
    #[test]
    fn the_partition_latches_refuse_on_true_and_unknown() {
        for (nvlink, backend, want) in [
            (
                Some(S::True),
                None,
                Some(FailureCode::ReleaseNvlinkLatchRefused),
            ),
            (
                Some(S::Unknown),
                None,
                Some(FailureCode::ReleaseNvlinkLatchRefused),
            ),
            (Some(S::False), None, None),
            (
                None,
                Some(S::True),
                Some(FailureCode::ReleaseBackendVrfLatchRefused),
            ),
            (
                None,
                Some(S::Unknown),
                Some(FailureCode::ReleaseBackendVrfLatchRefused),
            ),
            (None, None, None),
        ] {
            let h = Handoff {
                nvlink_latch: nvlink,
                backend_latch: backend,
                ..handoff()
            };
            assert_eq!(
                handoff_verdict(&h).err().map(|e| e.0),
                want,
                "{nvlink:?} {backend:?}"
            );
        }
    }

    fn read() -> R1Read<'static> {
        R1Read {
            node: "uuid-1",
            provision_state: "available",
            target_provision_state: "",
            instance_uuid: None,
            lessee: Some("maint"),
            maintenance_project: "maint",
            trait_present: false,
            operational_status: OperationalStatus::Validation,
        }
    }

    /// The lessee is cleared first, the trait added last, then the hub's
    /// `available` is waited for; every step skips itself once done.
    #[test]
    fn the_fully_managed_hand_back_clears_the_lease_then_adds_the_trait() {
        assert_eq!(r1_next(&read()), R1Next::ClearLessee);
        let unleased = R1Read {
            lessee: None,
            ..read()
        };
        assert_eq!(r1_next(&unleased), R1Next::AddTrait);
        let traited = R1Read {
            trait_present: true,
            ..unleased
        };
        assert_eq!(r1_next(&traited), R1Next::WaitAvailable);
        let available = R1Read {
            operational_status: OperationalStatus::Available,
            ..traited
        };
        assert_eq!(r1_next(&available), R1Next::Done);
    }

    #[test]
    fn only_an_idle_unbound_available_node_with_the_maintenance_lease_is_handed_back() {
        let cases = [
            (
                "deployed",
                R1Read {
                    provision_state: "active",
                    ..read()
                },
                FailureCode::IronicNodeNotAvailable,
            ),
            (
                "bound",
                R1Read {
                    instance_uuid: Some("i-1"),
                    ..read()
                },
                FailureCode::IronicNodeNotAvailable,
            ),
            (
                "leased to a customer",
                R1Read {
                    lessee: Some("cust-project"),
                    ..read()
                },
                FailureCode::IronicLesseeUnexpected,
            ),
            (
                "in a failure state",
                R1Read {
                    provision_state: "clean failed",
                    ..read()
                },
                FailureCode::IronicFailureState,
            ),
        ];
        for (what, r, want) in cases {
            let got = r1_next(&r);
            assert!(
                matches!(&got, R1Next::Fail(code, _) if *code == want),
                "{what}: {got:?}"
            );
        }
    }
}
