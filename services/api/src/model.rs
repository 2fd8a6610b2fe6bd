//! What the API answers, as types the OpenAPI document is generated from.
//! Vocabulary fields are strings whose schema lists the domain's closed set
//! (taken from `fleet_domain`, so the document cannot drift from the code).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use fleet_domain::slurm::SlurmState;
use fleet_domain::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};
use utoipa::ToSchema;

/// A string schema of a closed set of values.
pub(crate) fn enum_schema<'a>(values: impl IntoIterator<Item = &'a str>) -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values))
        .build()
}

macro_rules! vocab_schemas {
    ($($f:ident => $t:ty),* $(,)?) => {$(
        pub fn $f() -> Object {
            enum_schema(<$t>::ALL.iter().map(|v| v.as_str()))
        }
    )*};
}

vocab_schemas!(
    provision_state_schema => ProvisionState,
    power_schema => Power,
    connectivity_schema => Connectivity,
    inventory_status_schema => InventoryStatus,
    operational_status_schema => OperationalStatus,
    health_status_schema => HealthStatus,
    device_class_schema => DeviceClass,
    role_schema => Role,
    trust_schema => Trust,
    condition_status_schema => ConditionStatus,
    condition_of_schema => ConditionOf,
    source_schema => Source,
    capacity_bucket_schema => CapacityBucket,
    condition_type_schema => ConditionType,
    axis_schema => Axis,
    slurm_state_schema => SlurmState,
    key_kind_schema => KeyKind,
    resource_schema => fleet_domain::binding::Resource,
    resolution_status_schema => fleet_domain::binding::ResolutionStatus,
    stage_schema => fleet_domain::standup::Stage,
    stage_status_schema => fleet_domain::standup::CellStatus,
    suppression_schema => fleet_domain::standup::Suppression,
    gate_outcome_schema => fleet_domain::standup::GateOutcome,
    gate_scope_schema => fleet_domain::acceptance::GateScope,
    event_status_schema => fleet_domain::impairment::EventStatus,
    event_device_status_schema => fleet_domain::impairment::EventDeviceStatus,
    placement_action_schema => fleet_domain::impairment::PlacementAction,
);

pub fn error_code_schema() -> Object {
    enum_schema(crate::error::API_CODES.iter().map(|c| c.as_str_name()))
}

pub fn slurm_states_schema() -> utoipa::openapi::schema::Array {
    utoipa::openapi::schema::ArrayBuilder::new()
        .items(slurm_state_schema())
        .build()
}

/// One device in a list: every status axis and the derived predicates.
#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct DeviceSummary {
    pub id: String,
    pub name: String,
    pub site_id: String,
    pub pool_id: Option<String>,
    pub rack: Option<String>,
    #[schema(schema_with = device_class_schema)]
    pub device_class: String,
    #[schema(schema_with = role_schema)]
    pub role: String,
    #[schema(schema_with = trust_schema)]
    pub trust: String,
    pub version: i64,
    #[schema(schema_with = provision_state_schema)]
    pub provision_state: String,
    pub maintenance: bool,
    pub cordoned: bool,
    #[schema(schema_with = power_schema)]
    pub power: String,
    #[schema(schema_with = connectivity_schema)]
    pub connectivity: String,
    #[schema(schema_with = inventory_status_schema)]
    pub inventory_status: String,
    #[schema(schema_with = operational_status_schema)]
    pub operational_status: String,
    #[schema(schema_with = health_status_schema)]
    pub health_status: String,
    pub in_triage: bool,
    pub inventory_only: bool,
    pub impairment_hold: Option<String>,
    #[schema(schema_with = slurm_states_schema)]
    pub slurm_states: Vec<String>,
    pub no_schedule_reasons: Vec<String>,
    /// Derived at read time (`CUSTOMER_READY_SQL`).
    pub customer_ready: bool,
    /// Derived at read time (`SCHEDULABLE_BUCKET_SQL`).
    pub schedulable: bool,
    /// The capacity bucket the device's GPUs are reported in.
    #[schema(schema_with = capacity_bucket_schema)]
    pub capacity_bucket: String,
    pub updated_at: DateTime<Utc>,
}

// Read from the device row's `session_*` columns.
#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct SessionOut {
    #[sqlx(rename = "session_epoch")]
    pub epoch: i64,
    #[sqlx(rename = "session_gateway_id")]
    pub gateway_id: Option<String>,
    #[sqlx(rename = "session_connected_at")]
    pub connected_at: Option<DateTime<Utc>>,
    #[sqlx(rename = "session_disconnected_at")]
    pub disconnected_at: Option<DateTime<Utc>>,
    #[sqlx(rename = "session_last_seen")]
    pub last_seen: Option<DateTime<Utc>>,
}

/// Raw mirrors, stored as reported.
#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct MirrorsOut {
    pub ironic_provision_state: Option<String>,
    pub ironic_maintenance: Option<bool>,
    pub ironic_maintenance_reason: Option<String>,
    pub ironic_instance_uuid: Option<String>,
    pub ironic_lessee: Option<String>,
    pub netbox_tags: Vec<String>,
    pub chassis_health: Option<String>,
}

/// `GET /api/v1/devices/{id}/`: every axis, identity (never the hardware
/// key itself), labels, the session, the derived predicates and the
/// conditions that decided `operational_status`.
#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct DeviceDetail {
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub summary: DeviceSummary,
    pub serial: Option<String>,
    pub netbox_id: Option<i64>,
    pub bmc_address: Option<String>,
    pub infrastructure_ref: Option<String>,
    pub owner_tenant_id: Option<String>,
    pub adapter: String,
    #[schema(value_type = Object)]
    pub drivers: Value,
    pub hardware_key_trusted: bool,
    pub generation: i64,
    pub observed_generation: i64,
    pub identity_generation: i64,
    #[schema(value_type = Object)]
    pub labels: Value,
    #[schema(value_type = Object)]
    pub annotations: Value,
    pub failed_from: Option<String>,
    pub maintenance_reason: Option<String>,
    pub cordon_reason: Option<String>,
    pub draining: bool,
    pub taints: Vec<String>,
    pub triage_ticket_url: Option<String>,
    pub parent_ticket_url: Option<String>,
    pub entered_triage_at: Option<DateTime<Utc>>,
    pub custody: Option<String>,
    pub enrollment_validated_ref: Option<String>,
    pub enrollment_proof_source: Option<String>,
    pub enrollment_proof_at: Option<DateTime<Utc>>,
    pub entered_service_at: Option<DateTime<Utc>>,
    pub failure_state: Option<String>,
    pub failed_at: Option<DateTime<Utc>>,
    #[sqlx(flatten)]
    pub mirrors: MirrorsOut,
    #[sqlx(flatten)]
    pub session: SessionOut,
    pub created_at: DateTime<Utc>,
    /// The rows with `decisive = true`.
    #[sqlx(skip)]
    pub operational_status_conditions: Vec<ConditionOut>,
    /// UNI resource attribution: one per typed resource, `resolution_status`
    /// derived at read time. Never part of operational or health status.
    #[sqlx(skip)]
    pub resource_bindings: Vec<ResourceBindingOut>,
}

/// One `DeviceResourceBinding` row, with `resolution_status` derived at
/// read time (`fleet_domain::binding::resolution_status`): `resolved`
/// while its source resolves it and confirmed it within the source's TTL,
/// `stale` otherwise. A failed resource keeps its last-known `resource_id`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct ResourceBindingOut {
    #[schema(schema_with = resource_schema)]
    pub resource: String,
    pub resource_id: Option<String>,
    #[schema(schema_with = resolution_status_schema)]
    pub resolution_status: String,
    #[schema(schema_with = source_schema)]
    pub source: String,
    /// When the source first resolved the device to `resource_id`.
    pub resolved_at: Option<DateTime<Utc>>,
    /// The last observation confirming the row (its own or its source's
    /// snapshot freshness, the later).
    pub confirmed_at: DateTime<Utc>,
    /// When resolution started failing; absent while it resolves.
    pub failed_at: Option<DateTime<Utc>>,
    pub reason: String,
    pub message: String,
}

/// One `device_conditions` row, with `stale` derived at read time.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct ConditionOut {
    pub device_id: String,
    #[serde(rename = "type")]
    #[sqlx(rename = "type")]
    #[schema(schema_with = condition_type_schema)]
    pub condition_type: String,
    #[schema(schema_with = condition_status_schema)]
    pub status: String,
    pub reason: String,
    pub message: String,
    #[schema(schema_with = source_schema)]
    pub source: String,
    #[schema(schema_with = condition_of_schema)]
    pub condition_of: String,
    pub durable: bool,
    pub observed_at: DateTime<Utc>,
    pub received_at: DateTime<Utc>,
    pub decisive: bool,
    pub last_transition_at: DateTime<Utc>,
    /// A non-durable row whose source has not confirmed it within its TTL.
    pub stale: bool,
}

/// A device as the hub answered a command: the stored record after it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeviceChange {
    pub id: String,
    pub site_id: String,
    pub name: String,
    pub version: i64,
    #[schema(schema_with = provision_state_schema)]
    pub provision_state: String,
    pub maintenance: bool,
    pub maintenance_reason: Option<String>,
    pub cordoned: bool,
    pub cordon_reason: Option<String>,
    pub draining: bool,
    pub taints: Vec<String>,
    pub no_schedule_reasons: Vec<String>,
    #[schema(schema_with = inventory_status_schema)]
    pub inventory_status: String,
    #[schema(schema_with = operational_status_schema)]
    pub operational_status: String,
    #[schema(schema_with = health_status_schema)]
    pub health_status: String,
    #[schema(schema_with = capacity_bucket_schema)]
    pub capacity_bucket: String,
    #[schema(schema_with = connectivity_schema)]
    pub connectivity: String,
    pub in_triage: bool,
    pub triage_ticket_url: Option<String>,
    pub parent_ticket_url: Option<String>,
    pub entered_triage_at: Option<DateTime<Utc>>,
    pub impairment_hold: Option<String>,
    pub identity_generation: i64,
    pub enrollment_validated_ref: Option<String>,
    pub enrollment_proof_source: Option<String>,
    pub enrollment_proof_at: Option<DateTime<Utc>>,
    pub customer_ready: bool,
    /// Condition types that decided `operational_status`.
    pub operational_status_conditions: Vec<String>,
    pub deleted: bool,
    #[schema(schema_with = role_schema)]
    pub role: String,
    #[schema(schema_with = trust_schema)]
    pub trust: String,
    pub pool_id: Option<String>,
    pub owner_tenant_id: Option<String>,
    pub infrastructure_ref: Option<String>,
    /// The provision state a `failed` device failed from.
    pub failed_from: Option<String>,
    #[schema(schema_with = power_schema)]
    pub power: String,
    /// Borneo's custody state as last reported.
    pub custody: Option<String>,
    pub observed_generation: i64,
    pub inventory_only: bool,
    pub failure_state: Option<String>,
    pub failed_at: Option<DateTime<Utc>>,
    pub entered_service_at: Option<DateTime<Utc>>,
}

/// One lifecycle row with `ended_at`: the next row of the same kind.
#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct LifecycleEvent {
    pub id: i64,
    #[schema(schema_with = axis_schema)]
    pub kind: String,
    pub value: String,
    pub cause: String,
    pub created_at: DateTime<Utc>,
    /// `null` on the row describing the current value.
    pub ended_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema, sqlx::FromRow)]
pub struct UnresolvedObservation {
    #[schema(schema_with = source_schema)]
    pub source: String,
    pub site: String,
    #[schema(schema_with = key_kind_schema)]
    pub key_kind: String,
    pub key: String,
    pub observed_at: DateTime<Utc>,
    pub received_at: DateTime<Utc>,
    pub seen_count: i64,
}

/// Per-status counts of a site, without `inventory_only` devices.
#[derive(Debug, Serialize, ToSchema)]
pub struct SiteSummary {
    pub site_id: String,
    pub total: i64,
    /// Devices left out of every count above (projection-only inventory).
    pub inventory_only_excluded: i64,
    pub inventory_status: BTreeMap<String, i64>,
    pub operational_status: BTreeMap<String, i64>,
    pub health_status: BTreeMap<String, i64>,
    pub capacity_bucket: BTreeMap<String, i64>,
    pub customer_ready: i64,
    pub in_triage: i64,
    pub cordoned: i64,
    pub maintenance: i64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct ImpairmentEvent {
    pub id: String,
    #[schema(schema_with = event_status_schema)]
    pub status: String,
    pub reason: String,
    pub ticket_url: Option<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub cleared_at: Option<DateTime<Utc>>,
    pub device_count: i64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct ImpairmentEventDevice {
    pub device_id: String,
    #[schema(schema_with = event_device_status_schema)]
    pub status: String,
    #[schema(schema_with = operational_status_schema)]
    pub pre_hold_operational_status: String,
    /// The Placement trait work of the device's current phase (null at a
    /// standalone-Ironic site, or with nothing to restore) and its outcome:
    /// `pending`, `done`, `failed`.
    #[schema(schema_with = placement_action_schema, nullable)]
    pub placement_action: Option<String>,
    pub placement_status: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ImpairmentEventDetail {
    #[serde(flatten)]
    pub event: ImpairmentEvent,
    pub devices: Vec<ImpairmentEventDevice>,
    /// Present when the storm guard held the event: while it awaits
    /// confirmation nothing is cordoned (`POST .../confirm`).
    pub storm_guard: Option<crate::jobs::StormGuard>,
}

/// The answer to a snapshot apply.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SnapshotResult {
    /// `applied`; `stale` (older than the last snapshot applied from the
    /// source); `duplicate` (same time and content); `unresolved` (the key
    /// names no device: kept as an unresolved observation, as on the NATS
    /// path, `device` null, answered 202).
    #[schema(schema_with = snapshot_outcome_schema)]
    pub outcome: String,
    pub device: Option<DeviceChange>,
    /// The source's rows as now stored.
    pub conditions: Vec<ConditionOut>,
}

pub fn snapshot_outcome_schema() -> Object {
    enum_schema(["applied", "stale", "duplicate", "unresolved"])
}

macro_rules! page {
    ($name:ident, $item:ty) => {
        /// One page; pass `next_cursor` as `cursor` for the next one.
        #[derive(Debug, Serialize, ToSchema)]
        pub struct $name {
            pub items: Vec<$item>,
            /// `null` on the last page.
            pub next_cursor: Option<String>,
        }
    };
}
pub(crate) use page;

page!(DevicePage, DeviceSummary);
page!(LifecyclePage, LifecycleEvent);
page!(ConditionPage, ConditionOut);
page!(ImpairmentPage, ImpairmentEvent);
page!(UnresolvedPage, UnresolvedObservation);

// ------------------------------------------------------------ allocations

// The allocation shapes are the placer client's own
// (`fleet_placer_client::{AllocateRequest, Allocation, Atom, Capacity}`).

// ------------------------------------------------------------ latch drift

pub fn drift_schema() -> Object {
    enum_schema(fleet_domain::drift::Drift::ALL.iter().map(|d| d.as_str()))
}

pub fn latch_schema() -> Object {
    enum_schema(fleet_domain::drift::PAIRS.iter().map(|p| p.latch.as_str()))
}

pub fn observed_latch_schema() -> Object {
    enum_schema(
        fleet_domain::drift::PAIRS
            .iter()
            .map(|p| p.observed.as_str()),
    )
}

/// One device whose durable fabric latch disagrees with a fresh live
/// observation (`fleet_domain::drift`).
#[derive(Debug, Serialize, ToSchema)]
pub struct LatchDrift {
    pub device_id: String,
    pub site_id: String,
    pub name: String,
    #[schema(schema_with = latch_schema)]
    pub latch_type: String,
    /// `null`: no latch row (read as `False`).
    pub latch_status: Option<String>,
    pub latch_reason: Option<String>,
    #[schema(schema_with = observed_latch_schema)]
    pub observed_type: String,
    #[schema(schema_with = condition_status_schema)]
    pub observed_status: String,
    pub observed_reason: String,
    pub observed_message: String,
    pub observed_at: DateTime<Utc>,
    #[schema(schema_with = source_schema)]
    pub observed_source: String,
    /// `unguarded`: the fabric shows it, the latch permits; `stale_guard`:
    /// the latch refuses, the fabric no longer backs it.
    #[schema(schema_with = drift_schema)]
    pub drift: String,
}

impl From<fleet_store::drift::DriftRow> for LatchDrift {
    fn from(r: fleet_store::drift::DriftRow) -> Self {
        LatchDrift {
            device_id: r.device_id,
            site_id: r.site_id,
            name: r.name,
            latch_type: r.latch_type,
            latch_status: r.latch_status,
            latch_reason: r.latch_reason,
            observed_type: r.observed_type,
            observed_status: r.observed_status,
            observed_reason: r.observed_reason,
            observed_message: r.observed_message,
            observed_at: r.observed_at,
            observed_source: r.observed_source,
            drift: r.drift,
        }
    }
}

page!(AllocationPage, fleet_placer_client::Allocation);
page!(LatchDriftPage, LatchDrift);
