//! What a command answers (`fleet.v1.HubReply`): the record it left, typed
//! per command. Pure: built from the state after the command.

use chrono::{DateTime, Utc};
use fleet_domain::predicates;
use fleet_domain::state::{ConditionRow, DeviceState};
use fleet_proto::{timestamp, v1};

use v1::hub_reply::Record;

fn s(v: &Option<String>) -> String {
    v.clone().unwrap_or_default()
}

fn at(v: Option<DateTime<Utc>>) -> Option<fleet_proto::Timestamp> {
    v.map(timestamp)
}

/// The device as a command reply carries it.
pub fn device(state: &DeviceState) -> v1::DeviceChange {
    let r = &state.record;
    v1::DeviceChange {
        id: r.id.clone(),
        site_id: r.site_id.clone(),
        name: r.name.clone(),
        version: r.version,
        role: r.role.as_str().into(),
        trust: r.trust.as_str().into(),
        pool_id: s(&r.pool_id),
        owner_tenant_id: s(&r.owner_tenant_id),
        infrastructure_ref: s(&r.infrastructure_ref),
        provision_state: r.provision_state.as_str().into(),
        failed_from: r
            .failed_from
            .map(|p| p.as_str().to_string())
            .unwrap_or_default(),
        maintenance: r.maintenance,
        maintenance_reason: s(&r.maintenance_reason),
        cordoned: r.cordoned,
        cordon_reason: s(&r.cordon_reason),
        draining: r.draining,
        taints: r.taints.clone(),
        no_schedule_reasons: r.no_schedule_reasons.clone(),
        power: r.power.as_str().into(),
        connectivity: r.connectivity.as_str().into(),
        inventory_status: r.inventory_status.as_str().into(),
        operational_status: r.operational_status.as_str().into(),
        health_status: r.health_status.as_str().into(),
        capacity_bucket: r.capacity_bucket.as_str().into(),
        in_triage: r.in_triage,
        triage_ticket_url: s(&r.triage_ticket_url),
        parent_ticket_url: s(&r.parent_ticket_url),
        entered_triage_at: at(r.entered_triage_at),
        custody: s(&r.custody),
        impairment_hold: s(&r.impairment_hold),
        observed_generation: r.observed_generation,
        identity_generation: r.identity_generation,
        enrollment_validated_ref: s(&r.enrollment_validated_ref),
        enrollment_proof_source: s(&r.enrollment_proof_source),
        enrollment_proof_at: at(r.enrollment_proof_at),
        customer_ready: predicates::customer_ready(
            r.inventory_only,
            r.inventory_status,
            r.operational_status,
            r.health_status,
        ),
        operational_status_conditions: state
            .decisive_types()
            .iter()
            .map(|t| t.as_str().to_string())
            .collect(),
        deleted: r.deleted,
        inventory_only: r.inventory_only,
        failure_state: s(&r.failure_state),
        failed_at: at(r.failed_at),
        entered_service_at: at(r.entered_service_at),
    }
}

/// One stored condition row; `stale` as the reader would derive it now.
pub fn condition(device_id: &str, row: &ConditionRow, stale: bool) -> v1::ConditionRow {
    v1::ConditionRow {
        device_id: device_id.to_string(),
        r#type: row.condition_type.as_str().into(),
        status: row.status.as_str().into(),
        reason: row.reason.clone(),
        message: row.message.clone(),
        source: row.source.as_str().into(),
        condition_of: row.condition_of.as_str().into(),
        durable: row.durable,
        observed_at: Some(timestamp(row.observed_at)),
        received_at: Some(timestamp(row.received_at)),
        decisive: row.decisive,
        last_transition_at: Some(timestamp(row.last_transition_at)),
        stale,
    }
}

/// A successful reply carrying `record`.
/// The reply to a command on one device: the device as it now is, at its
/// new version.
pub fn device_ok(state: &DeviceState) -> v1::HubReply {
    ok(Record::Device(device(state)), state.record.version)
}

pub fn ok(record: Record, version: i64) -> v1::HubReply {
    v1::HubReply {
        error: None,
        version,
        record: Some(record),
    }
}
