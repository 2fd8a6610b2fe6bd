//! The NVLink repair-partition move and return (seed 002, "NVLink
//! repair-partition latch contract"): each step re-reads the device's
//! custody (the custody check) and NMX-M's membership (and the operation the
//! run pinned), asks `fleet_domain::nvlink`, and writes at most once: the
//! `MoveInProgress` `Unknown`, one partition update, or the verified latch.

use chrono::Utc;
use fleet_domain::eligibility::Workflow as Kind;
use fleet_domain::failure::FailureCode;
use fleet_domain::nvlink::{
    custody_refusal, nv_next, Membership, NvDirection, NvNext, NvOperation, NvPinned, OpState,
    IN_PROGRESS_REASON,
};
use fleet_domain::OperationalStatus;
use fleet_fabric::nmx::{host_gpus, partition_named, partition_of};
use fleet_latch::Latch;

use super::{latch_error, Carried, Run, StepOutcome, Taken};
use crate::activities::CallError;
use crate::fabric::fabric_error;
use crate::store::{self, StepResult};
use crate::Workflow;

const NVLINK: &str = "nvlink";

impl Workflow {
    pub(super) async fn nvlink(&self, r: &Run<'_>, carried: &mut Carried) -> StepOutcome {
        let dir = match r.kind {
            Kind::NvlinkRepairReturn => NvDirection::Return,
            _ => NvDirection::Move,
        };
        let failed = FailureCode::NvlinkMoveFailed;
        let site_id = &r.device.site_id;
        let site = self.sites.get(site_id);
        let Some(fabric) = site.as_ref().and_then(|s| s.fabric.as_ref()) else {
            return Ok(Taken::Failed(
                FailureCode::SiteNotConfigured,
                format!("workflow.sites.{site_id}.fabric is not configured"),
            ));
        };
        let Some(nmx) = fabric.nmx.as_ref() else {
            return Ok(Taken::Failed(
                FailureCode::SiteNotConfigured,
                format!("workflow.sites.{site_id}.fabric has no nmx_url"),
            ));
        };
        let mut p: NvPinned = carried.pinned_as(NVLINK);
        // The custody check, on a fresh read of the device: before the
        // plan and again before every write.
        let device = store::device(&self.deps.pool, &r.device.id)
            .await
            .map_err(|e| {
                CallError::Transient(
                    FailureCode::WorkflowInternalError,
                    format!("reading the device: {e}"),
                )
            })?
            .ok_or_else(|| {
                CallError::Permanent(
                    FailureCode::WorkflowInternalError,
                    format!("device {} no longer exists", r.device.id),
                )
            })?;
        let status = OperationalStatus::parse(&device.operational_status)
            .unwrap_or(OperationalStatus::Unknown);
        let custody = custody_refusal(status, device.custody.as_deref());
        let (partitions, gpus, nodes) = nmx.lists().await.map_err(|e| fabric_error(e, failed))?;
        let m = Membership {
            partition_of: partition_of(&gpus),
            host_gpus: host_gpus(&nodes, &device.name),
            repair_id: partition_named(&partitions, &fabric.repair_partition),
        };
        let op = match &p.operation {
            None => None,
            Some(o) => Some(
                match nmx
                    .operation(&o.id)
                    .await
                    .map_err(|e| fabric_error(e, failed))?
                {
                    None => OpState::Gone,
                    Some(s) => OpState::parse(&s),
                },
            ),
        };
        let observed_at = Utc::now();
        let simulated = r.job.options.simulate;
        let host = m.host_gpus.clone().unwrap_or_default();
        let in_repair = host
            .iter()
            .filter(|g| {
                m.repair_id.is_some() && m.partition_of.get(*g).cloned().flatten() == m.repair_id
            })
            .count();
        let at_target = match dir {
            NvDirection::Move => !host.is_empty() && in_repair == host.len(),
            NvDirection::Return => in_repair == 0,
        };
        let detail = format!(
            "{in_repair} of {} GPU(s) of {} in {}",
            host.len(),
            device.name,
            fabric.repair_partition
        );
        carried.results = vec![StepResult {
            target: format!("nmx-m:{}", fabric.repair_partition),
            detail: detail.clone(),
            applied: at_target,
            simulated,
        }];
        let next = nv_next(
            dir,
            &device.name,
            custody.as_deref(),
            &m,
            op.as_ref(),
            &p,
            simulated,
        );
        Ok(match next {
            NvNext::Plan(plan) => {
                p.planned = Some(plan);
                carried.pin_as(NVLINK, &p);
                Taken::Step("planned")
            }
            NvNext::Replan(plan) => {
                tracing::info!(job_id = %r.job.id, device_id = %device.id, partition = %plan.partition, "repair partition membership moved since planning; re-planned");
                p.planned = Some(plan);
                p.replans += 1;
                carried.pin_as(NVLINK, &p);
                Taken::Step("replanned")
            }
            NvNext::WriteUnknown => {
                self.write_latch(
                    r,
                    Latch::NvlinkPartition,
                    IN_PROGRESS_REASON,
                    format!("{} in progress: {detail}", r.kind),
                    Utc::now(),
                )
                .await
                .map_err(|e| latch_error(e, failed))?;
                p.unknown_written = true;
                carried.pin_as(NVLINK, &p);
                Taken::Step("unknown_written")
            }
            NvNext::Put(plan) => {
                let id = nmx
                    .put_members(&plan.partition, &plan.members)
                    .await
                    .map_err(|e| fabric_error(e, failed))?;
                self.metrics.wrote("nmx", "partition_update");
                p.operation = Some(NvOperation {
                    partition: plan.partition,
                    id,
                });
                carried.pin_as(NVLINK, &p);
                Taken::Step("partition_update_requested")
            }
            NvNext::OperationDone => {
                p.operation = None;
                p.planned = None;
                carried.pin_as(NVLINK, &p);
                Taken::Step("partition_updated")
            }
            NvNext::Wait => Taken::Wait,
            NvNext::WriteVerified => {
                self.write_latch(
                    r,
                    Latch::NvlinkPartition,
                    dir.verified_reason(),
                    detail,
                    observed_at,
                )
                .await
                .map_err(|e| latch_error(e, Latch::NvlinkPartition.failure_code()))?;
                p.latch_written = true;
                carried.pin_as(NVLINK, &p);
                Taken::Step("latch_written")
            }
            NvNext::Done => Taken::Done,
            NvNext::Fail(code, message) => Taken::Failed(code, message),
        })
    }
}
