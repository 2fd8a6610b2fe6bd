//! The standup pipeline of a site (seed 002, "Standup pipeline (derived UI
//! view)"): the Operational Racks matrix, derived per request from each
//! device's `operational_status` and its job history
//! ([`fleet_domain::standup::place`]), never stored. Paged by rack; a rack
//! of only switches is omitted, switches have no cell, and `inventory_only`
//! devices (which no job may touch) are left out.

use std::collections::{BTreeMap, HashMap};

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use fleet_domain::acceptance::{self, GateScope, Members};
use fleet_domain::eligibility::Workflow;
use fleet_domain::jobs::DeviceRunStatus;
use fleet_domain::standup::{self, CellStatus, Execution, GateOutcome, Stage, Suppression};
use fleet_domain::{DeviceClass, HealthStatus, OperationalStatus};
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{Array, ArrayBuilder};
use utoipa::{IntoParams, ToSchema};

use crate::config::AcceptancePolicy;
use crate::error::{ApiError, ApiResult, P, Q};
use crate::jobs::{device_status_schema, workflow_schema};
use crate::model::{
    device_class_schema, gate_outcome_schema, gate_scope_schema, operational_status_schema,
    stage_schema, stage_status_schema, suppression_schema,
};
use crate::page::{self, Page};
use crate::App;

fn workflows_schema() -> Array {
    ArrayBuilder::new().items(workflow_schema()).build()
}

fn suppressions_schema() -> Array {
    ArrayBuilder::new().items(suppression_schema()).build()
}

fn stages_schema() -> Array {
    ArrayBuilder::new().items(stage_schema()).build()
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PipelineFilter {
    /// Racks per page.
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

/// One page of a site's racks, each with its devices' cells.
#[derive(Debug, Serialize, ToSchema)]
pub struct StandupPipeline {
    pub site_id: String,
    /// The columns, in order.
    #[schema(schema_with = stages_schema)]
    pub stages: Vec<Stage>,
    pub racks: Vec<StandupRack>,
    /// `null` on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StandupRack {
    /// Empty for devices without a rack.
    pub rack: String,
    /// Devices per column and cell status.
    pub cells: BTreeMap<String, BTreeMap<String, i64>>,
    pub devices: Vec<StandupCell>,
}

/// Where one device stands.
#[derive(Debug, Serialize, ToSchema)]
pub struct StandupCell {
    pub device_id: String,
    pub name: String,
    #[schema(schema_with = device_class_schema)]
    pub device_class: String,
    #[schema(schema_with = operational_status_schema)]
    pub operational_status: String,
    /// The column: the stage the device is at or awaiting.
    #[schema(schema_with = stage_schema)]
    pub stage: Stage,
    #[schema(schema_with = stage_status_schema)]
    pub status: CellStatus,
    /// The workflows a job may be submitted for from this cell (the jobs
    /// API stays authoritative for eligibility).
    #[schema(schema_with = workflows_schema)]
    pub available_actions: Vec<Workflow>,
    /// At least one whenever `available_actions` is empty.
    #[schema(schema_with = suppressions_schema)]
    pub action_suppression_reasons: Vec<Suppression>,
    /// The newest execution of any stage of the device's sequence,
    /// interrupted ones included.
    pub latest_in_sequence_workflow: Option<StandupExecution>,
    /// The execution whose result placed the cell (a failed cell's failure
    /// detail).
    pub placed_by: Option<StandupExecution>,
    /// The site's (or pool's) acceptance gates for the device and how each
    /// evaluates now; kept as evidence after the device moved on.
    pub acceptance_gates: Vec<StandupGate>,
}

/// One acceptance gate of a device, evaluated per request.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StandupGate {
    pub name: String,
    #[schema(schema_with = stage_schema)]
    pub stage: Stage,
    #[schema(schema_with = gate_scope_schema)]
    pub scope: GateScope,
    #[schema(schema_with = gate_outcome_schema)]
    pub outcome: GateOutcome,
}

/// One device's run in a job.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StandupExecution {
    pub job_id: String,
    #[schema(schema_with = workflow_schema)]
    pub workflow: Workflow,
    /// `null` until the job starts the device.
    #[schema(schema_with = device_status_schema)]
    pub status: Option<DeviceRunStatus>,
    pub created_at: DateTime<Utc>,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
}

#[derive(sqlx::FromRow)]
struct DeviceRow {
    id: String,
    name: String,
    rack: String,
    device_class: String,
    operational_status: String,
    health_status: String,
    pool_id: Option<String>,
}

#[derive(sqlx::FromRow)]
struct ExecutionRow {
    device_id: String,
    job_id: String,
    workflow: String,
    status: Option<String>,
    created_at: DateTime<Utc>,
    failure_code: Option<String>,
    failure_message: Option<String>,
}

impl ExecutionRow {
    fn out(&self) -> ApiResult<StandupExecution> {
        Ok(StandupExecution {
            job_id: self.job_id.clone(),
            workflow: Workflow::parse(&self.workflow).map_err(stored)?,
            status: self
                .status
                .as_deref()
                .map(DeviceRunStatus::parse)
                .transpose()
                .map_err(stored)?,
            created_at: self.created_at,
            failure_code: self.failure_code.clone(),
            failure_message: self.failure_message.clone(),
        })
    }
}

/// A stored value outside its vocabulary: the schema's CHECKs make this a
/// bug, never the caller's fault. Logged; the caller is told no more.
fn stored(e: fleet_domain::DomainError) -> ApiError {
    tracing::error!(error = %e, "standup pipeline: a stored value is outside its vocabulary");
    ApiError::unavailable("the standup pipeline cannot be derived from what is stored")
}

/// The Operational Racks matrix of a site.
#[utoipa::path(get, path = "/api/v1/sites/{id}/standup-pipeline/",
    params(("id" = String, Path), PipelineFilter),
    responses((status = 200, body = StandupPipeline), (status = 400, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody)),
    tag = "sites")]
pub async fn pipeline(
    State(app): State<App>,
    P(id): P<String>,
    Q(f): Q<PipelineFilter>,
) -> ApiResult<Json<StandupPipeline>> {
    let page: Page<(String,)> = Page::new(&app, f.limit, f.cursor.as_deref())?;
    crate::sites::require(&app, &id).await?;
    const IN_PIPELINE: &str = "d.site_id = $1 AND d.deleted_at IS NULL AND NOT d.inventory_only \
                               AND d.device_class <> 'switch'";
    let racks: Vec<String> = sqlx::query_scalar(&format!(
        "SELECT DISTINCT COALESCE(d.rack, '') AS rack FROM devices d \
         WHERE {IN_PIPELINE} AND ($2::text IS NULL OR COALESCE(d.rack, '') > $2) \
         ORDER BY 1 LIMIT $3"
    ))
    .bind(&id)
    .bind(page.after.map(|a| a.0))
    .bind(page.limit + 1)
    .fetch_all(&app.pool)
    .await?;
    let (racks, next_cursor) = page::finish(racks, page.limit, |r| (r.clone(),));
    let devices: Vec<DeviceRow> = sqlx::query_as(&format!(
        "SELECT d.id, d.name, COALESCE(d.rack, '') AS rack, d.device_class, d.operational_status, \
                d.health_status, d.pool_id \
         FROM devices d WHERE {IN_PIPELINE} AND COALESCE(d.rack, '') = ANY($2) \
         ORDER BY 3, d.name, d.id"
    ))
    .bind(&id)
    .bind(&racks)
    .fetch_all(&app.pool)
    .await?;
    let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    let workflows: Vec<&str> = Stage::ALL.iter().map(|s| s.workflow().as_str()).collect();
    let rows: Vec<ExecutionRow> = sqlx::query_as(
        "SELECT jd.device_id, j.id AS job_id, j.workflow, jd.status, j.created_at, \
                jd.failure_code, jd.failure_message \
         FROM job_devices jd JOIN jobs j ON j.id = jd.job_id \
         WHERE jd.device_id = ANY($1) AND j.workflow = ANY($2)",
    )
    .bind(&ids)
    .bind(&workflows)
    .fetch_all(&app.pool)
    .await?;
    let mut by_device: HashMap<&str, Vec<&ExecutionRow>> = HashMap::new();
    for r in &rows {
        by_device.entry(r.device_id.as_str()).or_default().push(r);
    }
    let policy = app.config.standup.sites.get(&id);
    let pools = pool_members(&app, &id, policy, &devices).await?;
    let mut out: Vec<StandupRack> = Vec::new();
    // Devices come sorted by rack: one row per run of a rack.
    for rack_devices in devices.chunk_by(|a, b| a.rack == b.rack) {
        let mut rack = StandupRack {
            rack: rack_devices[0].rack.clone(),
            cells: BTreeMap::new(),
            devices: Vec::with_capacity(rack_devices.len()),
        };
        let mut read = Vec::with_capacity(rack_devices.len());
        for d in rack_devices {
            let history = by_device.remove(d.id.as_str()).unwrap_or_default();
            read.push(Read::of(d, &history)?);
        }
        // The rack's collective gates: every device of the rack (all of it
        // is on this page) whose sequence has the stage.
        let rack_members = |stage: Stage| {
            let mut m = Members::default();
            for r in read.iter().filter(|r| has_stage(r.class, policy, stage)) {
                m.add(acceptance::newest_result(&r.executions, stage));
            }
            (!rack.rack.is_empty()).then_some(m)
        };
        let by_rack: HashMap<Stage, Option<Members>> =
            [Stage::SingleNodeTest, Stage::MultiNodeTest]
                .into_iter()
                .map(|s| (s, rack_members(s)))
                .collect();
        for r in &read {
            let gates = gates_of(r, policy, &by_rack, &pools);
            let Some(cell) = cell_of(r, policy.is_some(), gates) else {
                continue;
            };
            *rack
                .cells
                .entry(cell.stage.as_str().to_string())
                .or_default()
                .entry(cell.status.as_str().to_string())
                .or_default() += 1;
            rack.devices.push(cell);
        }
        out.push(rack);
    }
    Ok(Json(StandupPipeline {
        site_id: id,
        stages: Stage::ALL.to_vec(),
        racks: out,
        next_cursor,
    }))
}

/// One device as read, its history in the domain's terms.
struct Read<'a> {
    row: &'a DeviceRow,
    class: DeviceClass,
    operational: OperationalStatus,
    health: HealthStatus,
    history: Vec<StandupExecution>,
    executions: Vec<Execution>,
}

impl<'a> Read<'a> {
    fn of(row: &'a DeviceRow, history: &[&ExecutionRow]) -> ApiResult<Read<'a>> {
        let history = history
            .iter()
            .map(|r| r.out())
            .collect::<ApiResult<Vec<_>>>()?;
        let executions = history
            .iter()
            .map(|o| Execution {
                job_id: o.job_id.clone(),
                workflow: o.workflow,
                status: o.status,
                created_at: o.created_at,
            })
            .collect();
        Ok(Read {
            row,
            class: DeviceClass::parse(&row.device_class).map_err(stored)?,
            operational: OperationalStatus::parse(&row.operational_status).map_err(stored)?,
            health: HealthStatus::parse(&row.health_status).map_err(stored)?,
            history,
            executions,
        })
    }
}

/// Whether a device of `class` at a site with `policy` runs `stage`.
fn has_stage(class: DeviceClass, policy: Option<&AcceptancePolicy>, stage: Stage) -> bool {
    standup::sequence(class, policy.is_some()).is_some_and(|s| s.contains(&stage))
}

/// The classes whose sequence at the site has `stage`.
fn classes_with(policy: Option<&AcceptancePolicy>, stage: Stage) -> Vec<&'static str> {
    DeviceClass::ALL
        .iter()
        .filter(|&&c| has_stage(c, policy, stage))
        .map(|c| c.as_str())
        .collect()
}

/// The device's gates, each evaluated.
fn gates_of(
    r: &Read<'_>,
    policy: Option<&AcceptancePolicy>,
    by_rack: &HashMap<Stage, Option<Members>>,
    pools: &HashMap<(String, Stage), Members>,
) -> Vec<StandupGate> {
    let Some(policy) = policy else {
        return Vec::new();
    };
    let pool = r.row.pool_id.as_deref();
    policy
        .gates_for(pool)
        .iter()
        .filter(|g| has_stage(r.class, Some(policy), g.stage))
        .map(|g| StandupGate {
            name: g.name.clone(),
            stage: g.stage,
            scope: g.scope,
            outcome: match g.scope {
                GateScope::Device => acceptance::device_gate(r.health),
                GateScope::Rack => {
                    acceptance::collective_gate(by_rack.get(&g.stage).copied().flatten())
                }
                GateScope::Pool => acceptance::collective_gate(pool.map(|p| {
                    pools
                        .get(&(p.to_string(), g.stage))
                        .copied()
                        .unwrap_or_default()
                })),
            },
        })
        .collect()
}

/// The members of every pool of the page that a `pool` gate reads, per
/// stage: one aggregate over the whole pool (it spans racks and pages).
async fn pool_members(
    app: &App,
    site: &str,
    policy: Option<&AcceptancePolicy>,
    devices: &[DeviceRow],
) -> ApiResult<HashMap<(String, Stage), Members>> {
    let mut out = HashMap::new();
    let Some(policy) = policy else {
        return Ok(out);
    };
    for stage in [Stage::SingleNodeTest, Stage::MultiNodeTest] {
        let pools: Vec<&str> = {
            let mut p: Vec<&str> = devices
                .iter()
                .filter_map(|d| d.pool_id.as_deref())
                .filter(|p| {
                    policy
                        .gates_for(Some(p))
                        .iter()
                        .any(|g| g.stage == stage && g.scope == GateScope::Pool)
                })
                .collect();
            p.sort_unstable();
            p.dedup();
            p
        };
        if pools.is_empty() {
            continue;
        }
        let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
            "SELECT d.pool_id, count(*), \
                    count(*) FILTER (WHERE r.status = 'succeeded'), \
                    count(*) FILTER (WHERE r.status = 'failed') \
             FROM devices d LEFT JOIN LATERAL ( \
                 SELECT jd.status FROM job_devices jd JOIN jobs j ON j.id = jd.job_id \
                 WHERE jd.device_id = d.id AND j.workflow = $4 \
                   AND (jd.status IS NULL OR jd.status NOT IN ('cancelled', 'terminated', 'superseded')) \
                 ORDER BY j.created_at DESC, j.id DESC LIMIT 1) r ON true \
             WHERE d.site_id = $1 AND d.deleted_at IS NULL AND NOT d.inventory_only \
               AND d.device_class = ANY($2) AND d.pool_id = ANY($3) \
             GROUP BY d.pool_id",
        )
        .bind(site)
        .bind(classes_with(Some(policy), stage))
        .bind(&pools)
        .bind(stage.workflow().as_str())
        .fetch_all(&app.pool)
        .await?;
        for (pool, total, succeeded, failed) in rows {
            out.insert(
                (pool, stage),
                Members {
                    total: total as usize,
                    succeeded: succeeded as usize,
                    failed: failed as usize,
                },
            );
        }
    }
    Ok(out)
}

/// The cell of one device; `None` for one without a sequence (a switch,
/// which the query already leaves out).
fn cell_of(r: &Read<'_>, acceptance_policy: bool, gates: Vec<StandupGate>) -> Option<StandupCell> {
    let evaluated: Vec<standup::Gate> = gates
        .iter()
        .map(|g| standup::Gate {
            stage: g.stage,
            name: g.name.clone(),
            outcome: g.outcome,
        })
        .collect();
    let c = standup::place(&standup::Device {
        class: r.class,
        acceptance_policy,
        operational_status: r.operational,
        executions: &r.executions,
        gates: &evaluated,
    })?;
    let detail = |e: Option<Execution>| {
        e.and_then(|e| r.history.iter().find(|o| o.job_id == e.job_id).cloned())
    };
    let d = r.row;
    Some(StandupCell {
        device_id: d.id.clone(),
        name: d.name.clone(),
        device_class: d.device_class.clone(),
        operational_status: d.operational_status.clone(),
        stage: c.stage,
        status: c.status,
        available_actions: c.available_actions,
        action_suppression_reasons: c.action_suppression_reasons,
        latest_in_sequence_workflow: detail(c.latest_in_sequence_workflow),
        placed_by: detail(c.placed_by),
        acceptance_gates: gates,
    })
}
