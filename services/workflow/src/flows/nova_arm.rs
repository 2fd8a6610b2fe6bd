//! Image Node and Unimage Node, Nova arm (seed 002): each step reads the
//! node from Ironic and its server from Nova, asks
//! `fleet_domain::nova_arm`, and writes at most once.

use fleet_domain::eligibility::Workflow as Kind;
use fleet_domain::failure::FailureCode;
use fleet_domain::nova_arm::{
    image_lookup, image_next, unimage_next, Found, Lookup, Next, NodeView, Projects, ServerView,
};
use fleet_openstack::ironic::Node;
use fleet_openstack::nova::{CreateServer, Server};

use super::{Carried, Run, StepOutcome, Taken};
use crate::activities::{CallError, Site};
use crate::config::RoleImage;
use crate::store::DeviceRow;
use crate::Workflow;

/// The server the run created, recovered or deletes (Nova's server id is
/// the node's `instance_uuid`).
const INSTANCE_UUID: &str = "instance_uuid";
/// Pinned before Unimage sends the delete.
const DELETING: &str = "deleting";

fn node_view(node: &Node) -> NodeView<'_> {
    NodeView {
        uuid: &node.uuid,
        provision_state: node.provision_state.as_deref().unwrap_or(""),
        target_provision_state: node.target_provision_state.as_deref().unwrap_or(""),
        maintenance: node.maintenance,
        instance_uuid: node.instance_uuid.as_deref().filter(|u| !u.is_empty()),
        lessee: node.lessee.as_deref(),
        last_error: node.last_error.as_deref(),
    }
}

fn view(s: &Server) -> ServerView<'_> {
    ServerView {
        id: &s.id,
        status: &s.status,
        deleting: s.task_state.as_deref() == Some("deleting"),
        fault: s.fault.as_ref().map(|f| f.message.as_str()),
    }
}

/// The SLURM image and flavour of the device's class ("the configured
/// per-role SLURM image and flavour"); "Undercloud/CPU-hypervisor routing
/// remains out of scope and is rejected at runtime."
pub(super) fn nova_role<'a>(
    site: &'a Site,
    device: &DeviceRow,
) -> Result<&'a RoleImage, (FailureCode, String)> {
    let class = device.device_class.as_str();
    let role = match class {
        "cpu_hypervisor" | "switch" => None,
        c => site.config.nova.roles.get(c),
    };
    role.ok_or_else(|| {
        (
            FailureCode::ImageRoleUnsupported,
            format!(
                "device {} is a {class}: workflow.sites.{}.nova.roles has no SLURM image for it{}",
                device.name,
                device.site_id,
                if class == "cpu_hypervisor" {
                    " (CPU-hypervisor routing is out of scope)"
                } else {
                    ""
                }
            ),
        )
    })
}

impl Workflow {
    pub(super) async fn nova_arm(&self, r: &Run<'_>, carried: &mut Carried) -> StepOutcome {
        let device = r.device;
        let not_configured = |what: String| Ok(Taken::Failed(FailureCode::SiteNotConfigured, what));
        let Some(site) = self.sites.get(&device.site_id) else {
            return not_configured(format!(
                "workflow.sites.{} is not configured",
                device.site_id
            ));
        };
        if !site.has_nova() {
            return not_configured(format!(
                "workflow.sites.{}.nova is not configured (the Nova arm of {})",
                device.site_id, r.kind
            ));
        }
        let nova = &site.config.nova;
        let projects = Projects {
            enrol: nova.enrol_project_id.trim(),
            slurm: site.config.openstack.maintenance_project_id.trim(),
        };
        let role = nova_role(&site, device);
        if r.kind == Kind::ImageNode {
            if let Err((code, message)) = &role {
                return Ok(Taken::Failed(*code, message.clone()));
            }
        }
        let ident = device.node_ident();
        let node = site.node(&ident).await?;
        let n = node_view(&node);
        if let (Kind::ImageNode, Ok(role)) = (r.kind, &role) {
            let role = (*role).clone();
            return Ok(self
                .nova_image(r, carried, &site, &node, &role, false)
                .await?
                .unwrap_or(Taken::Done));
        }
        let pinned = carried.pinned_str(INSTANCE_UUID).map(str::to_string);
        let pinned = pinned.as_deref();
        let server = match pinned {
            Some(id) => site.server(id).await?,
            None => None,
        };
        let intent = carried.pinned_str(DELETING).is_some();
        let next = unimage_next(
            &n,
            &projects,
            pinned,
            intent,
            server.as_ref().map(view).as_ref(),
        );
        Ok(match next {
            Next::MoveLease { to } => {
                site.set_lessee(&node.uuid, &to).await?;
                self.metrics.wrote("ironic", "lease");
                Taken::Step("lease_returned")
            }
            Next::Adopt { server_id } => {
                carried.pin(INSTANCE_UUID, server_id);
                Taken::Step("binding_read")
            }
            Next::IntendDelete => {
                carried.pin(DELETING, "true");
                Taken::Step("delete_intended")
            }
            Next::Delete { server_id } => {
                site.delete_server(&server_id).await?;
                self.metrics.wrote("nova", "delete");
                Taken::Step("delete_requested")
            }
            Next::Wait => Taken::Wait,
            Next::Done => Taken::Done,
            Next::Fail(code, message) => Taken::Failed(code, message),
            Next::Create => Taken::Failed(
                FailureCode::WorkflowInternalError,
                "unimage asked to create a server".into(),
            ),
        })
    }

    /// One step of imaging `node` through Nova with `role`'s SLURM image
    /// (Image Node; Move to Test Cluster's adopt at a Nova site, which
    /// passes `proof` to re-check the enrollment proof immediately before
    /// each write). `None` once the node runs the image.
    pub(super) async fn nova_image(
        &self,
        r: &Run<'_>,
        carried: &mut Carried,
        site: &Site,
        node: &Node,
        role: &RoleImage,
        proof: bool,
    ) -> Result<Option<Taken>, CallError> {
        let device = r.device;
        let nova = &site.config.nova;
        let projects = Projects {
            enrol: nova.enrol_project_id.trim(),
            slurm: site.config.openstack.maintenance_project_id.trim(),
        };
        let n = node_view(node);
        let pinned = carried.pinned_str(INSTANCE_UUID).map(str::to_string);
        let pinned = pinned.as_deref();
        let next = match image_lookup(&n, pinned) {
            Lookup::ById(id) => {
                let s = site.server(&id).await?;
                image_next(&n, &projects, pinned, &Found::Server(s.as_ref().map(view)))
            }
            Lookup::ByName => {
                let named = site.servers_named(&device.name).await?;
                let found = Found::Named(named.iter().map(view).collect());
                image_next(&n, &projects, pinned, &found)
            }
        };
        let writes = matches!(next, Next::MoveLease { .. } | Next::Create);
        if writes && proof {
            self.proof(r, &node.uuid).await?;
        }
        Ok(Some(match next {
            Next::MoveLease { to } => {
                site.set_lessee(&node.uuid, &to).await?;
                self.metrics.wrote("ironic", "lease");
                Taken::Step("leased_to_slurm")
            }
            Next::Create => {
                let id = site
                    .create_server(&CreateServer {
                        name: &device.name,
                        image: &role.image,
                        flavor: &role.flavor,
                        network: &nova.network_id,
                        key_name: &nova.key_name,
                        node: &node.uuid,
                    })
                    .await?;
                self.metrics.wrote("nova", "create");
                carried.pin(INSTANCE_UUID, id);
                Taken::Step("server_created")
            }
            Next::Adopt { server_id } => {
                carried.pin(INSTANCE_UUID, server_id);
                Taken::Step("server_recovered")
            }
            Next::Wait => Taken::Wait,
            Next::Done => return Ok(None),
            Next::Fail(code, message) => Taken::Failed(code, message),
            Next::IntendDelete | Next::Delete { .. } => Taken::Failed(
                FailureCode::WorkflowInternalError,
                "image asked to delete a server".into(),
            ),
        }))
    }
}
