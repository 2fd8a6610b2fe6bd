//! The workflow service's SQL: jobs, their devices, and what eligibility
//! reads of the devices (it never writes a device table).

use chrono::{DateTime, Utc};
use fleet_domain::eligibility::Options;
use fleet_domain::jobs::{job_status, DeviceRunStatus, JobStatus};
use fleet_proto::{timestamp, v1};
use sqlx::types::Json;
use sqlx::{PgPool, Postgres, Transaction};

/// What eligibility and the activities read of one device.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct DeviceRow {
    pub id: String,
    pub name: String,
    pub site_id: String,
    pub inventory_only: bool,
    pub operational_status: String,
    pub infrastructure_ref: Option<String>,
    pub enrollment_validated_ref: Option<String>,
    pub ironic_maintenance: Option<bool>,
    pub ironic_provision_state: Option<String>,
    pub placement_enabled: bool,
    pub netbox_id: Option<i64>,
    /// Borneo's custody state, when the device is listed.
    pub custody: Option<String>,
    /// The device's site lets the back-end flips write its switches.
    pub backend_vrf_flip_allowed: bool,
    /// `gpu_compute`, `cpu_baremetal`, `cpu_hypervisor` or `switch`: the
    /// role whose image the Nova arm installs.
    pub device_class: String,
}

impl DeviceRow {
    /// The Ironic node of the device: its infrastructure_ref (the node's
    /// uuid), or its name before one is known.
    pub fn node_ident(&self) -> String {
        self.infrastructure_ref
            .clone()
            .filter(|r| !r.trim().is_empty())
            .unwrap_or_else(|| self.name.clone())
    }
}

pub(crate) async fn devices(pool: &PgPool, ids: &[String]) -> Result<Vec<DeviceRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT d.id, d.name, d.site_id, d.inventory_only, d.operational_status, d.infrastructure_ref, \
         d.enrollment_validated_ref, d.ironic_maintenance, d.ironic_provision_state, s.placement_enabled, \
         d.netbox_id, d.custody, s.backend_vrf_flip_allowed, d.device_class \
         FROM devices d JOIN sites s ON s.id = d.site_id \
         WHERE d.id = ANY($1) AND d.deleted_at IS NULL ORDER BY d.id",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
}

pub(crate) async fn device(pool: &PgPool, id: &str) -> Result<Option<DeviceRow>, sqlx::Error> {
    Ok(devices(pool, &[id.to_string()]).await?.pop())
}

/// What a customer-facing step re-reads of the device immediately before
/// its write: its identity and proof, the two partition latches, its
/// operational status (seed 002: "the proof is read by the mutation
/// itself").
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Preflight {
    pub infrastructure_ref: Option<String>,
    pub enrollment_validated_ref: Option<String>,
    pub operational_status: String,
    pub nvlink_latch: Option<String>,
    pub backend_latch: Option<String>,
}

pub(crate) async fn preflight(pool: &PgPool, id: &str) -> Result<Option<Preflight>, sqlx::Error> {
    sqlx::query_as(
        "SELECT d.infrastructure_ref, d.enrollment_validated_ref, d.operational_status, \
         (SELECT status FROM device_conditions c WHERE c.device_id = d.id AND c.type = 'NvLinkGpusInRepairPartition') AS nvlink_latch, \
         (SELECT status FROM device_conditions c WHERE c.device_id = d.id AND c.type = 'BackendPortsInMaintenanceVrf') AS backend_latch \
         FROM devices d WHERE d.id = $1 AND d.deleted_at IS NULL",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// `(device_id, type, status)` of the devices' conditions of `types`.
pub(crate) async fn conditions(
    pool: &PgPool,
    ids: &[String],
    types: &[String],
) -> Result<Vec<(String, String, String)>, sqlx::Error> {
    if types.is_empty() {
        return Ok(vec![]);
    }
    sqlx::query_as(
        "SELECT device_id, type, status FROM device_conditions WHERE device_id = ANY($1) AND type = ANY($2)",
    )
    .bind(ids)
    .bind(types)
    .fetch_all(pool)
    .await
}

/// Devices of `ids` in a job that is not over, with that job's id: one
/// workflow per device at a time.
pub(crate) async fn busy(
    tx: &mut Transaction<'_, Postgres>,
    ids: &[String],
) -> Result<Vec<(String, String)>, sqlx::Error> {
    // Serialise job creation per device: two jobs created at once for the
    // same device cannot both pass this check.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('fleet-job-device:' || d)) FROM unnest($1::text[]) AS d ORDER BY d")
        .bind(ids)
        .execute(&mut **tx)
        .await?;
    sqlx::query_as(
        "SELECT d.device_id, d.job_id FROM job_devices d JOIN jobs j ON j.id = d.job_id \
         WHERE d.device_id = ANY($1) AND j.status IN ('pending', 'running') \
         AND (d.status IS NULL OR d.status = 'running') ORDER BY d.device_id",
    )
    .bind(ids)
    .fetch_all(&mut **tx)
    .await
}

/// What one device's run is given besides its own facts
/// (`job_devices.params`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub(crate) struct Params {
    /// The front-end VRF return: the customer VRF its ports go back into.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub customer_vrf: String,
}

/// What one step read back or did on one target (`job_devices.results`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub(crate) struct StepResult {
    pub target: String,
    pub detail: String,
    pub applied: bool,
    pub simulated: bool,
}

pub(crate) async fn insert_job(
    tx: &mut Transaction<'_, Postgres>,
    id: &str,
    workflow: &str,
    created_by: &str,
    options: &Options,
    devices: &[(String, Params)],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO jobs (id, workflow, created_by, cordon_only, options) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(workflow)
    .bind(created_by)
    .bind(options.cordon_only)
    .bind(Json(options))
    .execute(&mut **tx)
    .await?;
    let ids: Vec<&str> = devices.iter().map(|(d, _)| d.as_str()).collect();
    let params: Vec<Json<&Params>> = devices.iter().map(|(_, p)| Json(p)).collect();
    sqlx::query(
        "INSERT INTO job_devices (job_id, device_id, params) \
         SELECT $1, d, p FROM unnest($2::text[], $3::jsonb[]) AS x(d, p)",
    )
    .bind(id)
    .bind(&ids)
    .bind(&params)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct JobRow {
    pub id: String,
    pub workflow: String,
    pub status: String,
    pub created_by: String,
    pub options: Json<Options>,
    pub cancel_requested: bool,
    pub awaiting_confirmation: bool,
    pub confirmed_by: Option<String>,
    pub confirmed_at: Option<DateTime<Utc>>,
    pub confirm_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub device_count: i64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct RunRow {
    pub device_id: String,
    pub status: Option<String>,
    pub step: String,
    pub attempts: i32,
    pub pinned: serde_json::Value,
    pub params: Json<Params>,
    pub results: Json<Vec<StepResult>>,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

const JOB_COLUMNS: &str =
    "j.id, j.workflow, j.status, j.created_by, j.options, j.cancel_requested, \
    j.awaiting_confirmation, j.confirmed_by, j.confirmed_at, j.confirm_reason, \
    j.created_at, j.updated_at, j.finished_at, \
    (SELECT count(*) FROM job_devices x WHERE x.job_id = j.id) AS device_count";

const RUN_COLUMNS: &str =
    "device_id, status, step, attempts, pinned, params, results, failure_code, failure_message, \
    started_at, finished_at, updated_at";

pub(crate) async fn job<'e>(
    db: impl sqlx::PgExecutor<'e>,
    id: &str,
) -> Result<Option<JobRow>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {JOB_COLUMNS} FROM jobs j WHERE j.id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await
}

pub(crate) async fn runs<'e>(
    db: impl sqlx::PgExecutor<'e>,
    job_id: &str,
) -> Result<Vec<RunRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM job_devices WHERE job_id = $1 ORDER BY device_id"
    ))
    .bind(job_id)
    .fetch_all(db)
    .await
}

pub(crate) async fn run(
    pool: &PgPool,
    job_id: &str,
    device_id: &str,
) -> Result<Option<RunRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM job_devices WHERE job_id = $1 AND device_id = $2"
    ))
    .bind(job_id)
    .bind(device_id)
    .fetch_optional(pool)
    .await
}

pub(crate) async fn list(
    pool: &PgPool,
    status: Option<&str>,
    workflow: Option<&str>,
    after: Option<&str>,
    device: Option<&str>,
    limit: i64,
) -> Result<Vec<JobRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {JOB_COLUMNS} FROM jobs j WHERE ($1::text IS NULL OR j.status = $1) \
         AND ($2::text IS NULL OR j.workflow = $2) AND ($3::text IS NULL OR j.id < $3) \
         AND ($5::text IS NULL OR EXISTS \
              (SELECT 1 FROM job_devices x WHERE x.job_id = j.id AND x.device_id = $5)) \
         ORDER BY j.id DESC LIMIT $4"
    ))
    .bind(status)
    .bind(workflow)
    .bind(after)
    .bind(limit)
    .bind(device)
    .fetch_all(pool)
    .await
}

/// Re-aggregates `Job.status` from its devices under the job's row lock;
/// a terminal job status never changes again.
async fn aggregate(tx: &mut Transaction<'_, Postgres>, job_id: &str) -> Result<(), sqlx::Error> {
    let Some((status, cancel)): Option<(String, bool)> =
        sqlx::query_as("SELECT status, cancel_requested FROM jobs WHERE id = $1 FOR UPDATE")
            .bind(job_id)
            .fetch_optional(&mut **tx)
            .await?
    else {
        return Ok(());
    };
    if JobStatus::parse(&status).is_ok_and(|s| s.is_terminal()) {
        return Ok(());
    }
    let statuses: Vec<Option<String>> =
        sqlx::query_scalar("SELECT status FROM job_devices WHERE job_id = $1")
            .bind(job_id)
            .fetch_all(&mut **tx)
            .await?;
    let devices: Vec<Option<DeviceRunStatus>> = statuses
        .iter()
        .map(|s| s.as_deref().and_then(|s| DeviceRunStatus::parse(s).ok()))
        .collect();
    let next = job_status(&devices, cancel);
    if next.as_str() != status {
        sqlx::query(
            "UPDATE jobs SET status = $2, updated_at = now(), \
             finished_at = CASE WHEN $3 THEN now() ELSE finished_at END WHERE id = $1",
        )
        .bind(job_id)
        .bind(next.as_str())
        .bind(next.is_terminal())
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// The device starts (empty -> `running`) unless the job was cancelled
/// first or it started already. Returns whether it is running now.
pub(crate) async fn start(
    pool: &PgPool,
    job_id: &str,
    device_id: &str,
) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE job_devices d SET status = 'running', started_at = now(), updated_at = now() \
         FROM jobs j WHERE j.id = d.job_id AND d.job_id = $1 AND d.device_id = $2 \
         AND d.status IS NULL AND NOT j.cancel_requested",
    )
    .bind(job_id)
    .bind(device_id)
    .execute(&mut *tx)
    .await?;
    aggregate(&mut tx, job_id).await?;
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM job_devices WHERE job_id = $1 AND device_id = $2")
            .bind(job_id)
            .bind(device_id)
            .fetch_optional(&mut *tx)
            .await?
            .flatten();
    tx.commit().await?;
    Ok(status.as_deref() == Some("running"))
}

/// Records what a running device's run pinned and read back so far, and
/// the step it completed (which restarts its attempts): `None` when the run
/// ends (its last read is its evidence: a simulated flip's per-switch
/// results).
pub(crate) async fn record(
    pool: &PgPool,
    job_id: &str,
    device_id: &str,
    step: Option<&str>,
    pinned: &serde_json::Value,
    results: &[StepResult],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE job_devices SET step = COALESCE($3, step), \
         attempts = CASE WHEN $3::text IS NULL THEN attempts ELSE 0 END, \
         pinned = $4, results = $5, updated_at = now() \
         WHERE job_id = $1 AND device_id = $2 AND status = 'running'",
    )
    .bind(job_id)
    .bind(device_id)
    .bind(step)
    .bind(pinned)
    .bind(Json(results))
    .execute(pool)
    .await?;
    Ok(())
}

pub(crate) async fn attempt(
    pool: &PgPool,
    job_id: &str,
    device_id: &str,
    attempts: u32,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE job_devices SET attempts = $3, updated_at = now() \
         WHERE job_id = $1 AND device_id = $2 AND status = 'running'",
    )
    .bind(job_id)
    .bind(device_id)
    .bind(attempts as i32)
    .execute(pool)
    .await?;
    Ok(())
}

/// The device's terminal status (a terminal one never changes), then the
/// job's.
pub(crate) async fn finish(
    pool: &PgPool,
    job_id: &str,
    device_id: &str,
    status: DeviceRunStatus,
    failure: Option<(&str, &str)>,
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE job_devices SET status = $3, failure_code = $4, failure_message = $5, \
         finished_at = now(), updated_at = now() \
         WHERE job_id = $1 AND device_id = $2 AND (status IS NULL OR status = 'running')",
    )
    .bind(job_id)
    .bind(device_id)
    .bind(status.as_str())
    .bind(failure.map(|f| f.0))
    .bind(failure.map(|f| f.1))
    .execute(&mut *tx)
    .await?;
    aggregate(&mut tx, job_id).await?;
    tx.commit().await
}

/// Cancel: devices not started become `cancelled` at once; running ones
/// stop at their next step. Returns false when the job does not exist.
pub(crate) async fn cancel(pool: &PgPool, job_id: &str) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let found =
        sqlx::query("UPDATE jobs SET cancel_requested = true, updated_at = now() WHERE id = $1")
            .bind(job_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    if found == 0 {
        return Ok(false);
    }
    sqlx::query(
        "UPDATE job_devices SET status = 'cancelled', finished_at = now(), updated_at = now() \
         WHERE job_id = $1 AND status IS NULL",
    )
    .bind(job_id)
    .execute(&mut *tx)
    .await?;
    aggregate(&mut tx, job_id).await?;
    tx.commit().await?;
    Ok(true)
}

pub(crate) async fn cancel_requested(pool: &PgPool, job_id: &str) -> Result<bool, sqlx::Error> {
    Ok(
        sqlx::query_scalar("SELECT cancel_requested FROM jobs WHERE id = $1")
            .bind(job_id)
            .fetch_optional(pool)
            .await?
            .unwrap_or(true),
    )
}

impl RunRow {
    pub fn to_proto(&self) -> v1::JobDevice {
        v1::JobDevice {
            device_id: self.device_id.clone(),
            status: self.status.clone().unwrap_or_default(),
            step: self.step.clone(),
            attempts: self.attempts,
            failure_code: self.failure_code.clone().unwrap_or_default(),
            failure_message: self.failure_message.clone().unwrap_or_default(),
            started_at: self.started_at.map(timestamp),
            finished_at: self.finished_at.map(timestamp),
            updated_at: Some(timestamp(self.updated_at)),
            results: self
                .results
                .iter()
                .map(|r| v1::StepResult {
                    target: r.target.clone(),
                    detail: r.detail.clone(),
                    applied: r.applied,
                    simulated: r.simulated,
                })
                .collect(),
        }
    }
}

impl JobRow {
    /// The storm guard's hold, when it ever held the job (`trips` are read
    /// by the caller when it shows one job).
    pub fn storm_guard(&self, trips: Vec<v1::StormTrip>) -> Option<v1::StormGuard> {
        (self.awaiting_confirmation || self.confirmed_at.is_some()).then(|| v1::StormGuard {
            awaiting_confirmation: self.awaiting_confirmation,
            trips,
            confirmed_by: self.confirmed_by.clone().unwrap_or_default(),
            confirmed_at: self.confirmed_at.map(timestamp),
            confirm_reason: self.confirm_reason.clone().unwrap_or_default(),
        })
    }

    pub fn to_proto(&self, runs: &[RunRow]) -> v1::Job {
        v1::Job {
            id: self.id.clone(),
            workflow: self.workflow.clone(),
            status: self.status.clone(),
            created_by: self.created_by.clone(),
            cancel_requested: self.cancel_requested,
            cordon_only: self.options.cordon_only,
            force_reclaim: self.options.force_reclaim,
            release_to_customer_pool: self.options.release_to_customer_pool,
            simulate: self.options.simulate,
            run_inspection: self.options.run_inspection,
            engagement_mode: self
                .options
                .engagement_mode
                .map(|m| m.as_str().to_string())
                .unwrap_or_default(),
            created_at: Some(timestamp(self.created_at)),
            updated_at: Some(timestamp(self.updated_at)),
            finished_at: self.finished_at.map(timestamp),
            devices: runs.iter().map(RunRow::to_proto).collect(),
            device_count: self.device_count as i32,
            storm_guard: self.storm_guard(vec![]),
        }
    }
}
