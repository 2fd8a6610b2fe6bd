//! The workflow service's client, for the API (`/api/v1/jobs/`,
//! `/api/v1/operations/impairment-events/`), the CLI and tests: core NATS request/reply on `<root>.workflow.cmd.<verb>`
//! with a timeout; no answer in time is `UNAVAILABLE` (the API answers 503,
//! never a guess).

use std::time::Duration;

use fleet_bus::{Caller, Subjects};
use fleet_proto::{v1, ErrorCode, Message};

/// A refusal of the workflow service, with the mesh's error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkflowError {
    /// The job was refused at creation: one refusal per device and gate.
    #[error("{message}")]
    Ineligible {
        message: String,
        refusals: Vec<v1::DeviceRefusal>,
    },
    #[error("{message}")]
    Refused { code: ErrorCode, message: String },
    /// No answer in time, NATS away, or the service's store away.
    #[error("{0}")]
    Unavailable(String),
    /// No workflow service was subscribed: nothing was applied.
    #[error("no workflow service is running")]
    NotRunning,
}

impl WorkflowError {
    pub fn code(&self) -> ErrorCode {
        match self {
            WorkflowError::Ineligible { .. } => ErrorCode::Ineligible,
            WorkflowError::Refused { code, .. } => *code,
            WorkflowError::Unavailable(_) | WorkflowError::NotRunning => ErrorCode::Unavailable,
        }
    }

    pub fn from_proto(e: v1::WorkflowError) -> Self {
        match e.code() {
            ErrorCode::Ineligible => WorkflowError::Ineligible {
                message: e.message,
                refusals: e.refusals,
            },
            ErrorCode::Unavailable | ErrorCode::Unspecified => {
                WorkflowError::Unavailable(e.message)
            }
            code => WorkflowError::Refused {
                code,
                message: e.message,
            },
        }
    }
}

impl fleet_bus::ClientError for WorkflowError {
    fn not_running() -> Self {
        WorkflowError::NotRunning
    }

    fn unavailable(why: String) -> Self {
        WorkflowError::Unavailable(why)
    }
}

#[derive(Clone)]
pub struct WorkflowClient {
    bus: Caller,
}

impl WorkflowClient {
    pub fn new(nats: async_nats::Client, subjects: Subjects, timeout: Duration) -> Self {
        WorkflowClient {
            bus: Caller::new(nats, subjects, timeout),
        }
    }

    async fn call(
        &self,
        verb: &str,
        payload: Vec<u8>,
    ) -> Result<v1::workflow_reply::Result, WorkflowError> {
        let reply: v1::WorkflowReply = self
            .bus
            .call(
                "workflow service",
                self.bus.subjects().workflow_cmd(verb),
                payload,
            )
            .await?;
        if let Some(e) = reply.error {
            return Err(WorkflowError::from_proto(e));
        }
        reply
            .result
            .ok_or_else(|| WorkflowError::Unavailable("empty workflow reply".into()))
    }

    fn job(r: v1::workflow_reply::Result) -> Result<v1::Job, WorkflowError> {
        match r {
            v1::workflow_reply::Result::Job(j) => Ok(j),
            _ => Err(WorkflowError::Unavailable(
                "the workflow service answered with no job".into(),
            )),
        }
    }

    pub async fn create_job(&self, r: &v1::CreateJobRequest) -> Result<v1::Job, WorkflowError> {
        Self::job(self.call("create_job", r.encode_to_vec()).await?)
    }

    pub async fn get_job(&self, job_id: &str) -> Result<v1::Job, WorkflowError> {
        let r = v1::GetJobRequest {
            job_id: job_id.to_string(),
        };
        Self::job(self.call("get_job", r.encode_to_vec()).await?)
    }

    pub async fn cancel_job(
        &self,
        job_id: &str,
        requested_by: &str,
    ) -> Result<v1::Job, WorkflowError> {
        let r = v1::CancelJobRequest {
            job_id: job_id.to_string(),
            requested_by: requested_by.to_string(),
        };
        Self::job(self.call("cancel_job", r.encode_to_vec()).await?)
    }

    /// Confirms a job the storm guard holds (`reason`: why taking its
    /// devices out of service is right).
    pub async fn confirm_job(&self, r: &v1::ConfirmRequest) -> Result<v1::Job, WorkflowError> {
        Self::job(self.call("confirm_job", r.encode_to_vec()).await?)
    }

    pub async fn list_jobs(&self, r: &v1::ListJobsRequest) -> Result<v1::JobPage, WorkflowError> {
        match self.call("list_jobs", r.encode_to_vec()).await? {
            v1::workflow_reply::Result::Page(p) => Ok(p),
            _ => Err(WorkflowError::Unavailable(
                "the workflow service answered with no page".into(),
            )),
        }
    }

    fn impairment(r: v1::workflow_reply::Result) -> Result<v1::ImpairmentAccepted, WorkflowError> {
        match r {
            v1::workflow_reply::Result::Impairment(a) => Ok(a),
            _ => Err(WorkflowError::Unavailable(
                "the workflow service answered with no impairment event".into(),
            )),
        }
    }

    /// Records an impairment event and queues each device's cordon.
    pub async fn create_impairment(
        &self,
        r: &v1::CreateImpairmentRequest,
    ) -> Result<v1::ImpairmentAccepted, WorkflowError> {
        Self::impairment(self.call("create_impairment", r.encode_to_vec()).await?)
    }

    /// Queues the release of every device of the event not yet cleared.
    pub async fn clear_impairment(
        &self,
        event_id: &str,
        requested_by: &str,
    ) -> Result<v1::ImpairmentAccepted, WorkflowError> {
        let r = v1::ClearImpairmentRequest {
            event_id: event_id.to_string(),
            requested_by: requested_by.to_string(),
        };
        Self::impairment(self.call("clear_impairment", r.encode_to_vec()).await?)
    }

    /// Confirms an impairment event the storm guard holds: its cordon is
    /// queued.
    pub async fn confirm_impairment(
        &self,
        r: &v1::ConfirmRequest,
    ) -> Result<v1::ImpairmentAccepted, WorkflowError> {
        Self::impairment(self.call("confirm_impairment", r.encode_to_vec()).await?)
    }
}
