//! Image Node and Unimage Node, Ironic-direct arm (seed 002, ADR-0042):
//! each step reads the node, asks `fleet_domain::ironic_direct`, and writes
//! at most once.

use fleet_domain::eligibility::Workflow as Kind;
use fleet_domain::ironic_direct::{image_next, unimage_next, Next, NodeView};
use fleet_openstack::ironic::Node;
use serde_json::json;

use super::{not_configured, Carried, Run, StepOutcome, Taken};
use crate::activities::mint_instance_uuid;
use crate::Workflow;

/// The `instance_uuid` the run minted or recovered.
const INSTANCE_UUID: &str = "instance_uuid";

/// The node as `fleet_domain::ironic_direct` decides from it.
pub(super) fn node_view(node: &Node) -> NodeView<'_> {
    NodeView {
        uuid: &node.uuid,
        provision_state: node.provision_state.as_deref().unwrap_or(""),
        target_provision_state: node.target_provision_state.as_deref().unwrap_or(""),
        maintenance: node.maintenance,
        instance_uuid: node.instance_uuid.as_deref().filter(|u| !u.is_empty()),
        last_error: node.last_error.as_deref(),
    }
}

impl Workflow {
    pub(super) async fn ironic_direct(&self, r: &Run<'_>, carried: &mut Carried) -> StepOutcome {
        let device = r.device;
        let site = self.site_of(device)?;
        if r.kind == Kind::ImageNode && site.config.image_source.trim().is_empty() {
            return Err(not_configured(
                &device.site_id,
                ".image_source",
                "the image Image Node deploys",
            ));
        }
        let ident = device.node_ident();
        let node = site.node(&ident).await?;
        let view = node_view(&node);
        let next = match r.kind {
            Kind::ImageNode => image_next(&view, carried.pinned_str(INSTANCE_UUID)),
            _ => unimage_next(&view),
        };
        Ok(match next {
            Next::Mint => {
                carried.pin(INSTANCE_UUID, mint_instance_uuid());
                Taken::Step("instance_uuid_minted")
            }
            Next::Adopt { instance_uuid } => {
                carried.pin(INSTANCE_UUID, instance_uuid);
                Taken::Step("binding_recovered")
            }
            Next::Bind => {
                let u = carried.pinned_str(INSTANCE_UUID).unwrap_or_default();
                site.patch(&node.uuid, &site.bind_ops(u)).await?;
                self.metrics.wrote("ironic", "bind");
                Taken::Step("bound")
            }
            Next::Provision { target } => {
                site.provision(&node.uuid, &site.provision_body(target))
                    .await?;
                self.metrics.wrote("ironic", target);
                Taken::Step(if target == "active" {
                    "deploy_requested"
                } else {
                    "teardown_requested"
                })
            }
            Next::ClearBinding { observed } => {
                // Guarded on a read of its own: still available, still
                // bound to what was observed, so a concurrent rebind is not
                // clobbered.
                let again = site.node(&node.uuid).await?;
                if again.provision_state.as_deref() != Some("available")
                    || again
                        .target_provision_state
                        .as_deref()
                        .is_some_and(|t| !t.is_empty())
                    || again.instance_uuid.as_deref() != Some(observed.as_str())
                {
                    return Ok(Taken::Wait);
                }
                let ops = json!([
                    {"op": "remove", "path": "/instance_uuid"},
                    {"op": "replace", "path": "/instance_info", "value": {}},
                ]);
                site.patch(&node.uuid, &ops).await?;
                self.metrics.wrote("ironic", "clear_binding");
                Taken::Step("binding_cleared")
            }
            Next::Wait => Taken::Wait,
            Next::Done => Taken::Done,
            Next::Fail(code, message) => Taken::Failed(code, message),
        })
    }
}
