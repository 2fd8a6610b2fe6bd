//! The stored record: one `devices` row (`DeviceRecord`, its mirrors and
//! session), one condition row, and the changes a transaction leaves.

use super::*;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConditionRow {
    #[serde(rename = "type")]
    pub condition_type: ConditionType,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
    pub source: Source,
    pub condition_of: ConditionOf,
    pub durable: bool,
    pub observed_at: DateTime<Utc>,
    pub received_at: DateTime<Utc>,
    pub decisive: bool,
    pub last_transition_at: DateTime<Utc>,
}

impl ConditionRow {
    pub(super) fn same_value(&self, status: ConditionStatus, reason: &str, message: &str) -> bool {
        self.status == status && self.reason == reason && self.message == message
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Mirrors {
    pub ironic_provision_state: Option<String>,
    pub ironic_maintenance: Option<bool>,
    pub ironic_maintenance_reason: Option<String>,
    pub ironic_instance_uuid: Option<String>,
    pub ironic_lessee: Option<String>,
    pub slurm_states: Vec<String>,
    pub netbox_tags: Vec<String>,
    pub chassis_health: Option<ChassisHealth>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Session {
    pub epoch: i64,
    pub gateway_id: Option<String>,
    pub connected_at: Option<DateTime<Utc>>,
    pub disconnected_at: Option<DateTime<Utc>>,
    pub last_seen: Option<DateTime<Utc>>,
}

/// The columns of one `devices` row the hub reads and writes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceRecord {
    pub id: String,
    pub site_id: String,
    pub name: String,
    pub version: i64,
    /// NetBox's, mirrored: a board swap edited in NetBox reaches the device
    /// (Borneo resolves by serial).
    pub serial: Option<String>,
    pub rack: Option<String>,
    /// NetBox's id of the device's record, mirrored: a device deleted and
    /// re-created in NetBox carries the new one.
    pub netbox_id: Option<i64>,
    pub inventory_only: bool,
    pub role: Role,
    pub trust: Trust,
    pub pool_id: Option<String>,
    pub owner_tenant_id: Option<String>,
    /// Read from the pool (not a device column): the schedulable rule 2.
    #[serde(skip)]
    pub pool_owner_tenant_id: Option<String>,
    pub infrastructure_ref: Option<String>,
    pub provision_state: ProvisionState,
    pub failed_from: Option<ProvisionState>,
    pub maintenance: bool,
    pub maintenance_reason: Option<String>,
    pub cordoned: bool,
    pub cordon_reason: Option<String>,
    pub draining: bool,
    pub power: Power,
    pub connectivity: Connectivity,
    pub inventory_status: InventoryStatus,
    pub operational_status: OperationalStatus,
    pub health_status: HealthStatus,
    pub capacity_bucket: CapacityBucket,
    pub in_triage: bool,
    pub triage_ticket_url: Option<String>,
    pub parent_ticket_url: Option<String>,
    pub entered_triage_at: Option<DateTime<Utc>>,
    pub custody: Option<String>,
    pub custody_credential_ref: Option<String>,
    pub impairment_hold: Option<String>,
    pub taints: Vec<String>,
    pub no_schedule_reasons: Vec<String>,
    pub observed_generation: i64,
    pub identity_generation: i64,
    pub enrollment_validated_ref: Option<String>,
    pub enrollment_proof_source: Option<String>,
    pub enrollment_proof_at: Option<DateTime<Utc>>,
    pub entered_service_at: Option<DateTime<Utc>>,
    pub failure_state: Option<String>,
    pub failed_at: Option<DateTime<Utc>>,
    pub mirrors: Mirrors,
    pub session: Session,
    pub deleted: bool,
}

impl DeviceRecord {
    /// A new device row with every axis at its default.
    pub fn new(id: String, site_id: String, name: String) -> Self {
        DeviceRecord {
            id,
            site_id,
            name,
            version: 1,
            serial: None,
            rack: None,
            netbox_id: None,
            inventory_only: false,
            role: Role::Unassigned,
            trust: Trust::Platform,
            pool_id: None,
            owner_tenant_id: None,
            pool_owner_tenant_id: None,
            infrastructure_ref: None,
            provision_state: ProvisionState::Adopting,
            failed_from: None,
            maintenance: false,
            maintenance_reason: None,
            cordoned: false,
            cordon_reason: None,
            draining: false,
            power: Power::Unknown,
            connectivity: Connectivity::Disconnected,
            inventory_status: InventoryStatus::Unknown,
            operational_status: OperationalStatus::Unknown,
            health_status: HealthStatus::Unknown,
            capacity_bucket: CapacityBucket::Excluded,
            in_triage: false,
            triage_ticket_url: None,
            parent_ticket_url: None,
            entered_triage_at: None,
            custody: None,
            custody_credential_ref: None,
            impairment_hold: None,
            taints: vec![],
            no_schedule_reasons: vec![],
            observed_generation: 0,
            identity_generation: 1,
            enrollment_validated_ref: None,
            enrollment_proof_source: None,
            enrollment_proof_at: None,
            entered_service_at: None,
            failure_state: None,
            failed_at: None,
            mirrors: Mirrors::default(),
            session: Session::default(),
            deleted: false,
        }
    }

    /// The value of an axis as its event and lifecycle row carry it.
    pub fn axis_value(&self, axis: Axis) -> String {
        match axis {
            Axis::Inventory => self.inventory_status.to_string(),
            Axis::Operational => self.operational_status.to_string(),
            Axis::Health => self.health_status.to_string(),
            Axis::Provision => self.provision_state.to_string(),
            Axis::Maintenance => self.maintenance.to_string(),
            Axis::Cordoned => self.cordoned.to_string(),
            Axis::Power => self.power.to_string(),
            Axis::Connectivity => self.connectivity.to_string(),
            Axis::Schedulable => self.capacity_bucket.to_string(),
            Axis::Triage => self.in_triage.to_string(),
            Axis::Custody => self.custody.clone().unwrap_or_default(),
            Axis::Enrollment => self.enrollment_validated_ref.clone().unwrap_or_default(),
            Axis::InventoryOnly => self.inventory_only.to_string(),
            Axis::Serial => self.serial.clone().unwrap_or_default(),
            Axis::Rack => self.rack.clone().unwrap_or_default(),
            Axis::NetboxId => self.netbox_id.map(|n| n.to_string()).unwrap_or_default(),
            Axis::Conditions | Axis::Device => String::new(),
        }
    }

    /// Whether two records differ in anything but the heartbeat clock: a
    /// heartbeat alone does not bump `version`.
    pub fn differs_beyond_heartbeat(&self, other: &DeviceRecord) -> bool {
        let mut a = self.clone();
        a.session.last_seen = other.session.last_seen;
        a != *other
    }
}

/// The axes that get lifecycle rows and status events, in a fixed order.
pub const TRACKED_AXES: &[Axis] = &[
    Axis::Inventory,
    Axis::Operational,
    Axis::Health,
    Axis::Provision,
    Axis::Maintenance,
    Axis::Cordoned,
    Axis::Power,
    Axis::Connectivity,
    Axis::Schedulable,
    Axis::Triage,
    Axis::Custody,
    Axis::Enrollment,
    Axis::InventoryOnly,
    Axis::Serial,
    Axis::Rack,
    Axis::NetboxId,
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AxisChange {
    pub axis: Axis,
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionChange {
    pub condition_type: ConditionType,
    pub from: Option<ConditionStatus>,
    pub to: ConditionStatus,
}
