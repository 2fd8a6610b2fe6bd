//! Devices: the filtered list, the detail, the lifecycle log, and the
//! device commands (each a hub command carrying the version the caller read).

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use fleet_domain::predicates::{CUSTOMER_READY_SQL, SCHEDULABLE_BUCKET_SQL, SCHEDULABLE_SQL};
use fleet_domain::slurm::SlurmState;
use fleet_domain::*;
use fleet_proto::v1;
use serde::Deserialize;
use sqlx::{Postgres, QueryBuilder};
use utoipa::{IntoParams, ToSchema};
use v1::hub_command::Command as C;

use crate::auth::Caller;
use crate::call::Call;
use crate::error::{ApiError, ApiResult, J, P, Q};
use crate::model::*;
use crate::page::{Keyset, Page};
use crate::{conditions, db, page, App};

/// The list and detail columns over `devices d LEFT JOIN pools p`, with the
/// predicates derived by the domain's SQL.
pub fn summary_columns() -> String {
    format!(
        "d.id, d.name, d.site_id, d.pool_id, d.rack, d.device_class, d.role, d.trust, d.version, \
         d.provision_state, d.maintenance, d.cordoned, d.power, d.connectivity, d.inventory_status, \
         d.operational_status, d.health_status, d.in_triage, d.inventory_only, d.impairment_hold, \
         d.slurm_states, d.no_schedule_reasons, d.updated_at, \
         {CUSTOMER_READY_SQL} AS customer_ready, \
         {SCHEDULABLE_BUCKET_SQL} AS capacity_bucket, \
         ({SCHEDULABLE_BUCKET_SQL} = 'schedulable') AS schedulable"
    )
}

const DETAIL_COLUMNS: &str = "d.serial, d.netbox_id, d.bmc_address, d.infrastructure_ref, \
    d.owner_tenant_id, d.adapter, d.drivers, d.hardware_key_trusted, d.generation, \
    d.observed_generation, d.identity_generation, d.labels, d.annotations, d.failed_from, \
    d.maintenance_reason, d.cordon_reason, d.draining, d.taints, d.triage_ticket_url, \
    d.parent_ticket_url, d.entered_triage_at, d.custody, d.enrollment_validated_ref, \
    d.enrollment_proof_source, d.enrollment_proof_at, d.entered_service_at, d.failure_state, \
    d.failed_at, d.ironic_provision_state, d.ironic_maintenance, d.ironic_maintenance_reason, \
    d.ironic_instance_uuid, d.ironic_lessee, d.netbox_tags, d.chassis_health, d.session_epoch, \
    d.session_gateway_id, d.session_connected_at, d.session_disconnected_at, d.session_last_seen, \
    d.created_at";

crate::page::page_query! {
    /// Filters of `GET /api/v1/devices/`. Status filters take one value or a
    /// comma-separated list (any of them matches).
    pub struct DeviceFilter {
        pub site: Option<String>,
        pub pool: Option<String>,
        #[param(schema_with = inventory_status_schema)]
        pub inventory_status: Option<String>,
        #[param(schema_with = operational_status_schema)]
        pub operational_status: Option<String>,
        #[param(schema_with = health_status_schema)]
        pub health_status: Option<String>,
        /// SLURM state tokens, comma-separated: devices carrying any of them.
        #[param(schema_with = slurm_state_schema)]
        pub slurm_states: Option<String>,
        pub in_triage: Option<bool>,
        pub inventory_only: Option<bool>,
        pub customer_ready: Option<bool>,
        pub schedulable: Option<bool>,
        pub cordoned: Option<bool>,
        pub maintenance: Option<bool>,
        #[param(schema_with = connectivity_schema)]
        pub connectivity: Option<String>,
        /// `<resource>:<resolution_status>`, e.g. `placement:stale`: devices
        /// with a resource binding of that resource in that status.
        pub resource_binding: Option<String>,
    }
}

/// A comma-separated list of one vocabulary, each value checked.
fn values<T>(
    raw: &Option<String>,
    parse: impl Fn(&str) -> Result<T, DomainError>,
) -> ApiResult<Option<Vec<String>>> {
    let Some(raw) = raw else { return Ok(None) };
    let mut out = Vec::new();
    for v in raw.split(',').map(str::trim) {
        parse(v)?;
        out.push(v.to_string());
    }
    Ok(Some(out))
}

fn push_bool(qb: &mut QueryBuilder<'_, Postgres>, expr: &str, v: Option<bool>) {
    if let Some(v) = v {
        qb.push(" AND ");
        if !v {
            qb.push("NOT ");
        }
        qb.push(expr);
    }
}

#[utoipa::path(get, operation_id = "list_devices", path = "/api/v1/devices/", params(DeviceFilter),
    responses((status = 200, body = DevicePage), (status = 400, body = crate::error::ErrorBody)),
    tag = "devices")]
pub async fn list(State(app): State<App>, Q(f): Q<DeviceFilter>) -> ApiResult<Json<DevicePage>> {
    let page = f.page(&app)?;
    let inventory = values(&f.inventory_status, InventoryStatus::parse)?;
    let operational = values(&f.operational_status, OperationalStatus::parse)?;
    let health = values(&f.health_status, HealthStatus::parse)?;
    let connectivity = values(&f.connectivity, Connectivity::parse)?;
    let slurm = values(&f.slurm_states, SlurmState::parse)?;
    let binding = f
        .resource_binding
        .as_deref()
        .map(crate::bindings::parse_filter)
        .transpose()?;

    let mut qb = QueryBuilder::<Postgres>::new("SELECT ");
    qb.push(summary_columns());
    qb.push(" FROM devices d LEFT JOIN pools p ON p.id = d.pool_id WHERE d.deleted_at IS NULL");
    if let Some(site) = &f.site {
        qb.push(" AND d.site_id = ").push_bind(site.clone());
    }
    if let Some(pool) = &f.pool {
        qb.push(" AND d.pool_id = ").push_bind(pool.clone());
    }
    for (column, vals) in [
        ("d.inventory_status", inventory),
        ("d.operational_status", operational),
        ("d.health_status", health),
        ("d.connectivity", connectivity),
    ] {
        match vals.as_deref() {
            None => {}
            // Equality (not ANY) lets the planner use the (site, status, id) index.
            Some([one]) => {
                qb.push(format!(" AND {column} = ")).push_bind(one.clone());
            }
            Some(_) => {
                qb.push(format!(" AND {column} = ANY("))
                    .push_bind(vals)
                    .push(")");
            }
        }
    }
    if let Some(tokens) = slurm {
        qb.push(" AND d.slurm_states && ")
            .push_bind(tokens)
            .push("::text[]");
    }
    push_bool(&mut qb, "d.in_triage", f.in_triage);
    push_bool(&mut qb, "d.inventory_only", f.inventory_only);
    push_bool(&mut qb, "d.cordoned", f.cordoned);
    push_bool(&mut qb, "d.maintenance", f.maintenance);
    push_bool(&mut qb, CUSTOMER_READY_SQL, f.customer_ready);
    push_bool(&mut qb, SCHEDULABLE_SQL, f.schedulable);
    if let Some(b) = binding {
        crate::bindings::push_filter(&mut qb, &app, b);
    }
    let (items, next_cursor) = page
        .fetch(
            &app,
            qb,
            Keyset::ascending(&["d.id"]),
            |d: &DeviceSummary| (d.id.clone(),),
        )
        .await?;
    Ok(Json(DevicePage { items, next_cursor }))
}

/// The device as the read model holds it, or `NOT_FOUND`.
pub async fn read_detail(app: &App, id: &str) -> ApiResult<DeviceDetail> {
    let sql = format!(
        "SELECT {}, {DETAIL_COLUMNS} FROM devices d LEFT JOIN pools p ON p.id = d.pool_id \
         WHERE d.id = $1 AND d.deleted_at IS NULL",
        summary_columns()
    );
    let mut d: DeviceDetail = db::one(app, &sql, id, "device").await?;
    d.operational_status_conditions = conditions::decisive_rows(app, id).await?;
    d.resource_bindings = crate::bindings::of_device(app, id).await?;
    Ok(d)
}

#[utoipa::path(get, operation_id = "get_device", path = "/api/v1/devices/{id}/", params(("id" = String, Path)),
    responses((status = 200, body = DeviceDetail), (status = 404, body = crate::error::ErrorBody)),
    tag = "devices")]
pub async fn detail(State(app): State<App>, P(id): P<String>) -> ApiResult<Json<DeviceDetail>> {
    Ok(Json(read_detail(&app, &id).await?))
}

crate::page::page_query! {
    pub struct LifecycleQuery {
        #[param(schema_with = axis_schema)]
        pub kind: Option<String>,
    }
}

/// Newest first; `ended_at` is the next row of the same kind, computed by a
/// window over the whole (kind-filtered) history before paging, so it is
/// right on every page.
#[utoipa::path(get, path = "/api/v1/devices/{id}/lifecycle-events/",
    params(("id" = String, Path), LifecycleQuery),
    responses((status = 200, body = LifecyclePage), (status = 404, body = crate::error::ErrorBody)),
    tag = "devices")]
pub async fn lifecycle(
    State(app): State<App>,
    P(id): P<String>,
    Q(q): Q<LifecycleQuery>,
) -> ApiResult<Json<LifecyclePage>> {
    let limit = page::limit(&app, q.limit)?;
    if let Some(k) = &q.kind {
        Axis::parse(k)?;
    }
    let page: Page<(DateTime<Utc>, i64)> = Page {
        limit,
        after: page::decode(q.cursor.as_deref())?,
    };
    db::require(&app, "devices", &id, "device").await?;
    let mut qb = QueryBuilder::<Postgres>::new(
        "SELECT * FROM (SELECT id, kind, value, cause, created_at, \
         lead(created_at) OVER (PARTITION BY kind ORDER BY created_at, id) AS ended_at \
         FROM device_lifecycle_events WHERE device_id = ",
    );
    qb.push_bind(id.clone());
    if let Some(k) = &q.kind {
        qb.push(" AND kind = ").push_bind(k.clone());
    }
    qb.push(") e WHERE true");
    let newest_first = Keyset::descending(&["e.created_at", "e.id"]);
    let (items, next_cursor) = page
        .fetch(&app, qb, newest_first, |e: &LifecycleEvent| {
            (e.created_at, e.id)
        })
        .await?;
    Ok(Json(LifecyclePage { items, next_cursor }))
}

// ------------------------------------------------------------- commands

/// The version the caller read.
#[derive(Debug, Deserialize, ToSchema, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct VersionBody {
    pub version: i64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasonBody {
    pub version: i64,
    pub reason: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaintBody {
    pub version: i64,
    /// `[a-z0-9][a-z0-9._/-]*`, at most 63 characters.
    pub key: String,
    #[schema(schema_with = taint_action_schema)]
    pub action: String,
}

pub fn taint_action_schema() -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(["add", "remove"]))
        .build()
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProvisionBody {
    pub version: i64,
    #[schema(schema_with = provision_state_schema)]
    pub to: String,
}

fn version(v: i64) -> ApiResult<i64> {
    if v < 1 {
        return Err(ApiError::invalid(
            "version is required: pass the version you read (at least 1)",
        ));
    }
    Ok(v)
}

/// Parses the hub's device record.
async fn device_command(
    app: &App,
    caller: &Caller,
    expected_version: i64,
    command: C,
) -> ApiResult<Json<DeviceChange>> {
    let reply = app
        .hub
        .command(&caller.token_id, expected_version, command)
        .await?;
    Ok(Json(crate::hub::device(
        reply.device().map_err(crate::hub::unreadable)?,
    )))
}

impl Call {
    /// The command `command` makes of the device's id, at the version the
    /// caller read.
    async fn versioned(
        self,
        read_version: i64,
        command: impl FnOnce(String) -> C,
    ) -> ApiResult<Json<DeviceChange>> {
        let v = version(read_version)?;
        device_command(&self.app, &self.caller, v, command(self.id)).await
    }

    /// A versioned command that carries the caller's reason.
    async fn with_reason(
        self,
        b: ReasonBody,
        command: impl FnOnce(String, String) -> C,
    ) -> ApiResult<Json<DeviceChange>> {
        self.versioned(b.version, |id| command(id, b.reason)).await
    }

    /// A versioned command after which the device's certificates no longer
    /// work: its old sessions end before the caller gets the answer.
    async fn ending_sessions(
        self,
        read_version: i64,
        command: impl FnOnce(String) -> C,
    ) -> ApiResult<Json<DeviceChange>> {
        let (app, id) = (self.app.clone(), self.id.clone());
        let change = self.versioned(read_version, command).await?;
        end_sessions(&app, &id).await;
        Ok(change)
    }
}

#[utoipa::path(post, path = "/api/v1/devices/{id}/cordon", params(("id" = String, Path)),
    request_body = ReasonBody,
    responses((status = 200, body = DeviceChange), (status = 409, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "devices")]
pub async fn cordon(call: Call, J(b): J<ReasonBody>) -> ApiResult<Json<DeviceChange>> {
    let cordon = |device_id, reason| C::Cordon(v1::Cordon { device_id, reason });
    call.with_reason(b, cordon).await
}

#[utoipa::path(post, path = "/api/v1/devices/{id}/uncordon", params(("id" = String, Path)),
    request_body = VersionBody,
    responses((status = 200, body = DeviceChange), (status = 409, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "devices")]
pub async fn uncordon(call: Call, J(b): J<VersionBody>) -> ApiResult<Json<DeviceChange>> {
    let uncordon = |device_id| C::Uncordon(v1::Uncordon { device_id });
    call.versioned(b.version, uncordon).await
}

#[utoipa::path(post, path = "/api/v1/devices/{id}/drain", params(("id" = String, Path)),
    request_body = ReasonBody,
    responses((status = 200, body = DeviceChange), (status = 409, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "devices")]
pub async fn drain(call: Call, J(b): J<ReasonBody>) -> ApiResult<Json<DeviceChange>> {
    let drain = |device_id, reason| C::Drain(v1::Drain { device_id, reason });
    call.with_reason(b, drain).await
}

#[utoipa::path(post, path = "/api/v1/devices/{id}/taints", params(("id" = String, Path)),
    request_body = TaintBody,
    responses((status = 200, body = DeviceChange), (status = 409, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "devices")]
pub async fn taints(call: Call, J(b): J<TaintBody>) -> ApiResult<Json<DeviceChange>> {
    let v = version(b.version)?;
    let remove = match b.action.as_str() {
        "add" => false,
        "remove" => true,
        other => {
            return Err(ApiError::invalid(format!(
                "action must be add or remove, not {other:?}"
            )))
        }
    };
    let c = C::Taint(v1::Taint {
        device_id: call.id,
        key: b.key,
        remove,
    });
    device_command(&call.app, &call.caller, v, c).await
}

#[utoipa::path(post, path = "/api/v1/devices/{id}/adopt", params(("id" = String, Path)),
    request_body = VersionBody,
    responses((status = 200, body = DeviceChange), (status = 409, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "devices")]
pub async fn adopt(call: Call, J(b): J<VersionBody>) -> ApiResult<Json<DeviceChange>> {
    let adopt = |device_id| C::Adopt(v1::Adopt { device_id });
    call.versioned(b.version, adopt).await
}

#[utoipa::path(post, path = "/api/v1/devices/{id}/provision", params(("id" = String, Path)),
    request_body = ProvisionBody,
    responses((status = 200, body = DeviceChange), (status = 409, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "devices")]
pub async fn provision(call: Call, J(b): J<ProvisionBody>) -> ApiResult<Json<DeviceChange>> {
    let v = version(b.version)?;
    ProvisionState::parse(&b.to)?;
    let c = C::Provision(v1::ProvisionMove {
        device_id: call.id,
        to: b.to,
    });
    device_command(&call.app, &call.caller, v, c).await
}

/// Seed 002: "promote-to-managed is an explicit audited operation": an
/// inventory-only device becomes managed. The reason and the caller are
/// kept in the lifecycle row (`inventory_only` -> `false`).
#[utoipa::path(post, path = "/api/v1/devices/{id}/promote-to-managed", params(("id" = String, Path)),
    request_body = ReasonBody,
    responses((status = 200, body = DeviceChange), (status = 400, body = crate::error::ErrorBody),
        (status = 409, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)),
    tag = "devices")]
pub async fn promote_to_managed(call: Call, J(b): J<ReasonBody>) -> ApiResult<Json<DeviceChange>> {
    let promote =
        |device_id, reason| C::PromoteToManaged(v1::PromoteToManaged { device_id, reason });
    call.with_reason(b, promote).await
}

#[utoipa::path(post, path = "/api/v1/devices/{id}/revoke-identity", params(("id" = String, Path)),
    request_body = VersionBody,
    responses((status = 200, body = DeviceChange), (status = 409, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "devices")]
pub async fn revoke_identity(call: Call, J(b): J<VersionBody>) -> ApiResult<Json<DeviceChange>> {
    let revoke = |device_id| C::RevokeIdentity(v1::RevokeIdentity { device_id });
    call.ending_sessions(b.version, revoke).await
}

/// Seed 000: "Certificates of an earlier generation never work again": the
/// old session ends before the operator gets the answer. A gateway that
/// does not answer ends it at its next identity check, and the hub refuses
/// its heartbeats of the old generation meanwhile.
async fn end_sessions(app: &App, device_id: &str) {
    match app.hub.end_sessions(device_id).await {
        Ok(ended) => tracing::debug!(
            device_id,
            replicas = ended.replicas,
            closed = ended.closed,
            "old sessions ended"
        ),
        Err(e) => {
            tracing::warn!(device_id, error = %e, "could not end the old sessions now; the gateways' identity check will")
        }
    }
}

#[utoipa::path(delete, path = "/api/v1/devices/{id}/", params(("id" = String, Path), VersionBody),
    responses((status = 200, body = DeviceChange), (status = 409, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "devices")]
pub async fn delete(call: Call, Q(b): Q<VersionBody>) -> ApiResult<Json<DeviceChange>> {
    let delete = |device_id| C::DeleteDevice(v1::DeleteDevice { device_id });
    call.ending_sessions(b.version, delete).await
}

/// Set or clear `in_triage` for a list of devices, in one hub transaction.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TriageBody {
    pub device_ids: Vec<String>,
    pub in_triage: bool,
    pub triage_ticket_url: Option<String>,
    /// Set once and left alone across triage cycles.
    pub parent_ticket_url: Option<String>,
}

#[utoipa::path(post, path = "/api/v1/devices/triage/", request_body = TriageBody,
    responses((status = 200, body = Vec<DeviceChange>), (status = 404, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "devices")]
pub async fn triage(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    J(b): J<TriageBody>,
) -> ApiResult<Json<Vec<DeviceChange>>> {
    if b.device_ids.is_empty() || b.device_ids.len() > 1000 {
        return Err(ApiError::invalid("device_ids must name 1 to 1000 devices"));
    }
    if b.device_ids.iter().any(|d| d.trim().is_empty()) {
        return Err(ApiError::invalid("device_ids must not contain empty ids"));
    }
    let c = C::Triage(v1::Triage {
        device_ids: b.device_ids,
        in_triage: b.in_triage,
        triage_ticket_url: b.triage_ticket_url.unwrap_or_default(),
        parent_ticket_url: b.parent_ticket_url.unwrap_or_default(),
    });
    let reply = app.hub.command(&caller.token_id, 0, c).await?;
    let devices = reply.devices().map_err(crate::hub::unreadable)?;
    Ok(Json(devices.into_iter().map(crate::hub::device).collect()))
}

/// Seed 002, "Enrollment identity proof": written by the workflow service.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnrollmentProofBody {
    /// `enrolled` (a qualifying typed completion) or `failed` (a started
    /// non-success, guarded by the pinned identity).
    #[schema(schema_with = proof_outcome_schema)]
    pub outcome: String,
    /// The validated infrastructure_ref (for `enrolled`).
    pub result_ref: Option<String>,
    pub proof_source: Option<String>,
    /// The identity the workflow pinned (for `failed`).
    pub pinned_infrastructure_ref: Option<String>,
    /// Optional: when given, a changed device is `CONFLICT`.
    pub version: Option<i64>,
}

pub fn proof_outcome_schema() -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(["enrolled", "failed"]))
        .build()
}

#[utoipa::path(post, path = "/api/v1/devices/{id}/enrollment-proof", params(("id" = String, Path)),
    request_body = EnrollmentProofBody,
    responses((status = 200, body = DeviceChange), (status = 404, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "devices")]
pub async fn enrollment_proof(
    call: Call,
    J(b): J<EnrollmentProofBody>,
) -> ApiResult<Json<DeviceChange>> {
    if !matches!(b.outcome.as_str(), "enrolled" | "failed") {
        return Err(ApiError::invalid(format!(
            "outcome must be enrolled or failed, not {:?}",
            b.outcome
        )));
    }
    let v = match b.version {
        Some(v) => version(v)?,
        None => 0,
    };
    let c = C::EnrollmentProof(v1::EnrollmentProof {
        device_id: call.id,
        outcome: b.outcome,
        result_ref: b.result_ref.unwrap_or_default(),
        proof_source: b.proof_source.unwrap_or_default(),
        pinned_infrastructure_ref: b.pinned_infrastructure_ref.unwrap_or_default(),
    });
    device_command(&call.app, &call.caller, v, c).await
}

/// A device to create, as NetBox's import would (`POST /api/v1/devices/`).
/// Every vocabulary value is checked by the hub; absent values take the
/// hub's defaults (`gpu_compute`, `platform`, inventory `unknown`,
/// provision `adopting`, the role from the pool's kind). A device created
/// at an inventory-only site is inventory-only.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDeviceBody {
    pub site_id: String,
    pub name: String,
    pub serial: Option<String>,
    pub netbox_id: Option<i64>,
    pub bmc_address: Option<String>,
    pub infrastructure_ref: Option<String>,
    pub pool_id: Option<String>,
    pub owner_tenant_id: Option<String>,
    pub rack: Option<String>,
    pub device_class: Option<String>,
    pub role: Option<String>,
    pub trust: Option<String>,
    pub inventory_status: Option<String>,
    pub provision_state: Option<String>,
    #[serde(default)]
    pub labels: std::collections::HashMap<String, String>,
}

#[utoipa::path(post, operation_id = "create_device", path = "/api/v1/devices/", request_body = CreateDeviceBody,
    responses((status = 201, body = DeviceChange), (status = 400, body = crate::error::ErrorBody),
        (status = 404, description = "No such site, pool or tenant", body = crate::error::ErrorBody),
        (status = 409, description = "A device of that name or netbox_id exists at the site", body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)), tag = "devices")]
pub async fn create(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    J(b): J<CreateDeviceBody>,
) -> ApiResult<(StatusCode, Json<DeviceChange>)> {
    if b.netbox_id.is_some_and(|n| n < 1) {
        return Err(ApiError::invalid("netbox_id must be at least 1"));
    }
    let c = C::CreateDevice(v1::CreateDevice {
        site: b.site_id,
        name: b.name,
        serial: b.serial.unwrap_or_default(),
        netbox_id: b.netbox_id.unwrap_or_default(),
        bmc_address: b.bmc_address.unwrap_or_default(),
        infrastructure_ref: b.infrastructure_ref.unwrap_or_default(),
        pool_id: b.pool_id.unwrap_or_default(),
        owner_tenant_id: b.owner_tenant_id.unwrap_or_default(),
        rack: b.rack.unwrap_or_default(),
        device_class: b.device_class.unwrap_or_default(),
        role: b.role.unwrap_or_default(),
        trust: b.trust.unwrap_or_default(),
        inventory_status: b.inventory_status.unwrap_or_default(),
        provision_state: b.provision_state.unwrap_or_default(),
        labels: b.labels,
    });
    let Json(d) = device_command(&app, &caller, 0, c).await?;
    Ok(created(d))
}

/// 201 for creations.
pub fn created<T>(v: T) -> (StatusCode, Json<T>) {
    (StatusCode::CREATED, Json(v))
}
