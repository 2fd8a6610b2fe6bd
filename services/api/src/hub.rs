//! Mutations are hub commands (`fleet_hub_client`). No answer in time, no
//! responder, or no connection is `UNAVAILABLE`, and the message says
//! whether the command may have been applied: the API never guesses.

use chrono::{DateTime, Utc};
use fleet_hub_client::{Applied, HubCallError};
use fleet_proto::v1;

use crate::error::{ApiError, ApiResult, Code};
use crate::model::{ConditionOut, DeviceChange, SnapshotResult};

#[derive(Clone)]
pub struct HubClient {
    pub client: fleet_hub_client::HubClient,
}

impl HubClient {
    pub async fn command(
        &self,
        actor: &str,
        expected_version: i64,
        command: v1::hub_command::Command,
    ) -> Result<Applied, ApiError> {
        let verb = fleet_hub_client::verb(&command);
        let applied = match self.client.call(actor, expected_version, command).await {
            Ok(a) => a,
            Err(HubCallError::Refused { code, message }) => {
                let mut err = ApiError::new(code, message);
                if code == Code::Conflict {
                    err =
                        err.with_details(serde_json::json!({"expected_version": expected_version}));
                }
                return Err(err);
            }
            Err(e) => {
                tracing::warn!(verb, error = %e, "hub command not answered");
                return Err(ApiError::unavailable(match e {
                    HubCallError::Timeout(_) => "the hub did not answer in time; the command may or may not have been applied, re-read the device".to_string(),
                    HubCallError::NotRunning => "no hub is running; the command was not sent and nothing was applied, retry later".to_string(),
                    HubCallError::BadReply(_) => "the hub answered something unreadable".to_string(),
                    _ => "the hub is unavailable; the command was not applied".to_string(),
                }));
            }
        };
        Ok(applied)
    }

    pub fn connected(&self) -> bool {
        self.client.nats.connection_state() == async_nats::connection::State::Connected
    }
}

/// A reply the hub should not have given (another record than the command
/// leaves, a missing timestamp): logged, and 503 to the caller.
pub fn unreadable(e: impl std::fmt::Display) -> ApiError {
    tracing::error!(error = %e, "hub reply does not parse");
    ApiError::unavailable("the hub answered something unreadable")
}

/// A proto3 string: empty is absent.
pub(crate) fn opt(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn at(t: Option<&fleet_proto::Timestamp>) -> Option<DateTime<Utc>> {
    fleet_proto::datetime(t)
}

fn required_at(t: Option<&fleet_proto::Timestamp>, what: &str) -> ApiResult<DateTime<Utc>> {
    at(t).ok_or_else(|| unreadable(format!("condition row without {what}")))
}

/// The device a command left, as the API answers it.
pub fn device(d: v1::DeviceChange) -> DeviceChange {
    DeviceChange {
        entered_triage_at: at(d.entered_triage_at.as_ref()),
        enrollment_proof_at: at(d.enrollment_proof_at.as_ref()),
        id: d.id,
        site_id: d.site_id,
        name: d.name,
        version: d.version,
        provision_state: d.provision_state,
        maintenance: d.maintenance,
        maintenance_reason: opt(d.maintenance_reason),
        cordoned: d.cordoned,
        cordon_reason: opt(d.cordon_reason),
        draining: d.draining,
        taints: d.taints,
        no_schedule_reasons: d.no_schedule_reasons,
        inventory_status: d.inventory_status,
        operational_status: d.operational_status,
        health_status: d.health_status,
        capacity_bucket: d.capacity_bucket,
        connectivity: d.connectivity,
        in_triage: d.in_triage,
        triage_ticket_url: opt(d.triage_ticket_url),
        parent_ticket_url: opt(d.parent_ticket_url),
        impairment_hold: opt(d.impairment_hold),
        identity_generation: d.identity_generation,
        enrollment_validated_ref: opt(d.enrollment_validated_ref),
        enrollment_proof_source: opt(d.enrollment_proof_source),
        customer_ready: d.customer_ready,
        operational_status_conditions: d.operational_status_conditions,
        deleted: d.deleted,
        failed_at: at(d.failed_at.as_ref()),
        entered_service_at: at(d.entered_service_at.as_ref()),
        role: d.role,
        trust: d.trust,
        pool_id: opt(d.pool_id),
        owner_tenant_id: opt(d.owner_tenant_id),
        infrastructure_ref: opt(d.infrastructure_ref),
        failed_from: opt(d.failed_from),
        power: d.power,
        custody: opt(d.custody),
        observed_generation: d.observed_generation,
        inventory_only: d.inventory_only,
        failure_state: opt(d.failure_state),
    }
}

/// A stored condition row, as the API answers it.
pub fn condition(c: v1::ConditionRow) -> ApiResult<ConditionOut> {
    Ok(ConditionOut {
        observed_at: required_at(c.observed_at.as_ref(), "observed_at")?,
        received_at: required_at(c.received_at.as_ref(), "received_at")?,
        last_transition_at: required_at(c.last_transition_at.as_ref(), "last_transition_at")?,
        device_id: c.device_id,
        condition_type: c.r#type,
        status: c.status,
        reason: c.reason,
        message: c.message,
        source: c.source,
        condition_of: c.condition_of,
        durable: c.durable,
        decisive: c.decisive,
        stale: c.stale,
    })
}

/// What `apply_snapshot` did, as the API answers it.
pub fn snapshot(s: v1::SnapshotApplied) -> ApiResult<SnapshotResult> {
    Ok(SnapshotResult {
        device: match (s.outcome.as_str(), s.device) {
            ("unresolved", _) => None,
            (_, Some(d)) => Some(device(d)),
            (_, None) => return Err(unreadable("snapshot outcome without its device")),
        },
        outcome: s.outcome,
        conditions: s
            .conditions
            .into_iter()
            .map(condition)
            .collect::<ApiResult<_>>()?,
    })
}
