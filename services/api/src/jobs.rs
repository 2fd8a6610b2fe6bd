//! Jobs: the workflow service's, asked over NATS request/reply
//! (`fleet_workflow_client::WorkflowClient`). Creating one runs the
//! eligibility pass there; its refusals answer 422 `INELIGIBLE` with one
//! entry per device and gate, and nothing is created. No answer within
//! `api.hub_timeout` is 503.

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use fleet_domain::eligibility::Workflow;
use fleet_domain::jobs::{DeviceRunStatus, JobStatus};
use fleet_domain::release::EngagementMode;
use fleet_proto::{datetime, v1};
use fleet_workflow_client::WorkflowError;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};
use utoipa::openapi::Ref;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::call::Call;
use crate::error::{ApiError, ApiResult, Code, J, P, Q};
use crate::hub::opt;
use crate::model::enum_schema;
use crate::{page, App};

pub fn workflow_schema() -> Object {
    enum_schema(Workflow::ALL.iter().map(|w| w.as_str()))
}

pub fn job_status_schema() -> Object {
    enum_schema(JobStatus::ALL.iter().map(|s| s.as_str()))
}

pub(crate) fn device_status_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            Type::String,
            Type::Null,
        ]))
        .description(Some(
            "null until the device starts (seed 002: there is no pending value)",
        ))
        .enum_values(Some(
            DeviceRunStatus::ALL
                .iter()
                .map(|s| Some(s.as_str()))
                .chain([None]),
        ))
        .build()
}

fn failure_code_ref() -> Ref {
    Ref::from_schema_name("FailureCode")
}

fn engagement_mode_schema() -> Object {
    enum_schema(EngagementMode::ALL.iter().map(|m| m.as_str()))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobCreateBody {
    #[schema(schema_with = workflow_schema)]
    pub workflow: String,
    pub device_ids: Vec<String>,
    /// Move to Test Cluster's `cordon_only`.
    #[serde(default)]
    pub cordon_only: bool,
    /// Move to Test Cluster's `force_reclaim`.
    #[serde(default)]
    pub force_reclaim: bool,
    /// Release: hand the devices back to the customer pool.
    #[serde(default)]
    pub release_to_customer_pool: bool,
    /// Release, with `release_to_customer_pool`: who runs the customer's
    /// side (the caller's knowledge, seed 002).
    #[schema(schema_with = engagement_mode_schema, nullable)]
    pub engagement_mode: Option<String>,
    /// The fabric flips: plan and read back every switch, write nothing,
    /// record no latch.
    #[serde(default)]
    pub simulate: bool,
    /// Enrolment: absent is true; false is a diagnostic run that proves
    /// nothing.
    pub run_inspection: Option<bool>,
    /// Per device id, what its run needs (the front-end VRF return: the
    /// customer VRF its ports go back into).
    #[serde(default)]
    pub params: std::collections::BTreeMap<String, JobDeviceParams>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobDeviceParams {
    pub customer_vrf: Option<String>,
}

/// What one step read back or did on one target (a switch port, NMX-M).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StepResult {
    pub target: String,
    pub detail: String,
    pub applied: bool,
    pub simulated: bool,
}

/// One scope a job or event tripped the storm guard in, as counted.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct StormTrip {
    /// `site` or `pool`.
    pub scope_kind: String,
    pub scope_id: String,
    /// Devices of the scope in service (entered service, not failed).
    pub in_service: i32,
    /// Devices this work takes out of service.
    pub taking: i32,
    /// Devices admitted work took out within the window.
    pub in_window: i32,
    /// The most that may be out within the window.
    pub limit: i32,
}

/// The storm guard's hold on a job or an impairment event: nothing of its
/// work is queued while `awaiting_confirmation`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StormGuard {
    pub awaiting_confirmation: bool,
    pub trips: Vec<StormTrip>,
    pub confirmed_by: Option<String>,
    pub confirmed_at: Option<DateTime<Utc>>,
    pub confirm_reason: Option<String>,
}

impl StormGuard {
    pub fn from_proto(g: v1::StormGuard) -> StormGuard {
        StormGuard {
            awaiting_confirmation: g.awaiting_confirmation,
            trips: g
                .trips
                .into_iter()
                .map(|t| StormTrip {
                    scope_kind: t.scope_kind,
                    scope_id: t.scope_id,
                    in_service: t.in_service,
                    taking: t.taking,
                    in_window: t.in_window,
                    limit: t.limit,
                })
                .collect(),
            confirmed_by: opt(g.confirmed_by),
            confirmed_at: datetime(g.confirmed_at.as_ref()),
            confirm_reason: opt(g.confirm_reason),
        }
    }
}

/// An operator's confirmation.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfirmBody {
    /// Why taking these devices out of service is right (required).
    pub reason: String,
}

impl ConfirmBody {
    /// The workflow service's request: the caller confirms `id`.
    pub fn request(self, id: String, caller: &Caller) -> v1::ConfirmRequest {
        v1::ConfirmRequest {
            id,
            confirmed_by: caller.token_id.clone(),
            reason: self.reason,
        }
    }
}

/// One device of a job (`JobDeviceStatus`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobDevice {
    pub device_id: String,
    #[schema(schema_with = device_status_schema)]
    pub status: Option<String>,
    /// The last step the device completed.
    pub step: String,
    /// Tries of the current step after transient failures.
    pub attempts: i32,
    #[schema(schema_with = failure_code_ref, nullable)]
    pub failure_code: Option<String>,
    /// The host-specific detail of `failure_code`.
    pub failure_message: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    /// Per target, what the run read back or did (the fabric flips).
    pub results: Vec<StepResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Job {
    pub id: String,
    #[schema(schema_with = workflow_schema)]
    pub workflow: String,
    #[schema(schema_with = job_status_schema)]
    pub status: String,
    pub created_by: String,
    pub cancel_requested: bool,
    pub cordon_only: bool,
    pub force_reclaim: bool,
    pub release_to_customer_pool: bool,
    #[schema(schema_with = engagement_mode_schema, nullable)]
    pub engagement_mode: Option<String>,
    pub simulate: bool,
    pub run_inspection: Option<bool>,
    /// Present when the storm guard held the job: while it awaits
    /// confirmation nothing of it runs (`POST .../confirm`).
    pub storm_guard: Option<StormGuard>,
    pub device_count: i32,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Every device (empty in lists).
    pub devices: Vec<JobDevice>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobPage {
    pub items: Vec<Job>,
    pub next_cursor: Option<String>,
}

impl Job {
    pub fn from_proto(j: v1::Job) -> Job {
        Job {
            id: j.id,
            workflow: j.workflow,
            status: j.status,
            created_by: j.created_by,
            cancel_requested: j.cancel_requested,
            cordon_only: j.cordon_only,
            force_reclaim: j.force_reclaim,
            release_to_customer_pool: j.release_to_customer_pool,
            engagement_mode: opt(j.engagement_mode),
            simulate: j.simulate,
            run_inspection: j.run_inspection,
            storm_guard: j.storm_guard.map(StormGuard::from_proto),
            device_count: j.device_count,
            created_at: datetime(j.created_at.as_ref()),
            updated_at: datetime(j.updated_at.as_ref()),
            finished_at: datetime(j.finished_at.as_ref()),
            devices: j
                .devices
                .into_iter()
                .map(|d| JobDevice {
                    device_id: d.device_id,
                    status: opt(d.status),
                    step: d.step,
                    attempts: d.attempts,
                    failure_code: opt(d.failure_code),
                    failure_message: opt(d.failure_message),
                    started_at: datetime(d.started_at.as_ref()),
                    finished_at: datetime(d.finished_at.as_ref()),
                    updated_at: datetime(d.updated_at.as_ref()),
                    results: d
                        .results
                        .into_iter()
                        .map(|r| StepResult {
                            target: r.target,
                            detail: r.detail,
                            applied: r.applied,
                            simulated: r.simulated,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// The job the workflow service answered, or its refusal as the API's
/// error (`verb` names the call).
fn job(verb: &str, answer: Result<v1::Job, WorkflowError>) -> ApiResult<Job> {
    answer.map(Job::from_proto).map_err(|e| error(verb, e))
}

/// The workflow service's refusal as the API's error.
pub fn error(verb: &str, e: WorkflowError) -> ApiError {
    match e {
        WorkflowError::Ineligible { message, refusals } => ApiError::new(Code::Ineligible, message)
            .with_details(json!({
                "refusals": refusals.iter().map(|r| json!({
                    "device_id": r.device_id,
                    "refusal": r.refusal,
                    "detail": r.detail,
                })).collect::<Vec<_>>()
            })),
        WorkflowError::Refused { code, message } => ApiError::new(code, message),
        WorkflowError::Unavailable(m) => {
            tracing::warn!(verb, error = %m, "workflow service unavailable");
            ApiError::unavailable(match verb {
                "create_job" => "the workflow service did not answer in time; the job may or may not have been created: list the jobs before retrying",
                "cancel_job" => "the workflow service did not answer in time; cancel again (it is idempotent)",
                "create_impairment" => "the workflow service did not answer in time; the event may or may not have been created: list the impairment events before retrying",
                "clear_impairment" => "the workflow service did not answer in time; read the event, and clear again if it is not being released",
                "confirm_job" | "confirm_impairment" => "the workflow service did not answer in time; confirm again (it is idempotent)",
                _ => "the workflow service did not answer in time; retry later",
            })
        }
        WorkflowError::NotRunning => {
            tracing::warn!(verb, "no workflow service is running");
            ApiError::unavailable(
                "no workflow service is running; nothing was applied, retry later",
            )
        }
    }
}

#[utoipa::path(post, operation_id = "create_job", path = "/api/v1/jobs/",
    request_body = JobCreateBody,
    responses((status = 201, body = Job), (status = 400, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody), (status = 422, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)),
    tag = "jobs")]
pub async fn create(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    J(b): J<JobCreateBody>,
) -> ApiResult<(StatusCode, Json<Job>)> {
    let r = v1::CreateJobRequest {
        workflow: b.workflow,
        device_ids: b.device_ids,
        created_by: caller.token_id.clone(),
        cordon_only: b.cordon_only,
        force_reclaim: b.force_reclaim,
        release_to_customer_pool: b.release_to_customer_pool,
        engagement_mode: b.engagement_mode.unwrap_or_default(),
        simulate: b.simulate,
        run_inspection: b.run_inspection,
        params: b
            .params
            .into_iter()
            .map(|(d, p)| {
                let customer_vrf = p.customer_vrf.unwrap_or_default();
                (d, v1::DeviceParams { customer_vrf })
            })
            .collect(),
    };
    let created = job("create_job", app.workflow.create_job(&r).await)?;
    Ok((StatusCode::CREATED, Json(created)))
}

crate::page::page_query! {
    pub struct JobFilter {
        #[param(schema_with = job_status_schema)]
        pub status: Option<String>,
        #[param(schema_with = workflow_schema)]
        pub workflow: Option<String>,
        /// Only jobs that name this device.
        pub device: Option<String>,
    }
}

#[utoipa::path(get, operation_id = "list_jobs", path = "/api/v1/jobs/", params(JobFilter),
    responses((status = 200, body = JobPage), (status = 400, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)),
    tag = "jobs")]
pub async fn list(State(app): State<App>, Q(f): Q<JobFilter>) -> ApiResult<Json<JobPage>> {
    let page = f.page::<String>(&app)?;
    let r = v1::ListJobsRequest {
        status: f.status.unwrap_or_default(),
        workflow: f.workflow.unwrap_or_default(),
        limit: page.limit as i32,
        after: page.after.unwrap_or_default(),
        device_id: f.device.unwrap_or_default(),
    };
    let p = app
        .workflow
        .list_jobs(&r)
        .await
        .map_err(|e| error("list_jobs", e))?;
    Ok(Json(JobPage {
        items: p.jobs.into_iter().map(Job::from_proto).collect(),
        next_cursor: opt(p.next_after).map(|a| page::encode(&a)),
    }))
}

#[utoipa::path(get, operation_id = "get_job", path = "/api/v1/jobs/{id}/", params(("id" = String, Path)),
    responses((status = 200, body = Job), (status = 404, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)),
    tag = "jobs")]
pub async fn detail(State(app): State<App>, P(id): P<String>) -> ApiResult<Json<Job>> {
    job("get_job", app.workflow.get_job(&id).await).map(Json)
}

#[utoipa::path(post, operation_id = "cancel_job", path = "/api/v1/jobs/{id}/cancel", params(("id" = String, Path)),
    responses((status = 200, body = Job), (status = 404, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)),
    tag = "jobs")]
pub async fn cancel(Call { app, caller, id }: Call) -> ApiResult<Json<Job>> {
    let answer = app.workflow.cancel_job(&id, &caller.token_id).await;
    job("cancel_job", answer).map(Json)
}

#[utoipa::path(post, operation_id = "confirm_job", path = "/api/v1/jobs/{id}/confirm", params(("id" = String, Path)),
    request_body = ConfirmBody,
    responses((status = 200, description = "Confirmed: its work is queued (confirming again answers the same)", body = Job),
        (status = 400, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody),
        (status = 409, description = "Cancelled, or not held by the storm guard", body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)),
    tag = "jobs")]
pub async fn confirm(Call { app, caller, id }: Call, J(b): J<ConfirmBody>) -> ApiResult<Json<Job>> {
    let answer = app.workflow.confirm_job(&b.request(id, &caller)).await;
    job("confirm_job", answer).map(Json)
}
