//! UNI resource attribution (seed 002, "Device composite model"): one
//! `DeviceResourceBinding` per device and typed resource, whose
//! `resolution_status` is "an independent, observable axis for materialised
//! attribution to UNI, Placement, and Kubernetes resources. It does not
//! replace the device's operational or health status."
//!
//! Nothing in derivation reads a binding, so a binding never changes
//! operational or health status (tested in `state`). The status is never
//! stored: "readers derive stale state from the persisted timestamps at
//! read time" ([`resolution_status`]).

use chrono::{DateTime, Duration, Utc};

use crate::error::DomainError;
use crate::vocab::{vocab, Source};

vocab!(
    /// The typed resources a device is attributed to.
    Resource, "resource" {
    Uni => "uni", Placement => "placement", Kubernetes => "kubernetes",
});

vocab!(ResolutionStatus, "resolution_status" { Resolved => "resolved", Stale => "stale" });

impl Resource {
    /// The source whose snapshots resolve this resource. `None`: no
    /// connector of this release resolves it, so a snapshot naming it is
    /// refused (`FORBIDDEN_SOURCE`) until one does.
    pub const fn owner(self) -> Option<Source> {
        match self {
            Resource::Placement => Some(Source::Openstack),
            Resource::Uni | Resource::Kubernetes => None,
        }
    }

    pub fn check_owner(self, source: Source) -> Result<(), DomainError> {
        if self.owner() == Some(source) {
            Ok(())
        } else {
            Err(DomainError::ForbiddenSource {
                source_name: source.as_str().to_string(),
                condition_type: format!("resource binding {self}"),
            })
        }
    }

    /// The resources `source`'s snapshots resolve.
    pub fn owned_by(source: Source) -> impl Iterator<Item = Resource> {
        Resource::ALL
            .iter()
            .copied()
            .filter(move |r| r.owner() == Some(source))
    }
}

/// Reason of a binding its source stopped listing.
pub const NOT_REPORTED: &str = "NotReported";

/// What a snapshot says of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingInput {
    /// The device is attributed to this resource id.
    Resolved {
        resource: Resource,
        resource_id: String,
    },
    /// The source could not resolve it this time (CamelCase reason).
    Failed {
        resource: Resource,
        reason: String,
        message: String,
    },
}

impl BindingInput {
    pub fn resource(&self) -> Resource {
        match self {
            BindingInput::Resolved { resource, .. } | BindingInput::Failed { resource, .. } => {
                *resource
            }
        }
    }

    /// A resolved binding names its resource id; a failed one its reason.
    pub fn check(&self) -> Result<(), DomainError> {
        let (what, value) = match self {
            BindingInput::Resolved { resource_id, .. } => ("resource_id", resource_id),
            BindingInput::Failed { reason, .. } => ("reason", reason),
        };
        if value.trim().is_empty() {
            return Err(DomainError::InvalidArgument(format!(
                "resource binding {}: {what} is empty",
                self.resource()
            )));
        }
        Ok(())
    }
}

/// A stored `DeviceResourceBinding` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingRow {
    pub resource: Resource,
    pub source: Source,
    /// The last-known resource id; `None` only for a resource never resolved.
    pub resource_id: Option<String>,
    /// When the source first resolved the device to `resource_id`.
    pub resolved_at: Option<DateTime<Utc>>,
    /// When resolution started failing; `None` while it resolves.
    pub failed_at: Option<DateTime<Utc>>,
    pub reason: String,
    pub message: String,
    /// The observation that last wrote the row. Its source's freshness row
    /// carries later confirmations of the same content.
    pub observed_at: DateTime<Utc>,
}

impl BindingRow {
    /// Applies what one snapshot says of this row's resource (`None`: the
    /// snapshot of its owner no longer lists it). Returns the row to store,
    /// or `None` when there is nothing to store (never resolved, not listed).
    pub fn apply(
        row: Option<&BindingRow>,
        resource: Resource,
        source: Source,
        given: Option<&BindingInput>,
        observed_at: DateTime<Utc>,
    ) -> Option<BindingRow> {
        if row.is_some_and(|r| r.observed_at > observed_at) {
            return row.cloned();
        }
        let new = match given {
            Some(BindingInput::Resolved { resource_id, .. }) => {
                let same = row.filter(|r| {
                    r.failed_at.is_none() && r.resource_id.as_deref() == Some(resource_id)
                });
                Some(BindingRow {
                    resource,
                    source,
                    resource_id: Some(resource_id.clone()),
                    resolved_at: same.and_then(|r| r.resolved_at).or(Some(observed_at)),
                    failed_at: None,
                    reason: String::new(),
                    message: String::new(),
                    observed_at,
                })
            }
            Some(BindingInput::Failed {
                reason, message, ..
            }) => Some(failed(row, resource, source, reason, message, observed_at)),
            // A resource its source never resolved and does not list: nothing.
            None => row.map(|r| {
                failed(
                    Some(r),
                    resource,
                    source,
                    NOT_REPORTED,
                    "the source no longer reports this binding",
                    observed_at,
                )
            }),
        }?;
        // The same content again is a confirmation, not a write: its
        // source's freshness row carries it (as for a condition).
        match row {
            Some(old)
                if BindingRow {
                    observed_at: old.observed_at,
                    ..new.clone()
                } == *old =>
            {
                Some(old.clone())
            }
            _ => Some(new),
        }
    }
}

/// "A failed resource retains its last-known row as stale": the resource id
/// and `resolved_at` are kept, `failed_at` marks when it started failing.
fn failed(
    row: Option<&BindingRow>,
    resource: Resource,
    source: Source,
    reason: &str,
    message: &str,
    observed_at: DateTime<Utc>,
) -> BindingRow {
    BindingRow {
        resource,
        source,
        resource_id: row.and_then(|r| r.resource_id.clone()),
        resolved_at: row.and_then(|r| r.resolved_at),
        failed_at: row.and_then(|r| r.failed_at).or(Some(observed_at)),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_at,
    }
}

/// The binding's status at `now`: `resolved` while its source resolves it
/// and its last confirmation (the row's `observed_at` or the source's
/// snapshot freshness, the later) is within the source's TTL; `stale`
/// otherwise. The API's SQL (`services/api/src/bindings.rs`) is the same rule.
pub fn resolution_status(
    row: &BindingRow,
    source_observed_at: Option<DateTime<Utc>>,
    ttl: Duration,
    now: DateTime<Utc>,
) -> ResolutionStatus {
    let confirmed = source_observed_at.map_or(row.observed_at, |f| f.max(row.observed_at));
    if row.failed_at.is_none() && row.resource_id.is_some() && confirmed + ttl >= now {
        ResolutionStatus::Resolved
    } else {
        ResolutionStatus::Stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn resolved(id: &str) -> BindingInput {
        BindingInput::Resolved {
            resource: Resource::Placement,
            resource_id: id.into(),
        }
    }

    fn unreachable() -> BindingInput {
        BindingInput::Failed {
            resource: Resource::Placement,
            reason: "PlacementUnreachable".into(),
            message: "placement did not answer".into(),
        }
    }

    fn apply(row: Option<&BindingRow>, given: Option<&BindingInput>, t: i64) -> Option<BindingRow> {
        BindingRow::apply(row, Resource::Placement, Source::Openstack, given, at(t))
    }

    /// Seed 002: "Each typed resource exposes its own status (resolved or
    /// stale) and freshness timestamps. A failed resource retains its
    /// last-known row as stale, while fresh resources remain resolved;
    /// readers derive stale state from the persisted timestamps at read time."
    #[test]
    fn a_failed_resource_keeps_its_last_known_row_as_stale() {
        let ttl = Duration::seconds(60);
        let first = apply(None, Some(&resolved("rp-1")), 0).unwrap();
        assert_eq!(first.resolved_at, Some(at(0)));
        assert_eq!(
            resolution_status(&first, Some(at(0)), ttl, at(30)),
            ResolutionStatus::Resolved
        );
        // Confirmed again: nothing to write, the source's freshness row
        // carries the confirmation.
        let again = apply(Some(&first), Some(&resolved("rp-1")), 10).unwrap();
        assert_eq!(again, first);
        // "derive stale state from the persisted timestamps at read time":
        // no write at all, only time passing.
        assert_eq!(
            resolution_status(&again, Some(at(20)), ttl, at(81)),
            ResolutionStatus::Stale
        );
        assert_eq!(
            resolution_status(&again, Some(at(20)), ttl, at(80)),
            ResolutionStatus::Resolved
        );
        // "A failed resource retains its last-known row as stale".
        let failing = apply(Some(&again), Some(&unreachable()), 20).unwrap();
        assert_eq!(failing.resource_id.as_deref(), Some("rp-1"));
        assert_eq!(failing.resolved_at, Some(at(0)));
        assert_eq!(failing.failed_at, Some(at(20)));
        assert_eq!(failing.reason, "PlacementUnreachable");
        assert_eq!(
            resolution_status(&failing, Some(at(20)), ttl, at(21)),
            ResolutionStatus::Stale
        );
        // Still failing: failed_at is when it started.
        let still = apply(Some(&failing), Some(&unreachable()), 30).unwrap();
        assert_eq!(still.failed_at, Some(at(20)));
        // Back: resolved again from that observation.
        let back = apply(Some(&still), Some(&resolved("rp-1")), 40).unwrap();
        assert_eq!((back.failed_at, back.resolved_at), (None, Some(at(40))));
        assert_eq!(
            resolution_status(&back, Some(at(40)), ttl, at(41)),
            ResolutionStatus::Resolved
        );
    }

    /// Seed 002: "It does not replace the device's operational or health
    /// status": the same snapshot with the binding resolved, failed or left
    /// out derives the same device.
    #[test]
    fn a_binding_never_changes_operational_or_health_status() {
        use crate::state::{ConditionInput, DeviceRecord, DeviceState, Mirror, Snapshot, Ttls};
        use crate::{ConditionStatus, ConditionType};
        let now = at(100);
        let derive = |bindings: Vec<BindingInput>| {
            let mut s = DeviceState::new(DeviceRecord::new("d1".into(), "s1".into(), "n1".into()));
            let before = s.clone();
            let snap = Snapshot {
                source: Source::Openstack,
                observed_at: at(90),
                conditions: vec![ConditionInput {
                    condition_type: ConditionType::IronicProvisionHealthy,
                    status: ConditionStatus::True,
                    reason: "ProvisionStateActive".into(),
                    message: String::new(),
                }],
                mirror: Mirror::None,
                bindings,
            }
            .validate(now)
            .unwrap();
            s.apply_snapshot(&snap, now);
            s.finish(&before, false, now, &Ttls::uniform(Duration::minutes(5)));
            (s.record, s.bindings.len())
        };
        let (resolved_, n) = derive(vec![resolved("rp-1")]);
        assert_eq!(n, 1);
        let (failing, _) = derive(vec![unreachable()]);
        let (absent, n) = derive(vec![]);
        assert_eq!(n, 0);
        assert_eq!(resolved_, failing);
        assert_eq!(resolved_, absent);
    }

    #[test]
    fn a_new_resource_id_is_a_new_resolution() {
        let first = apply(None, Some(&resolved("rp-1")), 0).unwrap();
        let moved = apply(Some(&first), Some(&resolved("rp-2")), 10).unwrap();
        assert_eq!(moved.resource_id.as_deref(), Some("rp-2"));
        assert_eq!(moved.resolved_at, Some(at(10)));
    }

    #[test]
    fn a_binding_its_source_stops_listing_goes_stale_and_keeps_its_id() {
        let first = apply(None, Some(&resolved("rp-1")), 0).unwrap();
        let gone = apply(Some(&first), None, 10).unwrap();
        assert_eq!(gone.reason, NOT_REPORTED);
        assert_eq!(gone.resource_id.as_deref(), Some("rp-1"));
        assert_eq!(
            resolution_status(&gone, Some(at(10)), Duration::hours(1), at(11)),
            ResolutionStatus::Stale
        );
        // Never resolved and not listed: no row at all.
        assert_eq!(apply(None, None, 10), None);
        // Never resolved and failing: a row, stale, with no id.
        let never = apply(None, Some(&unreachable()), 10).unwrap();
        assert_eq!(never.resource_id, None);
        assert_eq!(
            resolution_status(&never, Some(at(10)), Duration::hours(1), at(11)),
            ResolutionStatus::Stale
        );
    }

    #[test]
    fn an_older_observation_changes_nothing() {
        let first = apply(None, Some(&resolved("rp-1")), 10).unwrap();
        assert_eq!(apply(Some(&first), Some(&unreachable()), 5), Some(first));
    }

    #[test]
    fn only_the_owner_resolves_a_resource() {
        assert!(Resource::Placement.check_owner(Source::Openstack).is_ok());
        for (r, s) in [
            (Resource::Placement, Source::Slurm),
            (Resource::Uni, Source::Openstack),
            (Resource::Kubernetes, Source::Netbox),
        ] {
            assert!(matches!(
                r.check_owner(s),
                Err(DomainError::ForbiddenSource { .. })
            ));
        }
        assert!(resolved(" ").check().is_err());
        assert!(unreachable().check().is_ok());
        assert_eq!(
            Resource::owned_by(Source::Openstack).collect::<Vec<_>>(),
            [Resource::Placement]
        );
    }
}
