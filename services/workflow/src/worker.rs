//! The worker: one durable consumer on `JOBS`, a bounded number of devices
//! worked at once, and the loop that drives one device's workflow to a
//! terminal status. The message is acknowledged only once the device's
//! terminal status is committed; while it works the worker tells JetStream
//! it is still at it, so only a dead worker's device is redelivered.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use fleet_domain::failure::FailureCode;
use fleet_domain::jobs::DeviceRunStatus;
use fleet_proto::{v1, Message};
use fleet_runtime::Shutdown;
use futures::StreamExt;

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
            .deps
            .js
            .get_stream(self.deps.streams.jobs())
            .await
            .map_err(|e| format!("get stream {}: {e}", self.deps.streams.jobs()))?;
        let config = jetstream::consumer::pull::Config {
            durable_name: Some("workflow".into()),
            filter_subject: self.deps.subjects.job_all(),
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
        let Some(job) = store::job(&self.deps.pool, job_id).await? else {
            tracing::warn!(
                job_id,
                device_id,
                "work for a job that does not exist; dropped"
            );
            return Ok(());
        };
        let Some(run) = store::run(&self.deps.pool, job_id, device_id).await? else {
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
        if !store::start(&self.deps.pool, job_id, device_id).await? {
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
        // Enrolment: a started non-success writes the guarded failure
        // proof before the device's terminal status is recorded.
        if job.workflow == "enrollment" && outcome != Outcome::Succeeded {
            let pinned = store::run(&self.deps.pool, job_id, device_id)
                .await?
                .and_then(|r| crate::flows::enrolment::pinned_identity(&r.pinned));
            if let Some(identity) = pinned {
                self.enrolment_failure_write(job_id, device_id, &identity)
                    .await;
            }
        }
        store::finish(&self.deps.pool, job_id, device_id, status, failure).await?;
        self.metrics.finished(
            &job.workflow,
            status.as_str(),
            failure.map(|f| f.0).unwrap_or(""),
        );
        Ok(())
    }
}
