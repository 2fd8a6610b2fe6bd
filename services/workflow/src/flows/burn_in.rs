//! Burn-in (`single_node_test`, `multi_node_test`, `fleet_domain::burn_in`):
//! the stage's hardware test is submitted as a SLURM batch job pinned to the
//! device's node, and each step reads the job back from slurmrestd until it
//! ends. The job's id and its last state are pinned on the run (workflow-
//! scoped, never on the device); the job's name is the same on every
//! attempt, so a run resumed after a crash between the submission and its
//! commit adopts the job it submitted instead of submitting another.

use std::time::Duration;

use chrono::{DateTime, Utc};
use fleet_domain::burn_in::{job_name, node_constraint, verdict, Verdict};
use fleet_domain::eligibility::Workflow as Kind;
use fleet_domain::failure::FailureCode;
use fleet_slurm::{Job, Submission};

use super::{not_configured, Carried, Run, StepOutcome, Taken};
use crate::activities::{slurm_error, CallError};
use crate::config::StageTest;
use crate::store::StepResult;
use crate::Workflow;

const JOB_ID: &str = "slurm_job_id";
const JOB_STATE: &str = "slurm_job_state";
const SUBMITTED_AT: &str = "submitted_at";

/// What is added to a test's queue timeout and time limit before the run
/// gives up on the job itself (slurmctld ends it `TIMEOUT` first).
const GRACE: Duration = Duration::from_secs(300);

impl Workflow {
    pub(super) async fn burn_in(&self, r: &Run<'_>, carried: &mut Carried) -> StepOutcome {
        let device = r.device;
        let site = self.site_of(device)?;
        let b = &site.config.burn_in;
        let (stage, test) = match r.kind {
            Kind::MultiNodeTest => ("multi_node_test", &b.multi_node_test),
            _ => ("single_node_test", &b.single_node_test),
        };
        let Some(slurm) = &site.slurm else {
            return Err(not_configured(
                &device.site_id,
                ".slurm",
                "the burn-in runs as a SLURM job",
            ));
        };
        // The run may wait as long as the queue and the test may take.
        let limit = b.queue_timeout + test.time_limit + GRACE;
        carried.wait_limit = Some(limit);
        carried.timeout_code = Some(FailureCode::BurnInTimeout);
        let name = job_name(stage, &r.job.id, &device.id);
        let mut slurm = slurm.lock().await;

        let Some(id) = pinned_job(carried) else {
            // Not submitted, or submitted by an attempt that died before
            // its commit: adopt that job if slurmctld still has it.
            if let Some(found) = slurm.jobs_named(&name).await.map_err(slurm_error)?.first() {
                carried.pin(JOB_ID, found.job_id.to_string());
                carried.pin(SUBMITTED_AT, Utc::now().to_rfc3339());
                return Ok(Taken::Step("burn_in_job_recovered"));
            }
            if test.script.trim().is_empty() {
                return Err(not_configured(
                    &device.site_id,
                    &format!(".burn_in.{stage}.script"),
                    "the hardware test the stage runs",
                ));
            }
            let constraint = node_constraint(&b.node_feature, &device.name)
                .map_err(|m| CallError::Permanent(FailureCode::SiteNotConfigured, m))?;
            let job = submission(
                r,
                stage,
                test,
                &b.working_directory,
                &b.path,
                name,
                constraint,
            );
            let id = slurm.submit_job(&job).await.map_err(slurm_error)?;
            self.metrics.wrote("slurm", "submit_burn_in");
            tracing::info!(job_id = %r.job.id, device_id = %device.id, slurm_job_id = id, stage, "burn-in submitted");
            carried.pin(JOB_ID, id.to_string());
            carried.pin(SUBMITTED_AT, Utc::now().to_rfc3339());
            return Ok(Taken::Step("burn_in_submitted"));
        };

        let Some(job) = slurm.job(id).await.map_err(slurm_error)? else {
            return Ok(Taken::Failed(
                FailureCode::BurnInJobLost,
                format!(
                    "slurmctld no longer knows SLURM job {id} of device {}",
                    device.name
                ),
            ));
        };
        carried.results = vec![result(&job)];
        let state = job.job_state.join("+");
        let outcome = match verdict(&job.job_state, job.exit_code, &job.state_reason) {
            Verdict::Passed => Taken::Done,
            Verdict::Failed(code, message) => Taken::Failed(code, message),
            Verdict::Waiting if outlived(carried, limit) => {
                cancel(&mut slurm, id).await;
                Taken::Failed(
                    FailureCode::BurnInTimeout,
                    format!(
                        "SLURM job {id} of device {} was still {state} after {} s; it was cancelled",
                        device.name,
                        limit.as_secs()
                    ),
                )
            }
            Verdict::Waiting if carried.pinned_str(JOB_STATE) != Some(state.as_str()) => {
                carried.pin(JOB_STATE, state.clone());
                Taken::Step(match job.job_state.first().map(String::as_str) {
                    Some("PENDING") => "burn_in_pending",
                    Some("RUNNING") => "burn_in_running",
                    _ => "burn_in_state_changed",
                })
            }
            Verdict::Waiting => Taken::Wait,
        };
        carried.pin(JOB_STATE, state);
        Ok(outcome)
    }

    /// A cancelled burn-in takes its SLURM job with it (best effort: the
    /// job runs out its time limit when slurmrestd is away).
    pub(super) async fn cancel_burn_in(&self, r: &Run<'_>, carried: &Carried) {
        let Some(id) = pinned_job(carried) else {
            return;
        };
        let Ok(site) = self.site_of(r.device) else {
            return;
        };
        if let Some(slurm) = &site.slurm {
            cancel(&mut *slurm.lock().await, id).await;
            self.metrics.wrote("slurm", "cancel_burn_in");
        }
    }
}

fn pinned_job(carried: &Carried) -> Option<u64> {
    carried.pinned_str(JOB_ID).and_then(|s| s.parse().ok())
}

/// Whether the job has been in SLURM longer than the run waits.
fn outlived(carried: &Carried, limit: Duration) -> bool {
    carried
        .pinned_str(SUBMITTED_AT)
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .and_then(|at| (Utc::now() - at.with_timezone(&Utc)).to_std().ok())
        .is_some_and(|waited| waited > limit)
}

async fn cancel(slurm: &mut fleet_slurm::Slurmrestd, id: u64) {
    if let Err(e) = slurm.cancel_job(id).await {
        tracing::warn!(slurm_job_id = id, error = %e, "the burn-in's SLURM job could not be cancelled");
    }
}

fn submission(
    r: &Run<'_>,
    stage: &str,
    test: &StageTest,
    cwd: &str,
    path: &str,
    name: String,
    constraints: String,
) -> Submission {
    let device = r.device;
    let environment = [
        ("PATH", path),
        ("FLEET_DEVICE_ID", device.id.as_str()),
        ("FLEET_DEVICE_NAME", device.name.as_str()),
        ("FLEET_JOB_ID", r.job.id.as_str()),
        ("FLEET_STAGE", stage),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Submission {
        name,
        script: test.script.clone(),
        constraints,
        nodes: "1".into(),
        time_limit: (test.time_limit.as_secs() / 60).max(1) as u32,
        partition: test.partition.trim().to_string(),
        comment: format!("fleet {stage} job {} device {}", r.job.id, device.id),
        current_working_directory: cwd.to_string(),
        environment,
    }
}

fn result(job: &Job) -> StepResult {
    let mut detail = format!("{} on {}", job.job_state.join("+"), job.nodes);
    if let Some(code) = job.exit_code {
        detail.push_str(&format!(", exit status {}", (code >> 8) & 0xff));
    }
    StepResult {
        target: format!("slurm:job/{}", job.job_id),
        detail,
        applied: matches!(job.job_state.first().map(String::as_str), Some("COMPLETED")),
        simulated: false,
    }
}
