//! The failure-code taxonomy (seed 002, "Failure codes"): one place for
//! every `JobDeviceStatus.failure_code`, its meaning, the triage queue that
//! owns it, and whether re-running the same work may succeed without anyone
//! fixing something first. `status = failed` says a device's workflow ended
//! unsuccessfully; the failure code routes it, and `failure_message` carries
//! the host-specific detail.

use crate::vocab::vocab;

vocab!(
    /// Who triages a failure: `fleet_manager`, this product's own team (an
    /// outage of the mesh itself); `bare_metal`, provisioning (Ironic
    /// drivers, images, conductors); `network`, the switch fabric (front-end
    /// and back-end VRFs); `nvlink_fabric`, NMX-M partitions; `operations`,
    /// data-centre operations (identity, custody, hand-back).
    TriageOwner, "triage owner" {
    FleetManager => "fleet_manager",
    BareMetal => "bare_metal",
    Network => "network",
    NvlinkFabric => "nvlink_fabric",
    Operations => "operations",
});

vocab!(
    /// `JobDeviceStatus.failure_code`.
    FailureCode, "failure code" {
    IronicDriverMismatch => "IRONIC_DRIVER_MISMATCH",
    IronicInspectionIpaImageNotFound => "IRONIC_INSPECTION_IPA_IMAGE_NOT_FOUND",
    EnrollmentProofMissing => "ENROLLMENT_PROOF_MISSING",
    EnrollmentProofUnavailable => "ENROLLMENT_PROOF_UNAVAILABLE",
    SwitchVrfFlipFailed => "SWITCH_VRF_FLIP_FAILED",
    SwitchVrfLatchWriteFailed => "SWITCH_VRF_LATCH_WRITE_FAILED",
    BackendVrfLatchWriteFailed => "BACKEND_VRF_LATCH_WRITE_FAILED",
    NvlinkLatchWriteFailed => "NVLINK_LATCH_WRITE_FAILED",
    ReleaseBackendVrfLatchRefused => "RELEASE_BACKEND_VRF_LATCH_REFUSED",
    IronicDeployFailed => "IRONIC_DEPLOY_FAILED",
    IronicFailureState => "IRONIC_FAILURE_STATE",
    IronicNodeInMaintenance => "IRONIC_NODE_IN_MAINTENANCE",
    IronicNodeNotAvailable => "IRONIC_NODE_NOT_AVAILABLE",
    IronicStaleInstanceUuid => "IRONIC_STALE_INSTANCE_UUID",
    IronicInstanceMismatch => "IRONIC_INSTANCE_MISMATCH",
    IronicCleaningFailed => "IRONIC_CLEANING_FAILED",
    IronicNodeNotFound => "IRONIC_NODE_NOT_FOUND",
    IronicUnavailable => "IRONIC_UNAVAILABLE",
    IronicRequestRefused => "IRONIC_REQUEST_REFUSED",
    IronicTimeout => "IRONIC_TIMEOUT",
    SiteNotConfigured => "SITE_NOT_CONFIGURED",
    WorkflowInternalError => "WORKFLOW_INTERNAL_ERROR",
    PlacementUnavailable => "PLACEMENT_UNAVAILABLE",
    PlacementResourceProviderNotFound => "PLACEMENT_RESOURCE_PROVIDER_NOT_FOUND",
    PlacementRequestRefused => "PLACEMENT_REQUEST_REFUSED",
    HubUnavailable => "HUB_UNAVAILABLE",
    ImpairmentHoldRefused => "IMPAIRMENT_HOLD_REFUSED",
    EnrollmentIdentityMismatch => "ENROLLMENT_IDENTITY_MISMATCH",
    IronicInspectionFailed => "IRONIC_INSPECTION_FAILED",
    EnrollmentProofWriteRefused => "ENROLLMENT_PROOF_WRITE_REFUSED",
    ReleaseInventoryNotActive => "RELEASE_INVENTORY_NOT_ACTIVE",
    NetboxUnavailable => "NETBOX_UNAVAILABLE",
    ReleaseNvlinkLatchRefused => "RELEASE_NVLINK_LATCH_REFUSED",
    ReleaseNotObserved => "RELEASE_NOT_OBSERVED",
    IronicLesseeUnexpected => "IRONIC_LESSEE_UNEXPECTED",
    MtcCustomerInstancePresent => "MTC_CUSTOMER_INSTANCE_PRESENT",
    SlurmUnavailable => "SLURM_UNAVAILABLE",
    SlurmRequestRefused => "SLURM_REQUEST_REFUSED",
    SlurmNodeUpdateUnsupported => "SLURM_NODE_UPDATE_UNSUPPORTED",
    SlurmNodeNotRegistered => "SLURM_NODE_NOT_REGISTERED",
    SlurmNodeDrainedByOperator => "SLURM_NODE_DRAINED_BY_OPERATOR",
    MtcValidationTimeout => "MTC_VALIDATION_TIMEOUT",
    ReleaseHandbackRefused => "RELEASE_HANDBACK_REFUSED",
    FabricPortMapMissing => "FABRIC_PORT_MAP_MISSING",
    FabricFlipPartiallySimulated => "FABRIC_FLIP_PARTIALLY_SIMULATED",
    BackendVrfFlipFailed => "BACKEND_VRF_FLIP_FAILED",
    NvlinkMoveFailed => "NVLINK_MOVE_FAILED",
    NvlinkCustodyRefused => "NVLINK_CUSTODY_REFUSED",
    NvlinkDrift => "NVLINK_DRIFT",
    NovaUnavailable => "NOVA_UNAVAILABLE",
    NovaRequestRefused => "NOVA_REQUEST_REFUSED",
    NovaServerAmbiguous => "NOVA_SERVER_AMBIGUOUS",
    NovaServerFailed => "NOVA_SERVER_FAILED",
    NovaServerMissing => "NOVA_SERVER_MISSING",
    NovaBindingMissing => "NOVA_BINDING_MISSING",
    ImageRoleUnsupported => "IMAGE_ROLE_UNSUPPORTED",
    BurnInFailed => "BURN_IN_FAILED",
    BurnInCancelled => "BURN_IN_CANCELLED",
    BurnInJobLost => "BURN_IN_JOB_LOST",
    BurnInTimeout => "BURN_IN_TIMEOUT",
});

/// One row of the taxonomy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub code: FailureCode,
    pub meaning: &'static str,
    pub owner: TriageOwner,
    /// Re-running the same work may succeed with nothing fixed first (an
    /// outage, or a step that converges on a re-run); `false` needs a
    /// person to change something before a retry can help.
    pub retryable: bool,
}

impl FailureCode {
    /// Its row of the taxonomy: meaning, triage owner, retryable.
    pub const fn entry(self) -> Entry {
        use FailureCode as F;
        use TriageOwner as O;
        let (meaning, owner, retryable) = match self {
            F::IronicDriverMismatch => (
                "An Ironic power cycle was requested for a node that does not use the required \
                 ipmi driver: switch the node's Ironic driver before retrying.",
                O::BareMetal,
                false,
            ),
            F::IronicInspectionIpaImageNotFound => (
                "Ironic selected an IPA kernel or ramdisk path that was absent: compare the \
                 NetBox and Ironic cpu_arch, node-level deploy-image overrides, per-architecture \
                 conductor configuration and artifact presence on every conductor before \
                 retrying one node.",
                O::BareMetal,
                false,
            ),
            F::EnrollmentProofMissing => (
                "The device has no enrollment proof for its current infrastructure_ref \
                 (enrollment_validated_ref empty or different) when a customer-facing mutation \
                 re-read it: enrol the device again.",
                O::Operations,
                false,
            ),
            F::EnrollmentProofUnavailable => (
                "The enrollment proof could not be read (the API or the hub was unavailable): an \
                 outage, never an identity verdict.",
                O::FleetManager,
                true,
            ),
            F::SwitchVrfFlipFailed => (
                "The front-end VRF flip did not apply or verify on every switch (NVUE unreachable, \
                 the revision's apply failed, a port reads back in another VRF, or the in-progress \
                 latch could not be recorded before the first switch write): the ports did not \
                 all move, and the latch says Unknown if any switch was written. Re-run the flip.",
                O::Network,
                true,
            ),
            F::SwitchVrfLatchWriteFailed => (
                "A verified front-end VRF flip moved the ports but its latch write failed after \
                 retries: re-run the same flip job, which no-ops on the already-applied switch \
                 and writes the latch.",
                O::Network,
                true,
            ),
            F::BackendVrfLatchWriteFailed => (
                "A verified back-end VRF isolate or return moved the ports but its latch write \
                 failed after retries: re-run the same job, which converges and writes the \
                 latch.",
                O::Network,
                true,
            ),
            F::NvlinkLatchWriteFailed => (
                "A verified NVLink partition move whose latch write failed after retries: re-run \
                 the same move, which converges from live membership and records the latch.",
                O::NvlinkFabric,
                true,
            ),
            F::ReleaseBackendVrfLatchRefused => (
                "Release refused: the back-end VRF latch says the host's RoCE ports may still be \
                 in the maintenance VRF. Return them to the customer VRF first.",
                O::Network,
                false,
            ),
            F::IronicDeployFailed => (
                "Ironic-direct Image Node: the node reached deploy failed. The run fails closed \
                 and leaves the node as it is: read last_error, repair, then unimage it (a bound \
                 deploy failed node is admitted for that cleanup) before imaging again.",
                O::BareMetal,
                false,
            ),
            F::IronicFailureState => (
                "The node is in an Ironic failure state (clean failed, inspect failed, error, \
                 ...) that the workflow does not recover on its own: repair it in Ironic first.",
                O::BareMetal,
                false,
            ),
            F::IronicNodeInMaintenance => (
                "Image Node requires authoritative maintenance = false: the node is in \
                 maintenance in Ironic. Image Node never clears maintenance itself.",
                O::BareMetal,
                false,
            ),
            F::IronicNodeNotAvailable => (
                "The node is not in a provision state the workflow starts from (Image Node \
                 needs available; Unimage Node active, deploy failed or available), or is \
                 already deployed with another instance.",
                O::BareMetal,
                false,
            ),
            F::IronicStaleInstanceUuid => (
                "An idle available node still carries a prior instance_uuid (an undeploy that \
                 reached available without clearing its identity): it is rejected for cleanup \
                 rather than adopted. Run Unimage Node on it, then image again.",
                O::BareMetal,
                false,
            ),
            F::IronicInstanceMismatch => (
                "The node is deploying an instance this run did not mint: another deployment \
                 owns it. The run fails closed without touching it.",
                O::BareMetal,
                false,
            ),
            F::IronicCleaningFailed => (
                "Unimage Node: Ironic's cleaning after the teardown failed (clean failed). \
                 Read last_error and repair the node in Ironic.",
                O::BareMetal,
                false,
            ),
            F::IronicNodeNotFound => (
                "Ironic has no node for the device's infrastructure_ref (or name).",
                O::BareMetal,
                false,
            ),
            F::IronicUnavailable => (
                "Ironic (or Keystone) could not be reached or answered 5xx after the step's \
                 retries: an outage, re-run the job.",
                O::FleetManager,
                true,
            ),
            F::IronicRequestRefused => (
                "Ironic refused a request of the workflow (4xx other than a lock conflict): the \
                 message carries Ironic's own error.",
                O::BareMetal,
                false,
            ),
            F::IronicTimeout => (
                "The node did not reach the state the step waits for within \
                 workflow.step_timeout.",
                O::BareMetal,
                true,
            ),
            F::SiteNotConfigured => (
                "The workflow service has no configuration for the device's site (its Ironic \
                 endpoint, image and keys under workflow.sites.<site>).",
                O::FleetManager,
                false,
            ),
            F::WorkflowInternalError => (
                "The workflow service could not record the run's progress (its database was \
                 unavailable past the retries): re-run the job.",
                O::FleetManager,
                true,
            ),
            F::PlacementUnavailable => (
                "Placement (or Keystone) could not be reached or answered 5xx after the step's \
                 retries, or kept answering a generation conflict: an outage, clear or create \
                 the event again.",
                O::FleetManager,
                true,
            ),
            F::PlacementResourceProviderNotFound => (
                "Placement has no resource provider for the device's infrastructure_ref (its \
                 Ironic node uuid), or the device has no infrastructure_ref yet: the \
                 customer-ready trait cannot be removed or restored.",
                O::BareMetal,
                false,
            ),
            F::PlacementRequestRefused => (
                "Placement refused a trait write (4xx other than a generation conflict): the \
                 message carries Placement's own error.",
                O::BareMetal,
                false,
            ),
            F::HubUnavailable => (
                "The hub did not answer a hold, latch or proof command after the step's \
                 retries: an outage of the mesh, re-run the work.",
                O::FleetManager,
                true,
            ),
            F::ImpairmentHoldRefused => (
                "The hub refused the impairment hold: the device is gone, or it already \
                 carries another event's hold (one hold per device).",
                O::Operations,
                false,
            ),
            F::EnrollmentIdentityMismatch => (
                "The Ironic node Enrolment found is not the device's infrastructure_ref, or \
                 changed under the run: the identity is not trustworthy, nothing is proven \
                 (fix the device's infrastructure_ref or the node, then enrol again).",
                O::Operations,
                false,
            ),
            F::IronicInspectionFailed => (
                "Ironic's inspection of the node failed for a reason other than a missing \
                 agent image: last_error carries Ironic's own message.",
                O::BareMetal,
                false,
            ),
            F::ReleaseInventoryNotActive => (
                "The NetBox re-read immediately before a customer handoff found the device \
                 missing or not active (moved to rma, offline, ... after the job was admitted): \
                 nothing customer-facing was written by that step.",
                O::Operations,
                false,
            ),
            F::ReleaseNvlinkLatchRefused => (
                "The NVLink repair-partition latch read True or Unknown immediately before the \
                 hand-back: the GPUs are (or may be) in the repair partition; move them back \
                 and record it before releasing.",
                O::NvlinkFabric,
                false,
            ),
            F::ReleaseNotObserved => (
                "The hand-back was written (lease cleared, customer-ready trait added) and the \
                 hub did not derive available within workflow.step_timeout.",
                O::FleetManager,
                true,
            ),
            F::IronicLesseeUnexpected => (
                "The node is leased to a project other than the site's maintenance project \
                 (workflow.sites.<site>.openstack.maintenance_project_id): a hand-back clears \
                 only the maintenance lease.",
                O::Operations,
                false,
            ),
            F::MtcCustomerInstancePresent => (
                "Move to Test Cluster found the node bound to an instance the run did not \
                 create (a customer's) and the job has no force_reclaim: nothing was torn down.",
                O::Operations,
                false,
            ),
            F::SlurmUnavailable => (
                "slurmrestd could not be reached or answered 5xx after the step's retries: an \
                 outage, re-run the job.",
                O::FleetManager,
                true,
            ),
            F::SlurmRequestRefused => (
                "slurmrestd refused a node update, or accepted a RESUME that the next read \
                 shows did not take: slurmrestd's own error is in the message.",
                O::FleetManager,
                false,
            ),
            F::SlurmNodeUpdateUnsupported => (
                "SLURM holds the node (DRAIN, DOWN) for a reason the workflow owns, and the \
                 site's slurmrestd has no node update over REST (v0.0.38, SLURM 22.05): \
                 resume it with scontrol, or upgrade slurmrestd, and re-run.",
                O::FleetManager,
                false,
            ),
            F::SlurmNodeNotRegistered => (
                "SLURM did not list the node within workflow.step_timeout after it was \
                 imaged: slurmd did not register from the image.",
                O::BareMetal,
                true,
            ),
            F::SlurmNodeDrainedByOperator => (
                "SLURM holds the node (DRAIN, DOWN) for a reason the workflow does not own \
                 (an operator's): it is not resumed; clear it in SLURM and re-run.",
                O::Operations,
                false,
            ),
            F::MtcValidationTimeout => (
                "The node is adopted into SLURM and the hub did not derive validation \
                 (maintenance pool, SLURM registered and healthy) within workflow.step_timeout.",
                O::BareMetal,
                true,
            ),
            F::ReleaseHandbackRefused => (
                "The hub refused the Metal hand-back (delegate) on its own re-check with the \
                 device locked: inventory-only, another identity, a custody or impairment \
                 hold, failed or quarantined; its reason is in the message.",
                O::Operations,
                false,
            ),
            F::EnrollmentProofWriteRefused => (
                "The hub did not record the enrolled proof the run established (it refused \
                 the command, or its reply does not carry the proven reference).",
                O::FleetManager,
                false,
            ),
            F::FabricPortMapMissing => (
                "NetBox lists no cabled port of the device on the plane's configured switches \
                 (workflow.sites.<site>.fabric): there is nothing to flip. Fix the cabling \
                 records or the switch list.",
                O::Network,
                false,
            ),
            F::FabricFlipPartiallySimulated => (
                "Some of the device's switches are real and some simulated (the site's \
                 simulated_switches, or a back-end site without backend_vrf_flip_allowed): the \
                 real ones were written, the run verified only part of the ports, and the latch \
                 is left Unknown. Clear the switches for real writes, then re-run.",
                O::Network,
                false,
            ),
            F::BackendVrfFlipFailed => (
                "The back-end VRF isolate or return did not apply or verify on every switch \
                 (NVUE unreachable, the revision's apply failed, a port reads back in another \
                 VRF): the latch stays Unknown from the apply that began. Re-run the job.",
                O::Network,
                true,
            ),
            F::NetboxUnavailable => (
                "NetBox could not be read (unreachable, 5xx, or it refused the workflow's \
                 token) immediately before a customer hand-back, or to map a device to its \
                 switch ports (its cables): an outage, never an inventory verdict; re-run.",
                O::FleetManager,
                true,
            ),
            F::NvlinkMoveFailed => (
                "The NVLink repair-partition move or return did not complete: NMX-M could not be \
                 read or refused the partition update, its operation failed, or the read-back \
                 still misses GPUs of the host. Nothing is recorded as verified; a written \
                 MoveInProgress latch stays Unknown until a re-run records the membership.",
                O::NvlinkFabric,
                true,
            ),
            F::NvlinkCustodyRefused => (
                "The tray is in customer custody (delegated, pending_handover or Borneo \
                 GOOGLE_OWNED) at the move's custody check: no NMX-M write and no latch were \
                 made.",
                O::Operations,
                false,
            ),
            F::NvlinkDrift => (
                "The repair partition's membership changed between planning and the final \
                 drift check, again after a re-plan (another move in flight): nothing was \
                 written. Re-run when the other move is done.",
                O::NvlinkFabric,
                true,
            ),
            F::NovaUnavailable => (
                "Nova (or Keystone with the site's SLURM credential) could not be reached or \
                 answered 5xx after the step's retries: an outage, re-run the job.",
                O::FleetManager,
                true,
            ),
            F::NovaRequestRefused => (
                "Nova refused a request of the Nova arm (4xx: a policy, quota, image, flavour, \
                 network or keypair the site's configuration names that Nova does not accept): \
                 read the message and fix workflow.sites.<site>.nova.",
                O::BareMetal,
                false,
            ),
            F::NovaServerAmbiguous => (
                "Image Node, Nova arm: several servers of the SLURM project are named exactly as \
                 the node's host and Ironic has recorded no binding, so the run cannot tell which \
                 is its own. It fails closed without creating or deleting one: remove the extra \
                 servers, then re-run.",
                O::BareMetal,
                false,
            ),
            F::NovaServerFailed => (
                "Image Node, Nova arm: the node's server reached a terminal Nova state (ERROR, \
                 DELETED, SHUTOFF, ...) or is being deleted. The server is left as it is for \
                 diagnosis (its fault is in the message): unimage the node, then image it again.",
                O::BareMetal,
                false,
            ),
            F::NovaServerMissing => (
                "The node is bound (Ironic instance_uuid) to a server Nova does not have, or the \
                 run's own server vanished before it was active: the binding needs an \
                 operator's repair before Image or Unimage can act on it.",
                O::BareMetal,
                false,
            ),
            F::NovaBindingMissing => (
                "Unimage Node, Nova arm: the node has no instance_uuid but is not available, so \
                 there is no bound server to delete and Unimage never searches Nova by name: \
                 repair the node in Ironic.",
                O::BareMetal,
                false,
            ),
            F::ImageRoleUnsupported => (
                "Image Node, Nova arm: the device's class has no SLURM image and flavour \
                 (workflow.sites.<site>.nova.roles), or is a CPU hypervisor, whose undercloud \
                 routing is out of scope and rejected at runtime.",
                O::Operations,
                false,
            ),
            F::BurnInFailed => (
                "The burn-in's SLURM job ended without passing (FAILED, TIMEOUT, NODE_FAIL, \
                 OUT_OF_MEMORY, BOOT_FAIL, DEADLINE): the hardware test found a fault or could \
                 not run on the node. The SLURM state, reason and exit code are in the message.",
                O::BareMetal,
                false,
            ),
            F::BurnInCancelled => (
                "The burn-in's SLURM job was cancelled or preempted outside the fleet (scancel, \
                 an operator, a higher-priority job): nothing was tested, re-run.",
                O::Operations,
                true,
            ),
            F::BurnInJobLost => (
                "slurmrestd no longer lists the burn-in's SLURM job (slurmctld purged it, or \
                 its state was wiped) before the run read its result: re-run.",
                O::FleetManager,
                true,
            ),
            F::BurnInTimeout => (
                "The burn-in's SLURM job did not end within the stage's time_limit plus \
                 workflow.step_timeout (it stayed PENDING: the node is drained, down or busy).",
                O::Operations,
                true,
            ),
        };
        Entry {
            code: self,
            meaning,
            owner,
            retryable,
        }
    }
}

/// The whole taxonomy, in declaration order.
pub fn taxonomy() -> impl Iterator<Item = Entry> {
    FailureCode::ALL.iter().map(|c| c.entry())
}

#[cfg(test)]
mod tests {
    use super::*;
    use FailureCode as F;

    #[test]
    fn every_code_the_seed_names_is_in_the_taxonomy() {
        // seed 002 names these failure codes; each must parse.
        for code in [
            "IRONIC_DRIVER_MISMATCH",
            "IRONIC_INSPECTION_IPA_IMAGE_NOT_FOUND",
            "ENROLLMENT_PROOF_MISSING",
            "ENROLLMENT_PROOF_UNAVAILABLE",
            "SWITCH_VRF_FLIP_FAILED",
            "SWITCH_VRF_LATCH_WRITE_FAILED",
            "NVLINK_LATCH_WRITE_FAILED",
            "RELEASE_BACKEND_VRF_LATCH_REFUSED",
        ] {
            assert_eq!(F::parse(code).unwrap().as_str(), code);
        }
        assert_eq!(taxonomy().count(), F::ALL.len());
        assert!(taxonomy().all(|e| !e.meaning.is_empty()));
    }

    #[test]
    fn the_seeds_sentences_decide_owner_and_retry() {
        let cases = [
            // "a failed proof read is ENROLLMENT_PROOF_UNAVAILABLE instead —
            // retryable, owned by Fleet Manager"
            (
                F::EnrollmentProofUnavailable,
                TriageOwner::FleetManager,
                true,
            ),
            // "failing non-retryably with ENROLLMENT_PROOF_MISSING when proof is absent"
            (F::EnrollmentProofMissing, TriageOwner::Operations, false),
            // "the recovery is to re-run the same flip job, which no-ops on the
            // already-applied switch and writes the latch"
            (F::SwitchVrfLatchWriteFailed, TriageOwner::Network, true),
            // "re-run the same move, which converges from live membership and
            // records the latch"
            (F::NvlinkLatchWriteFailed, TriageOwner::NvlinkFabric, true),
            // "switch the node's Ironic driver before retrying"
            (F::IronicDriverMismatch, TriageOwner::BareMetal, false),
        ];
        for (code, owner, retryable) in cases {
            let e = code.entry();
            assert_eq!((e.owner, e.retryable), (owner, retryable), "{code}");
        }
    }
}
