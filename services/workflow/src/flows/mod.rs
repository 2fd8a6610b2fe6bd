//! The run loop every workflow shares, and each workflow's step. A step is
//! one fresh read of the external system, one pure decision (in
//! `fleet_domain`), and at most one external write; the step's name, what
//! the run pinned and what it read back are committed before the next
//! step, so a worker killed anywhere resumes the device from a fresh read
//! and never repeats a write the system already shows.

pub(crate) mod burn_in;
pub(crate) mod enrolment;
pub(crate) mod ironic_direct;
pub(crate) mod mtc;
pub(crate) mod nova_arm;
pub(crate) mod nvlink;
pub(crate) mod release;
pub(crate) mod vrf_flip;

use std::time::{Duration, Instant};

use fleet_domain::eligibility::Workflow as Kind;
use fleet_domain::failure::FailureCode;
use serde_json::{Map, Value};

use crate::activities::CallError;
use crate::store::{self, DeviceRow, JobRow, Params, RunRow, StepResult};
use crate::worker::Outcome;
use crate::Workflow;

/// What a device's run works from.
pub(crate) struct Run<'a> {
    pub kind: Kind,
    pub job: &'a JobRow,
    pub device: &'a DeviceRow,
    pub params: &'a Params,
}

/// What a run carries from step to step, committed with each step.
#[derive(Debug, Default)]
pub(crate) struct Carried {
    /// Identities the run chose before writing them (an `instance_uuid`,
    /// a revision), so a resumed run writes the same ones.
    pub pinned: Map<String, Value>,
    /// What the run read back per target.
    pub results: Vec<StepResult>,
    /// The code a wait that outlasts `workflow.step_timeout` fails with,
    /// when the step knows better than the workflow's default (not kept).
    pub timeout_code: Option<FailureCode>,
    /// How long the step may wait, when longer than `workflow.step_timeout`
    /// (a burn-in waits for its queue and its test's time limit; not kept).
    pub wait_limit: Option<Duration>,
}

impl Carried {
    pub fn pinned_str(&self, key: &str) -> Option<&str> {
        self.pinned.get(key).and_then(Value::as_str)
    }

    pub fn pin(&mut self, key: &str, value: impl Into<String>) {
        self.pinned.insert(key.into(), Value::String(value.into()));
    }

    /// A wait that outlasted its time: the step's code, else the
    /// workflow's.
    fn timed_out(&self, kind: Kind, message: String) -> Outcome {
        Outcome::Failed(self.timeout_code.unwrap_or(timeout_code(kind)), message)
    }

    /// Whether `key` is pinned `true`.
    pub fn pinned_flag(&self, key: &str) -> bool {
        self.pinned.get(key) == Some(&Value::Bool(true))
    }

    pub fn pin_flag(&mut self, key: &str) {
        self.pinned.insert(key.into(), Value::Bool(true));
    }

    /// What the run pinned under `key` as a `T` (its default when nothing
    /// readable is pinned).
    pub fn pinned_as<T: serde::de::DeserializeOwned + Default>(&self, key: &str) -> T {
        self.pinned
            .get(key)
            .cloned()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default()
    }

    /// Pins `value` under `key`, as JSON.
    pub fn pin_as<T: serde::Serialize>(&mut self, key: &str, value: &T) {
        self.pinned.insert(
            key.into(),
            serde_json::to_value(value).unwrap_or(Value::Null),
        );
    }
}

/// What a step comes to: what it did, or the call that failed it.
pub(crate) type StepOutcome = Result<Taken, CallError>;

/// What one step did.
pub(crate) enum Taken {
    /// A step completed: record it and take the next.
    Step(&'static str),
    /// The external system is not there yet: read it again after the poll
    /// interval (until `workflow.step_timeout`).
    Wait,
    /// The hub has not derived what the run waits for: read again when a
    /// STATUS event of the device comes (or the backstop), until
    /// `workflow.step_timeout`.
    WaitHub,
    Done,
    Failed(FailureCode, String),
}

/// A run that cannot go on because `workflow.sites.<site><key>` is not
/// configured (`why` says what it is for, when that helps).
pub(super) fn not_configured(site: &str, key: &str, why: &str) -> CallError {
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" ({why})")
    };
    CallError::Permanent(
        FailureCode::SiteNotConfigured,
        format!("workflow.sites.{site}{key} is not configured{why}"),
    )
}

impl Workflow {
    /// The device's site as the workflow service is configured for it.
    pub(super) fn site_of(
        &self,
        device: &DeviceRow,
    ) -> Result<std::sync::Arc<crate::activities::Site>, CallError> {
        self.sites
            .get(&device.site_id)
            .ok_or_else(|| not_configured(&device.site_id, "", ""))
    }
}

/// The code a device fails with when a wait outlasts `workflow.step_timeout`.
fn timeout_code(kind: Kind) -> FailureCode {
    match kind {
        Kind::ImageNode | Kind::UnimageNode | Kind::Enrollment => FailureCode::IronicTimeout,
        Kind::Release => FailureCode::ReleaseNotObserved,
        Kind::FrontendVrfIsolate | Kind::FrontendVrfReturn => FailureCode::SwitchVrfFlipFailed,
        Kind::BackendVrfIsolate | Kind::BackendVrfReturn => FailureCode::BackendVrfFlipFailed,
        Kind::NvlinkRepairMove | Kind::NvlinkRepairReturn => FailureCode::NvlinkMoveFailed,
        Kind::SingleNodeTest | Kind::MultiNodeTest => FailureCode::BurnInTimeout,
        Kind::MoveToTestCluster => FailureCode::WorkflowInternalError,
    }
}

impl Workflow {
    /// Steps one device to a terminal outcome. `Err` only when PostgreSQL
    /// is away (nothing is decided without being recorded).
    pub(crate) async fn drive(&self, job: &JobRow, run: &RunRow) -> Result<Outcome, sqlx::Error> {
        let device_id = run.device_id.as_str();
        let kind = match Kind::parse(&job.workflow) {
            Ok(k) if crate::service::RUNS.contains(&k) => k,
            _ => {
                return Ok(Outcome::Failed(
                    FailureCode::WorkflowInternalError,
                    format!("workflow {} is not run by this build", job.workflow),
                ))
            }
        };
        let Some(device) = store::device(&self.deps.pool, device_id).await? else {
            return Ok(Outcome::Failed(
                FailureCode::IronicNodeNotFound,
                format!("device {device_id} no longer exists"),
            ));
        };
        let r = Run {
            kind,
            job,
            device: &device,
            params: &run.params,
        };
        let mut carried = Carried {
            pinned: run.pinned.as_object().cloned().unwrap_or_default(),
            results: run.results.0.clone(),
            timeout_code: None,
            wait_limit: None,
        };
        let woken = self.waits.register(device_id);
        let outcome = self.step_loop(&r, &mut carried, run.attempts, woken).await;
        self.waits.forget(device_id);
        outcome
    }

    async fn step_loop(
        &self,
        r: &Run<'_>,
        carried: &mut Carried,
        run_attempts: i32,
        woken: std::sync::Arc<tokio::sync::Notify>,
    ) -> Result<Outcome, sqlx::Error> {
        let (job_id, device_id, kind) = (r.job.id.as_str(), r.device.id.as_str(), r.kind);
        let device = r.device;
        let c = &self.config;
        let poll = c.poll_interval.max(Duration::from_millis(10));
        let timeout = c.step_timeout.max(Duration::from_secs(1));
        let mut attempts: u32 = run_attempts.max(0) as u32;
        let mut waiting_since: Option<Instant> = None;
        loop {
            if store::cancel_requested(&self.deps.pool, job_id).await? {
                if matches!(kind, Kind::SingleNodeTest | Kind::MultiNodeTest) {
                    self.cancel_burn_in(r, carried).await;
                }
                return Ok(Outcome::Cancelled);
            }
            let next = match self.step(r, carried).await {
                Ok(next) => {
                    attempts = 0;
                    next
                }
                Err(CallError::Permanent(code, message)) => {
                    return Ok(Outcome::Failed(code, message))
                }
                Err(CallError::Transient(code, message)) => {
                    attempts += 1;
                    store::attempt(&self.deps.pool, job_id, device_id, attempts).await?;
                    if attempts >= c.max_attempts.max(1) {
                        return Ok(Outcome::Failed(
                            code,
                            format!("{message} (after {attempts} attempts)"),
                        ));
                    }
                    let wait = self.backoff(attempts);
                    tracing::info!(job_id, device_id, attempts, wait_ms = wait.as_millis() as u64, error = %message, "step failed; retrying");
                    tokio::time::sleep(wait).await;
                    continue;
                }
            };
            match next {
                Taken::Done | Taken::Failed(..) => {
                    // The last read is the run's evidence (a simulated
                    // flip's per-switch results): record it with the end.
                    self.record(r, carried, None).await?;
                    return Ok(match next {
                        Taken::Failed(code, message) => Outcome::Failed(code, message),
                        _ => Outcome::Succeeded,
                    });
                }
                Taken::Wait => {
                    let since = *waiting_since.get_or_insert_with(Instant::now);
                    let timeout = carried.wait_limit.unwrap_or(timeout).max(timeout);
                    if since.elapsed() > timeout {
                        return Ok(carried.timed_out(
                            kind,
                            format!(
                                "device {} did not settle within {} s",
                                device.name,
                                timeout.as_secs()
                            ),
                        ));
                    }
                    tokio::time::sleep(poll).await;
                }
                Taken::WaitHub => {
                    let since = *waiting_since.get_or_insert_with(Instant::now);
                    let left = timeout.saturating_sub(since.elapsed());
                    if left.is_zero() {
                        return Ok(carried.timed_out(
                            kind,
                            format!(
                                "the hub did not derive what {kind} waits for on device {} within {} s",
                                device.name,
                                timeout.as_secs()
                            ),
                        ));
                    }
                    tokio::select! {
                        _ = woken.notified() => {}
                        _ = tokio::time::sleep(crate::waits::BACKSTOP.min(left)) => {
                            self.metrics.backstop.inc();
                        }
                    }
                }
                Taken::Step(name) => {
                    waiting_since = None;
                    carried.timeout_code = None;
                    self.record(r, carried, Some(name)).await?;
                }
            }
        }
    }

    /// What the run carries, committed with the step it completed (`None`:
    /// with its end).
    async fn record(
        &self,
        r: &Run<'_>,
        carried: &Carried,
        step: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        let pinned = Value::Object(carried.pinned.clone());
        let (job, device) = (&r.job.id, &r.device.id);
        store::record(
            &self.deps.pool,
            job,
            device,
            step,
            &pinned,
            &carried.results,
        )
        .await
    }

    /// The back-off before try `attempts + 1` of a step: doubling from
    /// `retry_initial` up to `retry_max`.
    pub(crate) fn backoff(&self, attempts: u32) -> Duration {
        let c = &self.config;
        c.retry_initial
            .saturating_mul(1 << attempts.min(16))
            .min(c.retry_max.max(c.retry_initial))
    }

    /// One step of the run's workflow.
    async fn step(&self, r: &Run<'_>, carried: &mut Carried) -> StepOutcome {
        match r.kind {
            // "The backend is chosen from the site's current capability".
            Kind::ImageNode | Kind::UnimageNode if r.device.placement_enabled => {
                self.nova_arm(r, carried).await
            }
            Kind::ImageNode | Kind::UnimageNode => self.ironic_direct(r, carried).await,
            Kind::Enrollment => self.enrolment(r, carried).await,
            Kind::Release => self.release(r).await,
            Kind::MoveToTestCluster => self.move_to_test_cluster(r, carried).await,
            Kind::FrontendVrfIsolate
            | Kind::FrontendVrfReturn
            | Kind::BackendVrfIsolate
            | Kind::BackendVrfReturn => self.vrf_flip(r, carried).await,
            Kind::NvlinkRepairMove | Kind::NvlinkRepairReturn => self.nvlink(r, carried).await,
            Kind::SingleNodeTest | Kind::MultiNodeTest => self.burn_in(r, carried).await,
        }
    }
}

impl Workflow {
    /// One latch write through the hub's `write_condition`
    /// (`fleet_latch`): observation-ordered, the stored row verified.
    pub(super) async fn write_latch(
        &self,
        r: &Run<'_>,
        latch: fleet_latch::Latch,
        reason: &str,
        message: String,
        observed_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), fleet_latch::LatchError> {
        use fleet_latch::{LatchWrite, LatchWriter};
        let w = LatchWrite::new(
            latch,
            LatchWrite::device_id(&r.device.id),
            reason,
            message,
            observed_at,
        )?;
        let mut writer = LatchWriter::new(
            self.deps.nats.clone(),
            self.deps.subjects.clone(),
            &format!("workflow:{}:{}", r.kind, r.job.id),
        );
        writer.timeout = self.config.hub_timeout.max(Duration::from_secs(1));
        writer.write(&w).await?;
        self.metrics.wrote("hub", reason);
        Ok(())
    }
}

/// A latch write that did not land, as a step's failure with `code`: no
/// answer from the hub is retried; a refusal or a stale-rejection ends the
/// device ("the activity fails rather than reporting a latch it did not
/// record").
pub(super) fn latch_error(e: fleet_latch::LatchError, code: FailureCode) -> CallError {
    match e {
        fleet_latch::LatchError::Unavailable { .. } => CallError::Transient(code, e.to_string()),
        _ => CallError::Permanent(code, e.to_string()),
    }
}
