//! Release (seed 002): the internal Release waits for the hub's
//! `validation`; the fully managed hand-back to a customer pool clears the
//! maintenance lease and then adds the customer-ready trait, each write
//! preceded, with nothing in between, by a NetBox re-read requiring
//! `active`, a re-read of the enrollment proof bound to the node it
//! resolved, and a re-read of the NVLink and back-end partition latches
//! (`fleet_domain::release`).

use fleet_domain::failure::FailureCode;
use fleet_domain::release::{self, handoff_verdict, r1_next, Handoff, Path, R1Next, R1Read};
use fleet_domain::{ConditionStatus, OperationalStatus};
use fleet_proto::v1;
use serde_json::json;

use super::{Run, StepOutcome, Taken};
use crate::activities::CallError;
use crate::store;
use crate::Workflow;

/// A latch row's status.
fn status(s: Option<&str>) -> Option<ConditionStatus> {
    s.and_then(|s| ConditionStatus::parse(s).ok())
}

impl Workflow {
    pub(super) async fn release(&self, r: &Run<'_>) -> StepOutcome {
        let o = r.job.options.0;
        let path = match release::path(o.release_to_customer_pool, o.engagement_mode) {
            Ok(p) => p,
            Err(m) => return Ok(Taken::Failed(FailureCode::WorkflowInternalError, m)),
        };
        match path {
            // "internal Release (release_to_customer_pool=false) returns to
            // no customer": done once the hub has the device validated in
            // the maintenance pool.
            Path::Internal => {
                let p = self.preflight(&r.device.id).await?;
                Ok(
                    if p.operational_status == OperationalStatus::Validation.as_str() {
                        Taken::Done
                    } else {
                        Taken::WaitHub
                    },
                )
            }
            Path::FullyManagedPool => self.hand_back(r).await,
            Path::MetalPool => self.metal_hand_back(r).await,
        }
    }

    /// The Metal hand-back: NetBox re-read, both latches re-read, then the
    /// hub's `delegate`, which re-checks them with the device locked. A
    /// hub refusal is explained by a fresh latch read when a latch turned,
    /// else `RELEASE_HANDBACK_REFUSED` with the hub's reason.
    async fn metal_hand_back(&self, r: &Run<'_>) -> StepOutcome {
        let p = self.preflight(&r.device.id).await?;
        if p.operational_status == OperationalStatus::Delegated.as_str() {
            return Ok(Taken::Done);
        }
        let netbox_status = self.netbox_status(r).await?;
        let latches = |p: &store::Preflight| {
            (
                status(p.nvlink_latch.as_deref()),
                status(p.backend_latch.as_deref()),
            )
        };
        let (nvlink, backend) = latches(&p);
        release::metal_verdict(netbox_status.as_deref(), nvlink, backend)
            .map_err(|(code, message)| CallError::Permanent(code, message))?;
        let actor = format!("workflow:release:{}", r.job.id);
        let c = v1::hub_command::Command::Delegate(v1::Delegate {
            device_id: r.device.id.clone(),
            pinned_infrastructure_ref: p.infrastructure_ref.clone().unwrap_or_default(),
            netbox_status: netbox_status.unwrap_or_default(),
            job_id: r.job.id.clone(),
        });
        let refused = match self.hub.call(&actor, 0, c).await {
            Ok(applied) => {
                let d = applied
                    .device()
                    .map_err(|e| CallError::from_hub(e, FailureCode::ReleaseHandbackRefused))?;
                if d.operational_status != OperationalStatus::Delegated.as_str() {
                    return Err(CallError::Permanent(
                        FailureCode::ReleaseHandbackRefused,
                        format!(
                            "the hub answered the hand-back with operational_status {:?}, not delegated",
                            d.operational_status
                        ),
                    ));
                }
                self.metrics.wrote("hub", "delegate");
                return Ok(Taken::Done);
            }
            Err(e) => CallError::from_hub(e, FailureCode::ReleaseHandbackRefused),
        };
        if let CallError::Permanent(..) = refused {
            let (nvlink, backend) = latches(&self.preflight(&r.device.id).await?);
            release::latch_verdict(nvlink, backend)
                .map_err(|(code, message)| CallError::Permanent(code, message))?;
        }
        Err(refused)
    }

    /// The device's proof, latches and status as the hub last wrote them.
    pub(super) async fn preflight(&self, device: &str) -> Result<store::Preflight, CallError> {
        // "a failed proof read is ENROLLMENT_PROOF_UNAVAILABLE instead ...
        // so an API outage never reads as an identity verdict".
        match store::preflight(&self.deps.pool, device).await {
            Ok(Some(p)) => Ok(p),
            Ok(None) => Err(CallError::Permanent(
                FailureCode::EnrollmentProofMissing,
                format!("device {device} no longer exists"),
            )),
            Err(e) => Err(CallError::Transient(
                FailureCode::EnrollmentProofUnavailable,
                format!("the proof and latches could not be read: {e}"),
            )),
        }
    }

    async fn hand_back(&self, r: &Run<'_>) -> StepOutcome {
        let device = r.device;
        let site = self.site_of(device)?;
        let ident = device.node_ident();
        let node = site.node(&ident).await?;
        let trait_name = self.config.customer_ready_trait.trim();
        let placement = device.placement_enabled;
        let trait_present = site.has_trait(&node.uuid, placement, trait_name).await?;
        let p = self.preflight(&device.id).await?;
        let read = R1Read {
            node: &node.uuid,
            provision_state: node.provision_state.as_deref().unwrap_or(""),
            target_provision_state: node.target_provision_state.as_deref().unwrap_or(""),
            instance_uuid: node.instance_uuid.as_deref().filter(|u| !u.is_empty()),
            lessee: node.lessee.as_deref(),
            maintenance_project: site.config.openstack.maintenance_project_id.trim(),
            trait_present,
            operational_status: OperationalStatus::parse(&p.operational_status)
                .unwrap_or(OperationalStatus::Unknown),
        };
        Ok(match r1_next(&read) {
            R1Next::ClearLessee => {
                self.handoff_checks(r, &node.uuid).await?;
                site.patch(&node.uuid, &json!([{"op": "remove", "path": "/lessee"}]))
                    .await?;
                self.metrics.wrote("ironic", "clear_lessee");
                Taken::Step("maintenance_lease_cleared")
            }
            R1Next::AddTrait => {
                self.handoff_checks(r, &node.uuid).await?;
                site.add_trait(&node.uuid, placement, trait_name).await?;
                self.metrics.wrote(
                    if placement { "placement" } else { "ironic" },
                    "add_customer_ready_trait",
                );
                Taken::Step("customer_ready_trait_added")
            }
            R1Next::WaitAvailable => Taken::WaitHub,
            R1Next::Done => Taken::Done,
            R1Next::Fail(code, message) => Taken::Failed(code, message),
        })
    }

    /// The checks of a customer-facing step, immediately before its write:
    /// NetBox re-read, then the proof and the latches re-read, then the
    /// verdict (nothing waits between them and the write).
    async fn handoff_checks(&self, r: &Run<'_>, resolved: &str) -> Result<(), CallError> {
        let netbox_status = self.netbox_status(r).await?;
        let p = self.preflight(&r.device.id).await?;
        let h = Handoff {
            netbox_status: netbox_status.as_deref(),
            infrastructure_ref: p.infrastructure_ref.as_deref(),
            enrollment_validated_ref: p.enrollment_validated_ref.as_deref(),
            resolved_node: resolved,
            nvlink_latch: status(p.nvlink_latch.as_deref()),
            backend_latch: status(p.backend_latch.as_deref()),
        };
        handoff_verdict(&h).map_err(|(code, message)| CallError::Permanent(code, message))
    }

    /// NetBox's status of the device now: `None` when NetBox has no such
    /// device (or the device has no NetBox id to look it up by).
    async fn netbox_status(&self, r: &Run<'_>) -> Result<Option<String>, CallError> {
        let Some(netbox) = &self.netbox else {
            return Err(CallError::Permanent(
                FailureCode::SiteNotConfigured,
                "workflow.netbox.url is not configured: a hand-back must re-read NetBox".into(),
            ));
        };
        let Some(id) = r.device.netbox_id else {
            return Ok(None);
        };
        netbox.device_status(id).await
    }
}
