//! The worker: one durable consumer on `JOBS`, a bounded number of devices
//! worked at once, and the loop that drives one device's workflow to a
//! terminal status. The message is acknowledged only once the device's
//! terminal status is committed; while it works the worker tells JetStream
//! it is still at it, so only a dead worker's device is redelivered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind};
use fleet_domain::eligibility::Workflow as Kind;
use fleet_domain::failure::FailureCode;
use fleet_domain::ironic_direct::{image_next, unimage_next, Next, NodeView};
use fleet_domain::jobs::DeviceRunStatus;
use fleet_proto::{v1, Message};
use fleet_runtime::Shutdown;
use futures::StreamExt;
use serde_json::json;

use crate::activities::{mint_instance_uuid, CallError, Site};
use crate::{store, Workflow};

/// How a device's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Succeeded,
    Failed(FailureCode, String),
    Cancelled,
}

impl Workflow {
    /// Consumes `JOBS` until shutdown; the devices in hand finish their
    /// current call and are left unacknowledged (a later worker resumes
    /// them).
    pub(crate) async fn work_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        let workers = self.config.workers.max(1);
        let limit = Arc::new(tokio::sync::Semaphore::new(workers));
        let ack_wait = self.config.ack_wait;
        let mut backoff = Duration::from_millis(200);
        while !shutdown.is_triggered() {
            let consumer = match self.consumer(ack_wait, workers).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot bind the JOBS consumer; retrying");
                    tokio::select! { _ = tokio::time::sleep(backoff) => {}, _ = shutdown.wait() => return }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            backoff = Duration::from_millis(200);
            let mut messages = match consumer.messages().await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read JOBS; retrying");
                    tokio::select! { _ = tokio::time::sleep(backoff) => {}, _ = shutdown.wait() => return }
                    continue;
                }
            };
            loop {
                let permit = tokio::select! {
                    p = limit.clone().acquire_owned() => p,
                    _ = shutdown.wait() => return,
                };
                let Ok(permit) = permit else { return };
                let next = tokio::select! {
                    m = messages.next() => m,
                    _ = shutdown.wait() => return,
                };
                match next {
                    Some(Ok(msg)) => {
                        let w = self.clone();
                        let stop = shutdown.clone();
                        tokio::spawn(async move {
                            let _permit = permit;
                            w.handle(msg, ack_wait, stop).await;
                        });
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "JOBS read failed; binding again");
                        break;
                    }
                    None => break,
                }
            }
        }
    }

    async fn consumer(
        &self,
        ack_wait: Duration,
        workers: usize,
    ) -> Result<jetstream::consumer::PullConsumer, String> {
        let stream = self
            .js
            .get_stream(self.streams.jobs())
            .await
            .map_err(|e| format!("get stream {}: {e}", self.streams.jobs()))?;
        let config = jetstream::consumer::pull::Config {
            durable_name: Some("workflow".into()),
            filter_subject: self.subjects.job_all(),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait,
            max_ack_pending: workers as i64,
            ..Default::default()
        };
        stream
            .get_or_create_consumer("workflow", config)
            .await
            .map_err(|e| format!("consumer workflow: {e}"))
    }

    /// One message: the device's run, then the ack. Undecodable work is
    /// terminated (it can never be done) and logged.
    async fn handle(self: Arc<Self>, msg: jetstream::Message, ack_wait: Duration, stop: Shutdown) {
        let work = match v1::JobDeviceWork::decode(msg.payload.as_ref()) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(subject = %msg.subject, error = %e, "undecodable JOBS message; terminated");
                let _ = msg.ack_with(AckKind::Term).await;
                return;
            }
        };
        // Keep the message ours while the device is worked on.
        let progress = {
            let msg_ack = msg.clone();
            let every = (ack_wait / 3).max(Duration::from_millis(200));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    if msg_ack.ack_with(AckKind::Progress).await.is_err() {
                        return;
                    }
                }
            })
        };
        self.metrics.running.inc();
        let run = async {
            match crate::impairment::Phase::of(&work.workflow) {
                Some(phase) => {
                    self.impairment_device(phase, &work.job_id, &work.device_id)
                        .await
                }
                None => self.run_device(&work.job_id, &work.device_id).await,
            }
        };
        let done = tokio::select! {
            r = run => Some(r),
            _ = stop.stopped() => None,
        };
        self.metrics.running.dec();
        progress.abort();
        match done {
            Some(Ok(())) => {
                if let Err(e) = msg.double_ack().await {
                    tracing::warn!(job_id = %work.job_id, device_id = %work.device_id, error = %e, "ack failed; the device is redelivered and found terminal");
                }
            }
            Some(Err(e)) => {
                tracing::warn!(job_id = %work.job_id, device_id = %work.device_id, error = %e, "database unavailable; the device is redelivered");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(2))))
                    .await;
            }
            // Shutdown: left unacknowledged, redelivered after ack_wait.
            None => {}
        }
    }

    /// Drives one device of a job to a terminal status. `Err` only when
    /// PostgreSQL is away (nothing is decided without being recorded).
    pub(crate) async fn run_device(
        &self,
        job_id: &str,
        device_id: &str,
    ) -> Result<(), sqlx::Error> {
        let Some(job) = store::job(&self.pool, job_id).await? else {
            tracing::warn!(
                job_id,
                device_id,
                "work for a job that does not exist; dropped"
            );
            return Ok(());
        };
        let Some(run) = store::run(&self.pool, job_id, device_id).await? else {
            tracing::warn!(
                job_id,
                device_id,
                "work for a device not in its job; dropped"
            );
            return Ok(());
        };
        if run.status.as_deref().is_some_and(|s| s != "running") {
            return Ok(());
        }
        if !store::start(&self.pool, job_id, device_id).await? {
            // Cancelled before it started (the cancel wrote its status).
            return Ok(());
        }
        let outcome = self.drive(&job, &run).await?;
        let (status, failure) = match &outcome {
            Outcome::Succeeded => (DeviceRunStatus::Succeeded, None),
            Outcome::Cancelled => (DeviceRunStatus::Cancelled, None),
            Outcome::Failed(code, message) => (
                DeviceRunStatus::Failed,
                Some((code.as_str(), message.as_str())),
            ),
        };
        if let Some((code, message)) = failure {
            tracing::warn!(job_id, device_id, workflow = %job.workflow, failure_code = code, message, "device failed");
        }
        store::finish(&self.pool, job_id, device_id, status, failure).await?;
        self.metrics.finished(
            &job.workflow,
            status.as_str(),
            failure.map(|f| f.0).unwrap_or(""),
        );
        Ok(())
    }

    async fn drive(
        &self,
        job: &store::JobRow,
        run: &store::RunRow,
    ) -> Result<Outcome, sqlx::Error> {
        let (job_id, device_id) = (job.id.as_str(), run.device_id.as_str());
        let kind = match Kind::parse(&job.workflow) {
            Ok(k @ (Kind::ImageNode | Kind::UnimageNode)) => k,
            _ => {
                return Ok(Outcome::Failed(
                    FailureCode::WorkflowInternalError,
                    format!("workflow {} is not run by this build", job.workflow),
                ))
            }
        };
        let Some(device) = store::device(&self.pool, device_id).await? else {
            return Ok(Outcome::Failed(
                FailureCode::IronicNodeNotFound,
                format!("device {device_id} no longer exists"),
            ));
        };
        let Some(site) = self.sites.get(&device.site_id) else {
            return Ok(Outcome::Failed(
                FailureCode::SiteNotConfigured,
                format!("workflow.sites.{} is not configured", device.site_id),
            ));
        };
        if kind == Kind::ImageNode && site.config.image_source.trim().is_empty() {
            return Ok(Outcome::Failed(
                FailureCode::SiteNotConfigured,
                format!(
                    "workflow.sites.{}.image_source is not configured (the image Image Node deploys)",
                    device.site_id
                ),
            ));
        }
        // The node: the device's infrastructure_ref (its Ironic uuid), or
        // its name before one is known.
        let ident = device
            .infrastructure_ref
            .clone()
            .filter(|r| !r.trim().is_empty())
            .unwrap_or_else(|| device.name.clone());
        let mut pinned: Option<String> = run
            .pinned
            .get("instance_uuid")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        let c = &self.config;
        let poll = c.poll_interval.max(Duration::from_millis(10));
        let timeout = c.step_timeout.max(Duration::from_secs(1));
        let mut attempts: u32 = run.attempts.max(0) as u32;
        let mut waiting_since: Option<Instant> = None;
        loop {
            if store::cancel_requested(&self.pool, job_id).await? {
                return Ok(Outcome::Cancelled);
            }
            let step = self.step(&site, kind, &ident, &mut pinned).await;
            let next = match step {
                Ok(next) => {
                    attempts = 0;
                    next
                }
                Err(CallError::Permanent(code, message)) => {
                    return Ok(Outcome::Failed(code, message))
                }
                Err(CallError::Transient(code, message)) => {
                    attempts += 1;
                    store::attempt(&self.pool, job_id, device_id, attempts).await?;
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
                Taken::Done => return Ok(Outcome::Succeeded),
                Taken::Failed(code, message) => return Ok(Outcome::Failed(code, message)),
                Taken::Wait => {
                    let since = *waiting_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > timeout {
                        return Ok(Outcome::Failed(
                            FailureCode::IronicTimeout,
                            format!("node {ident} did not settle within {} s", timeout.as_secs()),
                        ));
                    }
                    tokio::time::sleep(poll).await;
                }
                Taken::Step(name) => {
                    waiting_since = None;
                    let p = match &pinned {
                        Some(u) => json!({"instance_uuid": u}),
                        None => json!({}),
                    };
                    store::step(&self.pool, job_id, device_id, name, &p).await?;
                }
            }
        }
    }

    /// The back-off before try `attempts + 1` of a step: doubling from
    /// `retry_initial` up to `retry_max`.
    pub(crate) fn backoff(&self, attempts: u32) -> Duration {
        let c = &self.config;
        c.retry_initial
            .saturating_mul(1 << attempts.min(16))
            .min(c.retry_max.max(c.retry_initial))
    }

    /// One read of the node, one decision, at most one write.
    async fn step(
        &self,
        site: &Site,
        kind: Kind,
        ident: &str,
        pinned: &mut Option<String>,
    ) -> Result<Taken, CallError> {
        let node = site.node(ident).await?;
        let view = NodeView {
            uuid: &node.uuid,
            provision_state: node.provision_state.as_deref().unwrap_or(""),
            target_provision_state: node.target_provision_state.as_deref().unwrap_or(""),
            maintenance: node.maintenance,
            instance_uuid: node.instance_uuid.as_deref().filter(|u| !u.is_empty()),
            last_error: node.last_error.as_deref(),
        };
        let next = match kind {
            Kind::ImageNode => image_next(&view, pinned.as_deref()),
            _ => unimage_next(&view),
        };
        Ok(match next {
            Next::Mint => {
                *pinned = Some(mint_instance_uuid());
                Taken::Step("instance_uuid_minted")
            }
            Next::Adopt { instance_uuid } => {
                *pinned = Some(instance_uuid);
                Taken::Step("binding_recovered")
            }
            Next::Bind => {
                let u = pinned.as_deref().unwrap_or_default();
                site.patch(&node.uuid, &site.bind_ops(u)).await?;
                self.metrics.wrote("ironic", "bind");
                Taken::Step("bound")
            }
            Next::Provision { target } => {
                let body = if target == "active" {
                    site.deploy_body()
                } else {
                    json!({ "target": target })
                };
                site.provision(&node.uuid, &body).await?;
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
            Next::Fail { code, message } => Taken::Failed(code, message),
        })
    }
}

/// What one step did.
enum Taken {
    Step(&'static str),
    Wait,
    Done,
    Failed(FailureCode, String),
}
