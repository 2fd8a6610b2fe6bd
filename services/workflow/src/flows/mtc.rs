//! Move to Test Cluster (`fleet_domain::mtc`): the customer-ready trait
//! removed (Placement's at a site with Nova and Placement, the node's own at
//! a standalone one); a customer's instance torn down only with
//! `force_reclaim` (its Nova server deleted at a Nova site); the maintenance
//! (SLURM) lease; the SLURM image deployed (through Nova with the SLURM
//! credential, or Ironic-direct); the SLURM node resumed when drained for a
//! reason the workflow owns; then the hub's `validation`. The enrollment
//! proof is re-read, bound to the resolved node, immediately before every
//! write after the cordon.

use fleet_domain::eligibility::proof_verdict;
use fleet_domain::failure::FailureCode;
use fleet_domain::ironic_direct::{image_next, Next};
use fleet_domain::mtc::{
    adopt_next, cordon_next, reclaim_next, Adopt, Cordon, NodeRead, Phase, Reclaim, SlurmRead,
};
use fleet_domain::OperationalStatus;
use serde_json::json;

use super::{not_configured, Carried, Run, StepOutcome, Taken};
use crate::activities::{bind_ops, mint_instance_uuid, slurm_error, CallError, Site};
use crate::Workflow;

const PHASE: &str = "phase";
const INSTANCE_UUID: &str = "instance_uuid";
const RECLAIM_REQUESTED: &str = "reclaim_requested";
const RESUME_REQUESTED: &str = "resume_requested";

impl Workflow {
    pub(super) async fn move_to_test_cluster(
        &self,
        r: &Run<'_>,
        carried: &mut Carried,
    ) -> StepOutcome {
        let device = r.device;
        let site = self.site_of(device)?;
        let ident = device.node_ident();
        let o = r.job.options.0;
        let phase = Phase::parse(carried.pinned_str(PHASE).unwrap_or(""));
        let node = site.node(&ident).await?;
        match phase {
            Phase::Cordon => {
                let name = self.config.customer_ready_trait.trim();
                let present = site
                    .has_trait(&node.uuid, device.placement_enabled, name)
                    .await?;
                Ok(match cordon_next(present, o.cordon_only) {
                    // The cordon is proof-exempt: "it removes the
                    // customer-ready trait without adopting".
                    Cordon::RemoveTrait => {
                        site.remove_trait(&node.uuid, device.placement_enabled, name)
                            .await?;
                        self.metrics.wrote("ironic", "remove_customer_ready_trait");
                        Taken::Step("customer_ready_trait_removed")
                    }
                    Cordon::Done => Taken::Done,
                    Cordon::Next(p) => {
                        carried.pin(PHASE, p.as_str());
                        Taken::Step("cordoned")
                    }
                })
            }
            Phase::Reclaim => {
                let read = NodeRead {
                    uuid: &node.uuid,
                    provision_state: node.provision_state.as_deref().unwrap_or(""),
                    target_provision_state: node.target_provision_state.as_deref().unwrap_or(""),
                    instance_uuid: node.instance_uuid.as_deref().filter(|u| !u.is_empty()),
                    maintenance: node.maintenance,
                };
                let requested = carried.pinned_flag(RECLAIM_REQUESTED);
                Ok(
                    match reclaim_next(
                        &read,
                        carried.pinned_str(INSTANCE_UUID),
                        o.force_reclaim,
                        requested,
                    ) {
                        Reclaim::TearDown => {
                            self.proof(r, &node.uuid).await?;
                            match read.instance_uuid {
                                // At a Nova site the customer's instance is a
                                // Nova server: deleting it tears the node down
                                // and keeps Nova in step.
                                Some(server) if device.placement_enabled => {
                                    site.delete_customer_server(server).await?;
                                    self.metrics.wrote("nova", "reclaim");
                                }
                                _ => {
                                    site.provision(&node.uuid, &json!({"target": "deleted"}))
                                        .await?;
                                    self.metrics.wrote("ironic", "reclaim");
                                }
                            }
                            carried.pin_flag(RECLAIM_REQUESTED);
                            Taken::Step("reclaim_requested")
                        }
                        Reclaim::Wait => Taken::Wait,
                        Reclaim::Next(p) => {
                            carried.pin(PHASE, p.as_str());
                            Taken::Step("reclaimed")
                        }
                        Reclaim::Fail(code, message) => Taken::Failed(code, message),
                    },
                )
            }
            Phase::Adopt => self.adopt(r, carried, &site, &node).await,
        }
    }

    /// "re-checks inside adopt_host_activity, just before the SLURM
    /// adoption": the proof, bound to the node, immediately before a write.
    pub(super) async fn proof(&self, r: &Run<'_>, resolved: &str) -> Result<(), CallError> {
        let p = self.preflight(&r.device.id).await?;
        proof_verdict(
            p.infrastructure_ref.as_deref(),
            p.enrollment_validated_ref.as_deref(),
            resolved,
        )
        .map_err(|(code, message)| CallError::Permanent(code, message))
    }

    async fn adopt(
        &self,
        r: &Run<'_>,
        carried: &mut Carried,
        site: &Site,
        node: &fleet_openstack::ironic::Node,
    ) -> StepOutcome {
        let device = r.device;
        // The maintenance (SLURM) lease first.
        let slurm_project = site.config.openstack.maintenance_project_id.trim();
        if slurm_project.is_empty() {
            return Err(not_configured(
                &device.site_id,
                ".openstack.maintenance_project_id",
                "the SLURM lease",
            ));
        }
        if node.lessee.as_deref() != Some(slurm_project) {
            self.proof(r, &node.uuid).await?;
            site.set_lessee(&node.uuid, slurm_project).await?;
            self.metrics.wrote("ironic", "lease_to_slurm");
            return Ok(Taken::Step("leased_to_slurm"));
        }
        // Then the SLURM image: through Nova at a site with Nova and
        // Placement, Ironic-direct at a standalone one.
        if device.placement_enabled {
            let role = match super::nova_arm::nova_role(site, device) {
                Ok(role) => role.clone(),
                Err((code, message)) => return Ok(Taken::Failed(code, message)),
            };
            if let Some(t) = self.nova_image(r, carried, site, node, &role, true).await? {
                return Ok(t);
            }
            return self.adopt_slurm(r, carried, site, node).await;
        }
        let image = site.config.slurm_image_source.trim();
        if image.is_empty() {
            return Err(not_configured(
                &device.site_id,
                ".slurm_image_source",
                "the image Move to Test Cluster deploys",
            ));
        }
        let view = super::ironic_direct::node_view(node);
        match image_next(&view, carried.pinned_str(INSTANCE_UUID)) {
            Next::Mint => {
                carried.pin(INSTANCE_UUID, mint_instance_uuid());
                return Ok(Taken::Step("instance_uuid_minted"));
            }
            Next::Adopt { instance_uuid } => {
                carried.pin(INSTANCE_UUID, instance_uuid);
                return Ok(Taken::Step("binding_recovered"));
            }
            Next::Bind => {
                self.proof(r, &node.uuid).await?;
                let u = carried.pinned_str(INSTANCE_UUID).unwrap_or_default();
                let ops = bind_ops(u, image, &site.config.slurm_image_checksum);
                site.patch(&node.uuid, &ops).await?;
                self.metrics.wrote("ironic", "bind");
                return Ok(Taken::Step("bound"));
            }
            Next::Provision { target } => {
                self.proof(r, &node.uuid).await?;
                site.provision(&node.uuid, &site.provision_body(target))
                    .await?;
                self.metrics.wrote("ironic", target);
                return Ok(Taken::Step("deploy_requested"));
            }
            Next::Wait => return Ok(Taken::Wait),
            Next::Fail(code, message) => return Ok(Taken::Failed(code, message)),
            Next::ClearBinding { .. } => {
                return Ok(Taken::Failed(
                    FailureCode::WorkflowInternalError,
                    "the Ironic-direct image asked to clear a binding".into(),
                ))
            }
            Next::Done => {}
        }
        self.adopt_slurm(r, carried, site, node).await
    }

    /// Deployed: the SLURM node, then the hub's validation.
    async fn adopt_slurm(
        &self,
        r: &Run<'_>,
        carried: &mut Carried,
        site: &Site,
        node: &fleet_openstack::ironic::Node,
    ) -> StepOutcome {
        let device = r.device;
        let Some(slurm) = &site.slurm else {
            return Err(not_configured(
                &device.site_id,
                ".slurm",
                "the adopt reads the SLURM node",
            ));
        };
        let mut slurm = slurm.lock().await;
        let listed = slurm.node(&device.name).await.map_err(slurm_error)?;
        let update_supported = slurm.node_update_supported().await.map_err(slurm_error)?;
        let status = crate::store::preflight(&self.deps.pool, &device.id)
            .await
            .ok()
            .flatten()
            .and_then(|p| OperationalStatus::parse(&p.operational_status).ok())
            .unwrap_or(OperationalStatus::Unknown);
        let read = SlurmRead {
            states: listed.as_ref().map(|n| n.reported()),
            reason: listed
                .as_ref()
                .and_then(|n| n.reason.as_deref())
                .unwrap_or(""),
            update_supported,
            operational_status: status,
        };
        let resumed = carried.pinned_flag(RESUME_REQUESTED);
        Ok(match adopt_next(&read, resumed) {
            Adopt::WaitRegistered => {
                carried.timeout_code = Some(FailureCode::SlurmNodeNotRegistered);
                Taken::Wait
            }
            Adopt::Resume => {
                self.proof(r, &node.uuid).await?;
                let body = json!({
                    "state": ["RESUME"],
                    "comment": format!("fleet:move_to_test_cluster:{}", r.job.id),
                });
                slurm
                    .update_node(&device.name, &body)
                    .await
                    .map_err(slurm_error)?;
                self.metrics.wrote("slurm", "resume");
                carried.pin_flag(RESUME_REQUESTED);
                Taken::Step("slurm_resume_requested")
            }
            Adopt::WaitValidation => {
                carried.timeout_code = Some(FailureCode::MtcValidationTimeout);
                Taken::WaitHub
            }
            Adopt::Done => Taken::Done,
            Adopt::Fail(code, message) => Taken::Failed(code, message),
        })
    }
}
