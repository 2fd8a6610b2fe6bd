//! The handover's front-end flips, as jobs of the workflow service: a
//! handover asks for the device's front-end port in its customer VRF
//! (`frontend_vrf_return` with `params[device].customer_vrf`), a partner
//! return for it back out (`frontend_vrf_isolate`). The workflow service
//! plans the port from the simulated NetBox's cables, moves it through the
//! simulated leaf's NVUE revisions, reads it back and records the
//! `FrontendPortsInCustomerVrf` latch through the hub; only once its job
//! has succeeded does the engine move custody, so the partner reports
//! `GOOGLE_OWNED` only after the verified flip is on record: a proper
//! handover, no `HandoverBreach`. The harness writes no latch itself.
//!
//! "Simulated" in the job's sense (its `simulate` option, which writes
//! nothing) is not `fleet dev`'s simulation: a simulated switch that
//! applied and read back is a verified real flip.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fleet_proto::v1;
use fleet_workflow_client::WorkflowClient;

use crate::dev::engine::{FlipJob, FrontendLatch};
use crate::dev::servers::Shared;

/// Devices flipped per round, so a large initial backlog does not flood
/// the workflow service or hold the scenario lock for long.
const PER_ROUND: usize = 64;

/// A job in flight and the flips it carries, by device id.
struct InFlight {
    job_id: String,
    flips: HashMap<String, FlipJob>,
}

pub struct Flips {
    pub scenario: Shared,
    /// To find the hub's device ids, and to leave alone devices NetBox has
    /// not brought in yet.
    pub pool: sqlx::PgPool,
    pub workflow: WorkflowClient,
    pub paused: Arc<AtomicBool>,
    /// The scenario is held (its evolution, handovers included).
    pub held: Arc<AtomicBool>,
    /// True while a round is in progress or a flip job is in flight (a
    /// pause waits for both).
    pub busy: Arc<AtomicBool>,
}

impl Flips {
    /// Runs until aborted.
    pub async fn run(self) {
        let mut in_flight: Vec<InFlight> = Vec::new();
        let mut every = tokio::time::interval(Duration::from_millis(250));
        loop {
            every.tick().await;
            self.busy.store(true, Ordering::SeqCst);
            // Jobs in flight are always settled: their switch writes and
            // latches are happening whatever the scenario does, and the
            // ground truth must record them. Only new flips stop.
            self.settle(&mut in_flight).await;
            let stopped = self.paused.load(Ordering::SeqCst) || self.held.load(Ordering::SeqCst);
            if !stopped {
                self.round(&mut in_flight).await;
            }
            // A pause waits until no flip is in flight.
            self.busy.store(!in_flight.is_empty(), Ordering::SeqCst);
        }
    }

    fn scenario(&self) -> std::sync::MutexGuard<'_, crate::dev::Scenario> {
        self.scenario.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Jobs that ended: custody moves for each device that succeeded; a
    /// device that failed is asked for again next round. A job the storm
    /// guard holds is confirmed, as the operator running the partner's
    /// returns would.
    async fn settle(&self, in_flight: &mut Vec<InFlight>) {
        let mut still = Vec::new();
        for f in in_flight.drain(..) {
            let job = match self.workflow.get_job(&f.job_id).await {
                Ok(j) => j,
                Err(e) => {
                    tracing::debug!(job_id = %f.job_id, error = %e, "flip job not read; next round");
                    still.push(f);
                    continue;
                }
            };
            if job
                .storm_guard
                .as_ref()
                .is_some_and(|g| g.awaiting_confirmation)
            {
                let r = v1::ConfirmRequest {
                    id: job.id.clone(),
                    confirmed_by: "fleet-dev".into(),
                    reason: "fleet dev: the simulated partner's handovers and returns".into(),
                };
                if let Err(e) = self.workflow.confirm_job(&r).await {
                    tracing::warn!(job_id = %job.id, error = %e, "confirming a held flip job");
                }
            }
            if matches!(job.status.as_str(), "pending" | "running") {
                still.push(f);
                continue;
            }
            let mut s = self.scenario();
            for d in &job.devices {
                let Some(flip) = f.flips.get(&d.device_id) else {
                    continue;
                };
                if d.status == "succeeded" {
                    s.flip_recorded(flip);
                } else {
                    tracing::debug!(device = %flip.name, job_id = %job.id, failure_code = %d.failure_code, failure = %d.failure_message, "flip not recorded; asked for again");
                    s.flip_failed();
                }
            }
        }
        *in_flight = still;
    }

    /// New flips: one job per kind over up to `PER_ROUND` devices.
    async fn round(&self, in_flight: &mut Vec<InFlight>) {
        let busy: std::collections::BTreeSet<usize> = in_flight
            .iter()
            .flat_map(|f| f.flips.values().map(|j| j.index))
            .collect();
        let jobs: Vec<FlipJob> = self
            .scenario()
            .flip_jobs()
            .into_iter()
            .filter(|j| !busy.contains(&j.index))
            .collect();
        if jobs.is_empty() {
            return;
        }
        // Devices the hub knows, and, for a return, only once the hub has
        // the device in custody: a return flip recorded before the hub
        // applied the custody entry would make that entry a breach.
        let names: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
        let known: BTreeMap<(String, String), (String, String)> =
            match sqlx::query_as::<_, (String, String, String, String)>(
                "SELECT site_id, name, id, operational_status FROM devices \
                 WHERE name = ANY($1) AND deleted_at IS NULL",
            )
            .bind(&names)
            .fetch_all(&self.pool)
            .await
            {
                Ok(rows) => rows
                    .into_iter()
                    .map(|(s, n, id, o)| ((s, n), (id, o)))
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "handover flips cannot read devices");
                    return;
                }
            };
        let mut by_kind: BTreeMap<&'static str, Vec<(String, FlipJob)>> = BTreeMap::new();
        for j in jobs {
            let Some((id, status)) = known.get(&(j.site.clone(), j.name.clone())) else {
                continue;
            };
            let kind = match j.latch {
                FrontendLatch::CustomerVrfFlipVerified => "frontend_vrf_return",
                FrontendLatch::IsolateFlipVerified
                    if matches!(status.as_str(), "delegated" | "drained") =>
                {
                    "frontend_vrf_isolate"
                }
                _ => continue,
            };
            let v = by_kind.entry(kind).or_default();
            if v.len() < PER_ROUND {
                v.push((id.clone(), j));
            }
        }
        for (kind, flips) in by_kind {
            let params = if kind == "frontend_vrf_return" {
                flips
                    .iter()
                    .map(|(id, j)| {
                        (
                            id.clone(),
                            v1::DeviceParams {
                                customer_vrf: j.vrf.clone(),
                            },
                        )
                    })
                    .collect()
            } else {
                Default::default()
            };
            let r = v1::CreateJobRequest {
                workflow: kind.into(),
                device_ids: flips.iter().map(|(id, _)| id.clone()).collect(),
                created_by: "fleet-dev".into(),
                params,
                ..Default::default()
            };
            match self.workflow.create_job(&r).await {
                Ok(job) => in_flight.push(InFlight {
                    job_id: job.id,
                    flips: flips.into_iter().collect(),
                }),
                Err(e) => {
                    // Mostly a device still in another job, or the workflow
                    // service starting: the next round asks again.
                    tracing::debug!(workflow = kind, devices = r.device_ids.len(), error = %e, "flip job not created yet");
                    self.scenario().flip_failed();
                }
            }
        }
    }
}
