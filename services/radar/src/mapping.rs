//! The Radar mapping (`consumers.md`, "radar"; seed 002, "Radar outbound
//! projection"), pure: a device's inventory, operational and health status
//! (and triage) to Radar's `ResourceAvailabilityState` and
//! `ResourceHealthState`, the tenant opt-out, and what one device
//! projects.
//!
//! When several availability rows match, the first in this order wins:
//! `UNAVAILABLE` (inventory not active, or failed), `MAINTENANCE`
//! (validation, quarantine, drained, pending_handover, or in triage),
//! `AVAILABLE`, `IN_USE`, `UNKNOWN`. A device out of service or failed is
//! not offered as under maintenance, and one in triage is not offered to
//! customers even when it is customer-ready.

use fleet_domain::predicates::customer_ready;
use fleet_domain::{HealthStatus, InventoryStatus, OperationalStatus};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    Available,
    InUse,
    Maintenance,
    Unavailable,
    Unknown,
}

impl Availability {
    pub fn as_str(self) -> &'static str {
        match self {
            Availability::Available => "AVAILABLE",
            Availability::InUse => "IN_USE",
            Availability::Maintenance => "MAINTENANCE",
            Availability::Unavailable => "UNAVAILABLE",
            Availability::Unknown => "UNKNOWN",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Degraded,
    Unhealthy,
    Unknown,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "HEALTHY",
            Health::Degraded => "DEGRADED",
            Health::Unhealthy => "UNHEALTHY",
            Health::Unknown => "UNKNOWN",
        }
    }
}

pub fn availability(
    inventory_only: bool,
    inventory: InventoryStatus,
    operational: OperationalStatus,
    health: HealthStatus,
    in_triage: bool,
) -> Availability {
    use OperationalStatus as S;
    if inventory != InventoryStatus::Active || operational == S::Failed {
        return Availability::Unavailable;
    }
    if in_triage
        || matches!(
            operational,
            S::Validation | S::Quarantine | S::Drained | S::PendingHandover
        )
    {
        return Availability::Maintenance;
    }
    let ready = customer_ready(inventory_only, inventory, operational, health);
    match operational {
        S::Available if ready => Availability::Available,
        S::InUse | S::Delegated if ready => Availability::InUse,
        _ => Availability::Unknown,
    }
}

pub fn health(h: HealthStatus) -> Health {
    match h {
        HealthStatus::Healthy => Health::Healthy,
        HealthStatus::Degraded => Health::Degraded,
        HealthStatus::Critical => Health::Unhealthy,
        HealthStatus::Unknown => Health::Unknown,
    }
}

/// Why a device is no longer projected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TombstoneReason {
    OptedOut,
    Deleted,
}

impl TombstoneReason {
    pub fn as_str(self) -> &'static str {
        match self {
            TombstoneReason::OptedOut => "opted_out",
            TombstoneReason::Deleted => "deleted",
        }
    }
}

/// What one device projects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Project {
        availability: Availability,
        health: Health,
    },
    /// Inventory only: site, name and inventory status, no availability
    /// or health (Fleet Manager does not manage the hardware).
    InventoryOnly,
    Tombstone(TombstoneReason),
}

/// One device as Radar reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RadarDevice {
    pub inventory_only: bool,
    pub inventory: InventoryStatus,
    pub operational: OperationalStatus,
    pub health: HealthStatus,
    pub in_triage: bool,
    pub deleted: bool,
    /// The owning tenant carries a valid `radar_ignore`.
    pub opted_out: bool,
}

pub fn decide(d: &RadarDevice) -> Decision {
    if d.deleted {
        return Decision::Tombstone(TombstoneReason::Deleted);
    }
    if d.opted_out {
        return Decision::Tombstone(TombstoneReason::OptedOut);
    }
    if d.inventory_only {
        return Decision::InventoryOnly;
    }
    Decision::Project {
        availability: availability(false, d.inventory, d.operational, d.health, d.in_triage),
        health: health(d.health),
    }
}

/// The annotation keys of the opt-out.
pub const RADAR_IGNORE: &str = "radar_ignore";
pub const RADAR_IGNORE_REASON: &str = "radar_ignore_reason";

/// A refused annotation, with what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidAnnotation(pub String);

/// Validates a tenant's `annotations`: `radar_ignore`, when present, is a
/// boolean, and `true` needs a non-empty `radar_ignore_reason` ("a reason
/// is required; without one the annotation is refused"). Returns whether
/// the tenant opts out. Call it before storing annotations.
pub fn validate_annotations(annotations: &Value) -> Result<bool, InvalidAnnotation> {
    let Some(obj) = annotations.as_object() else {
        return Err(InvalidAnnotation(
            "annotations must be a JSON object".into(),
        ));
    };
    match obj.get(RADAR_IGNORE) {
        None | Some(Value::Bool(false)) => Ok(false),
        Some(Value::Bool(true)) => match obj.get(RADAR_IGNORE_REASON) {
            Some(Value::String(r)) if !r.trim().is_empty() && r.len() <= 1000 => Ok(true),
            Some(Value::String(r)) if r.len() > 1000 => Err(InvalidAnnotation(format!(
                "{RADAR_IGNORE_REASON} is longer than 1000 characters"
            ))),
            _ => Err(InvalidAnnotation(format!(
                "{RADAR_IGNORE} = true needs a non-empty {RADAR_IGNORE_REASON}"
            ))),
        },
        Some(other) => Err(InvalidAnnotation(format!(
            "{RADAR_IGNORE} must be a boolean, not {other}"
        ))),
    }
}

/// Whether stored annotations opt the tenant out: only a valid opt-out
/// counts (one written past the validation is ignored).
pub fn opted_out(annotations: Option<&Value>) -> bool {
    annotations.is_some_and(|a| validate_annotations(a) == Ok(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use HealthStatus as H;
    use InventoryStatus as I;
    use OperationalStatus as S;

    #[test]
    fn every_row_of_the_availability_table() {
        // (inventory, operational, health, in_triage, availability)
        let rows = [
            // "AVAILABLE: customer-ready and operational_status = available"
            (
                I::Active,
                S::Available,
                H::Healthy,
                false,
                Availability::Available,
            ),
            // "IN_USE: customer-ready and in_use or delegated"
            (I::Active, S::InUse, H::Healthy, false, Availability::InUse),
            (
                I::Active,
                S::Delegated,
                H::Healthy,
                false,
                Availability::InUse,
            ),
            (
                I::Active,
                S::Delegated,
                H::Unknown,
                false,
                Availability::InUse,
            ),
            // "MAINTENANCE: validation, quarantine, drained, pending_handover, or in triage"
            (
                I::Active,
                S::Validation,
                H::Healthy,
                false,
                Availability::Maintenance,
            ),
            (
                I::Active,
                S::Quarantine,
                H::Healthy,
                false,
                Availability::Maintenance,
            ),
            (
                I::Active,
                S::Drained,
                H::Unknown,
                false,
                Availability::Maintenance,
            ),
            (
                I::Active,
                S::PendingHandover,
                H::Healthy,
                false,
                Availability::Maintenance,
            ),
            (
                I::Active,
                S::Available,
                H::Healthy,
                true,
                Availability::Maintenance,
            ),
            (
                I::Active,
                S::Unknown,
                H::Unknown,
                true,
                Availability::Maintenance,
            ),
            // "UNAVAILABLE: failed, or inventory_status not active"
            (
                I::Active,
                S::Failed,
                H::Healthy,
                false,
                Availability::Unavailable,
            ),
            (
                I::Active,
                S::Failed,
                H::Healthy,
                true,
                Availability::Unavailable,
            ),
            (
                I::Staged,
                S::Available,
                H::Healthy,
                false,
                Availability::Unavailable,
            ),
            (
                I::Offline,
                S::Quarantine,
                H::Healthy,
                true,
                Availability::Unavailable,
            ),
            (
                I::Unknown,
                S::Unknown,
                H::Unknown,
                false,
                Availability::Unavailable,
            ),
            // "UNKNOWN: anything else"
            (
                I::Active,
                S::Unknown,
                H::Healthy,
                false,
                Availability::Unknown,
            ),
            // not customer-ready: available but not healthy
            (
                I::Active,
                S::Available,
                H::Degraded,
                false,
                Availability::Unknown,
            ),
            (
                I::Active,
                S::InUse,
                H::Unknown,
                false,
                Availability::Unknown,
            ),
            (
                I::Active,
                S::Delegated,
                H::Critical,
                false,
                Availability::Unknown,
            ),
        ];
        for (inv, op, h, triage, want) in rows {
            assert_eq!(
                availability(false, inv, op, h, triage),
                want,
                "{inv} {op} {h} triage={triage}"
            );
        }
    }

    #[test]
    fn health_maps_one_to_one() {
        // "healthy -> HEALTHY, degraded -> DEGRADED, critical -> UNHEALTHY, unknown -> UNKNOWN"
        assert_eq!(health(H::Healthy).as_str(), "HEALTHY");
        assert_eq!(health(H::Degraded).as_str(), "DEGRADED");
        assert_eq!(health(H::Critical).as_str(), "UNHEALTHY");
        assert_eq!(health(H::Unknown).as_str(), "UNKNOWN");
    }

    #[test]
    fn the_opt_out_needs_a_reason() {
        assert_eq!(validate_annotations(&json!({})), Ok(false));
        assert_eq!(
            validate_annotations(&json!({"radar_ignore": false})),
            Ok(false)
        );
        assert_eq!(
            validate_annotations(
                &json!({"radar_ignore": true, "radar_ignore_reason": "lab fleet"})
            ),
            Ok(true)
        );
        // "without one the annotation is refused"
        for bad in [
            json!({"radar_ignore": true}),
            json!({"radar_ignore": true, "radar_ignore_reason": "  "}),
            json!({"radar_ignore": true, "radar_ignore_reason": 7}),
            json!({"radar_ignore": "true", "radar_ignore_reason": "x"}),
            json!({"radar_ignore": true, "radar_ignore_reason": "x".repeat(1001)}),
            json!([1, 2]),
        ] {
            assert!(validate_annotations(&bad).is_err(), "{bad}");
            assert!(!opted_out(Some(&bad)), "{bad}");
        }
        assert!(opted_out(Some(
            &json!({"radar_ignore": true, "radar_ignore_reason": "x"})
        )));
        assert!(!opted_out(None));
    }

    #[test]
    fn what_a_device_projects() {
        let d = RadarDevice {
            inventory_only: false,
            inventory: I::Active,
            operational: S::Available,
            health: H::Healthy,
            in_triage: false,
            deleted: false,
            opted_out: false,
        };
        assert_eq!(
            decide(&d),
            Decision::Project {
                availability: Availability::Available,
                health: Health::Healthy
            }
        );
        // "inventory_only devices are projected for inventory only"
        assert_eq!(
            decide(&RadarDevice {
                inventory_only: true,
                ..d.clone()
            }),
            Decision::InventoryOnly
        );
        // opted out and deleted devices get tombstones
        assert_eq!(
            decide(&RadarDevice {
                opted_out: true,
                inventory_only: true,
                ..d.clone()
            }),
            Decision::Tombstone(TombstoneReason::OptedOut)
        );
        assert_eq!(
            decide(&RadarDevice {
                deleted: true,
                opted_out: true,
                ..d
            }),
            Decision::Tombstone(TombstoneReason::Deleted)
        );
    }
}
