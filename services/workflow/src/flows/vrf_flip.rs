//! The front-end and back-end VRF isolates and returns (seed 002, "Front-end
//! VRF custody latch contract", "Back-end VRF latch contract"): the plan is
//! the device's cabled ports from NetBox, pinned once; then each step reads
//! every planned port back from its switch (and the revision the run pinned
//! there), asks `fleet_domain::fabric_flip`, and writes at most once: the
//! in-progress `Unknown`, an NVUE revision, its staged ports, its apply, or
//! the verified latch.

use std::collections::BTreeMap;

use chrono::Utc;
use fleet_domain::eligibility::Workflow as Kind;
use fleet_domain::fabric_flip::{
    flip_next, plan, Direction, FlipNext, FlipPinned, Plane, RevState, SwitchMode, SwitchRead,
};
use fleet_domain::failure::FailureCode;
use fleet_latch::Latch;

use super::{latch_error, Carried, Run, StepOutcome, Taken};
use crate::activities::CallError;
use crate::fabric::fabric_error;
use crate::store::StepResult;
use crate::Workflow;

/// The key of the run's `FlipPinned` in `Carried.pinned`.
const FLIP: &str = "flip";

/// The plane and direction of a flip workflow.
pub(crate) fn flip_of(kind: Kind) -> Option<(Plane, Direction)> {
    Some(match kind {
        Kind::FrontendVrfIsolate => (Plane::Frontend, Direction::Isolate),
        Kind::FrontendVrfReturn => (Plane::Frontend, Direction::Return),
        Kind::BackendVrfIsolate => (Plane::Backend, Direction::Isolate),
        Kind::BackendVrfReturn => (Plane::Backend, Direction::Return),
        _ => return None,
    })
}

fn latch_of(plane: Plane) -> Latch {
    match plane {
        Plane::Frontend => Latch::FrontendVrf,
        Plane::Backend => Latch::BackendVrf,
    }
}

/// Per planned port, what this step read back (`leaf01:swp1`).
fn results(reads: &BTreeMap<String, SwitchRead>, p: &FlipPinned, target: &str) -> Vec<StepResult> {
    let mut out = vec![];
    for (switch, r) in reads {
        let revision = match (p.revisions.get(switch), &r.revision) {
            (Some(rev), Some(state)) => format!("; revision {rev} {state:?}"),
            _ => String::new(),
        };
        for (port, vrf) in &r.ports {
            let (read, applied) = match vrf {
                Ok(v) => (format!("reads back in {v}"), v == target),
                Err(e) => (format!("unresolved: {e}"), false),
            };
            out.push(StepResult {
                target: format!("{switch}:{port}"),
                detail: format!("{read}; target {target}{revision}"),
                applied,
                simulated: r.mode == SwitchMode::Simulated,
            });
        }
    }
    out
}

impl Workflow {
    pub(super) async fn vrf_flip(&self, r: &Run<'_>, carried: &mut Carried) -> StepOutcome {
        let Some((plane, direction)) = flip_of(r.kind) else {
            return Ok(Taken::Failed(
                FailureCode::WorkflowInternalError,
                format!("{} is not a VRF flip", r.kind),
            ));
        };
        let failed = plane.flip_failed();
        let device = r.device;
        let not_configured = |what: &str| {
            Ok(Taken::Failed(
                FailureCode::SiteNotConfigured,
                format!("workflow.sites.{}.fabric{what}", device.site_id),
            ))
        };
        let Some(site) = self.sites.get(&device.site_id) else {
            return not_configured(" is not configured");
        };
        let Some(fabric) = site.fabric.as_ref() else {
            return not_configured(" is not configured");
        };
        let switches = fabric.switches(plane);
        let (Some(netbox), false) = (fabric.netbox.as_ref(), switches.is_empty()) else {
            return not_configured(match plane {
                Plane::Frontend => " has no frontend_switches",
                Plane::Backend => " has no backend_switches",
            });
        };
        let target = match (plane, direction) {
            (Plane::Frontend, Direction::Isolate) => fabric.isolate_vrf.clone(),
            (Plane::Frontend, Direction::Return) => r.params.customer_vrf.clone(),
            (Plane::Backend, Direction::Isolate) => fabric.maintenance_vrf.clone(),
            (Plane::Backend, Direction::Return) => fabric.tenant_backend_vrf.clone(),
        };
        if target.is_empty() {
            return Ok(Taken::Failed(
                FailureCode::WorkflowInternalError,
                format!("{} has no target VRF for {}", r.kind, device.name),
            ));
        }
        let mut p: FlipPinned = carried.pinned_as(FLIP);

        // The plan: the device's cabled ports on the plane's switches.
        if p.plan.is_empty() {
            let links = netbox
                .device_links(
                    &fabric.netbox_site,
                    &device.name,
                    &fabric.switch_names(plane),
                )
                .await
                .map_err(|e| fabric_error(e, FailureCode::NetboxUnavailable))?;
            let ports: Vec<(String, String)> =
                links.into_iter().map(|l| (l.switch, l.port)).collect();
            return Ok(match plan(&device.name, &ports) {
                Ok(plan) => {
                    p.plan = plan;
                    carried.pin_as(FLIP, &p);
                    Taken::Step("planned")
                }
                Err((code, message)) => Taken::Failed(code, message),
            });
        }

        // One fresh read of every planned port, and of each revision the
        // run pinned.
        let simulate_all =
            r.job.options.simulate || (plane == Plane::Backend && !device.backend_vrf_flip_allowed);
        let mut reads = BTreeMap::new();
        for (switch, ports) in &p.plan {
            let Some(base) = switches.get(switch) else {
                return not_configured(&format!(
                    " no longer lists switch {switch} of the run's plan"
                ));
            };
            // The revision first: once it reads applied, the ports read
            // after it show what it applied.
            let revision = match p.revisions.get(switch) {
                None => None,
                Some(rev) => Some(
                    match fabric
                        .nvue
                        .revision_state(base, rev)
                        .await
                        .map_err(|e| fabric_error(e, failed))?
                    {
                        None => RevState::Gone,
                        Some(state) => RevState::parse(&state),
                    },
                ),
            };
            let interfaces = fabric
                .nvue
                .interfaces(base, "operational")
                .await
                .map_err(|e| fabric_error(e, failed))?;
            let mode = if simulate_all || fabric.simulated(switch) {
                SwitchMode::Simulated
            } else {
                SwitchMode::Real
            };
            let ports = ports
                .iter()
                .map(|port| {
                    let vrf =
                        fleet_fabric::nvue::port_vrf(&interfaces, port).map_err(|e| e.to_string());
                    (port.clone(), vrf)
                })
                .collect();
            reads.insert(
                switch.clone(),
                SwitchRead {
                    mode,
                    ports,
                    revision,
                },
            );
        }
        let observed_at = Utc::now();
        carried.results = results(&reads, &p, &target);
        let latch = latch_of(plane);
        let base = |switch: &str| {
            switches.get(switch).ok_or_else(|| {
                CallError::Permanent(
                    FailureCode::SiteNotConfigured,
                    format!("switch {switch} is not configured"),
                )
            })
        };
        Ok(match flip_next(plane, &reads, &p, &target) {
            FlipNext::WriteUnknown { switch } => {
                // Before the switch write it precedes: a failure here
                // moved no port.
                let what = switch.as_deref().unwrap_or("the device's switches");
                self.write_latch(
                    r,
                    latch,
                    plane.in_progress_reason(),
                    format!("{} to {target} in progress on {what}", r.kind),
                    Utc::now(),
                )
                .await
                .map_err(|e| latch_error(e, failed))?;
                p.unknown_written.insert(switch.unwrap_or_default());
                carried.pin_as(FLIP, &p);
                Taken::Step("unknown_written")
            }
            FlipNext::CreateRevision { switch } => {
                let rev = fabric
                    .nvue
                    .create_revision(base(&switch)?)
                    .await
                    .map_err(|e| fabric_error(e, failed))?;
                self.metrics.wrote("nvue", "revision");
                p.staged.remove(&switch);
                p.revisions.insert(switch, rev);
                carried.pin_as(FLIP, &p);
                Taken::Step("revision_created")
            }
            FlipNext::Stage {
                switch,
                revision,
                ports,
            } => {
                let vrfs: Vec<(String, String)> = ports
                    .into_iter()
                    .map(|port| (port, target.clone()))
                    .collect();
                fabric
                    .nvue
                    .stage_vrfs(base(&switch)?, &revision, &vrfs)
                    .await
                    .map_err(|e| fabric_error(e, failed))?;
                self.metrics.wrote("nvue", "stage");
                p.staged.insert(switch);
                carried.pin_as(FLIP, &p);
                Taken::Step("ports_staged")
            }
            FlipNext::Apply { switch, revision } => {
                fabric
                    .nvue
                    .apply(base(&switch)?, &revision)
                    .await
                    .map_err(|e| fabric_error(e, failed))?;
                self.metrics.wrote("nvue", "apply");
                p.apply_requested.insert(switch);
                carried.pin_as(FLIP, &p);
                Taken::Step("apply_requested")
            }
            FlipNext::Wait => Taken::Wait,
            FlipNext::WriteVerified => {
                let ports: Vec<String> = carried.results.iter().map(|x| x.target.clone()).collect();
                self.write_latch(
                    r,
                    latch,
                    plane.verified_reason(direction),
                    format!("{} read back in {target}", ports.join(", ")),
                    observed_at,
                )
                .await
                .map_err(|e| latch_error(e, latch.failure_code()))?;
                p.latch_written = true;
                carried.pin_as(FLIP, &p);
                Taken::Step("latch_written")
            }
            FlipNext::Done => Taken::Done,
            FlipNext::Fail(code, message) => Taken::Failed(code, message),
        })
    }
}
