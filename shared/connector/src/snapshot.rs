//! Building `ConditionSnapshot`s: the pieces every mapping uses, and the
//! outage snapshot the runtime publishes when a source cannot be read.

use chrono::{DateTime, Utc};
use fleet_domain::catalogue::observation_types_of;
use fleet_domain::{ConditionStatus, ConditionType, KeyKind, Source};
use fleet_proto::v1::{self, condition_snapshot::Mirror};

/// Now, at the microsecond PostgreSQL stores: the `Nats-Msg-Id` of a
/// redelivered observation then matches what the hub stored.
pub fn observed_now() -> DateTime<Utc> {
    let ts = fleet_proto::timestamp(Utc::now());
    fleet_proto::datetime(Some(&ts)).unwrap_or_else(Utc::now)
}

pub fn key(site: &str, kind: KeyKind, key: &str) -> v1::DeviceKey {
    v1::DeviceKey {
        site: site.to_string(),
        kind: kind.as_str().to_string(),
        key: key.to_string(),
    }
}

pub fn condition(
    t: ConditionType,
    status: ConditionStatus,
    reason: &str,
    message: impl Into<String>,
) -> v1::Condition {
    v1::Condition {
        r#type: t.as_str().to_string(),
        status: status.as_str().to_string(),
        reason: reason.to_string(),
        message: message.into(),
    }
}

/// `True`/`False` from a bool.
pub fn status(b: bool) -> ConditionStatus {
    if b {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    }
}

pub fn snapshot(
    source: Source,
    key: v1::DeviceKey,
    observed_at: DateTime<Utc>,
    conditions: Vec<v1::Condition>,
    mirror: Option<Mirror>,
) -> v1::ConditionSnapshot {
    v1::ConditionSnapshot {
        resource_bindings: vec![],
        source: source.as_str().to_string(),
        device: Some(key),
        observed_at: Some(fleet_proto::timestamp(observed_at)),
        conditions,
        mirror,
    }
}

/// Every observation type `source` owns as `Unknown` with `reason`: what a
/// connector publishes for a device it cannot see. `None` when the source
/// owns no observation types (NetBox): there is nothing to say.
pub fn all_unknown(
    source: Source,
    key: v1::DeviceKey,
    observed_at: DateTime<Utc>,
    reason: &str,
    message: &str,
    mirror: Option<Mirror>,
) -> Option<v1::ConditionSnapshot> {
    let conditions: Vec<v1::Condition> = observation_types_of(source)
        .map(|t| condition(t, ConditionStatus::Unknown, reason, message))
        .collect();
    if conditions.is_empty() {
        return None;
    }
    Some(snapshot(source, key, observed_at, conditions, mirror))
}

/// Nanoseconds since the epoch of a snapshot's `observed_at`, for the
/// `Nats-Msg-Id`.
pub fn observed_nanos(s: &v1::ConditionSnapshot) -> i64 {
    s.observed_at
        .as_ref()
        .map(|t| t.seconds.saturating_mul(1_000_000_000) + t.nanos as i64)
        .unwrap_or(0)
}

/// The identity of a device key, for sets.
pub fn key_id(k: &v1::DeviceKey) -> (String, String, String) {
    (k.site.clone(), k.kind.clone(), k.key.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outage_snapshots_cover_exactly_what_the_source_owns() {
        let at = observed_now();
        let outage = |source, name: &str, reason, message| {
            all_unknown(
                source,
                key("s1", KeyKind::Name, name),
                at,
                reason,
                message,
                None,
            )
        };
        let s = outage(
            Source::Slurm,
            "gpu01",
            "SchedulerUnreachable",
            "connection refused",
        )
        .unwrap();
        let types: Vec<&str> = s.conditions.iter().map(|c| c.r#type.as_str()).collect();
        assert_eq!(types, vec!["SlurmRegistered", "SlurmNodeHealthy"]);
        assert!(s
            .conditions
            .iter()
            .all(|c| c.status == "Unknown" && c.reason == "SchedulerUnreachable"));
        let os = outage(Source::Openstack, "n", "IronicUnreachable", "").unwrap();
        assert_eq!(os.conditions.len(), 6);
        assert!(outage(Source::Netbox, "n", "NetboxUnreachable", "").is_none());
    }

    #[test]
    fn observed_now_is_whole_microseconds() {
        let t = observed_now();
        assert_eq!(t.timestamp_subsec_nanos() % 1000, 0);
    }
}
