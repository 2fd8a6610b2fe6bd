//! Impairment events (seed 002, "Impairment events (separate from device
//! conditions)"): a cordon workflow over many devices, not a device axis.
//! Pure: the workflow service stores these values, and asks this module
//! what an event's status is once its devices have moved, whether an event
//! may be cleared, and which Placement trait edit a device needs.
//!
//! Seed 002: "Event status: accepted → cordoned → cleared (or
//! partially_failed / failed; release sub-states: release_pending,
//! release_retrying, release_failed). Per-device status within an event:
//! pending → cordoned → cleared (or failed / retrying / release
//! sub-states)."

use crate::error::DomainError;
use crate::vocab::{vocab, OperationalStatus};

vocab!(
    /// `ImpairmentEvent.status`.
    EventStatus, "impairment event status" {
    Accepted => "accepted",
    Cordoned => "cordoned",
    PartiallyFailed => "partially_failed",
    Failed => "failed",
    ReleasePending => "release_pending",
    ReleaseRetrying => "release_retrying",
    ReleaseFailed => "release_failed",
    Cleared => "cleared",
});

vocab!(
    /// The status of one device within an event.
    EventDeviceStatus, "impairment event device status" {
    Pending => "pending",
    Retrying => "retrying",
    Cordoned => "cordoned",
    Failed => "failed",
    ReleasePending => "release_pending",
    ReleaseRetrying => "release_retrying",
    ReleaseFailed => "release_failed",
    Cleared => "cleared",
});

vocab!(
    /// The Placement trait work a device's step carries out.
    PlacementAction, "placement action" {
    RemoveCustomerReadyTrait => "remove_customer_ready_trait",
    RestoreCustomerReadyTrait => "restore_customer_ready_trait",
});

impl EventDeviceStatus {
    /// Still to be worked on by the cordon.
    pub fn cordon_open(self) -> bool {
        matches!(
            self,
            EventDeviceStatus::Pending | EventDeviceStatus::Retrying
        )
    }

    /// Still to be worked on by the release.
    pub fn release_open(self) -> bool {
        matches!(
            self,
            EventDeviceStatus::ReleasePending | EventDeviceStatus::ReleaseRetrying
        )
    }
}

/// The event's status from its devices' statuses: while the cordon is in
/// flight it stays `accepted`; once no device is open it is `cordoned` when
/// every device is, `failed` when none is, `partially_failed` otherwise.
/// During a release: `release_retrying` while a device retries,
/// `release_pending` while one waits, then `cleared` when every device is,
/// `release_failed` otherwise.
pub fn event_status(devices: &[EventDeviceStatus]) -> EventStatus {
    use EventDeviceStatus as D;
    let any = |f: fn(D) -> bool| devices.iter().any(|d| f(*d));
    let releasing = any(|d| {
        matches!(
            d,
            D::ReleasePending | D::ReleaseRetrying | D::ReleaseFailed | D::Cleared
        )
    });
    if releasing {
        if any(|d| d == D::ReleaseRetrying) {
            return EventStatus::ReleaseRetrying;
        }
        if any(|d| d == D::ReleasePending) {
            return EventStatus::ReleasePending;
        }
        return if devices.iter().all(|d| *d == D::Cleared) {
            EventStatus::Cleared
        } else {
            EventStatus::ReleaseFailed
        };
    }
    if any(D::cordon_open) || devices.is_empty() {
        return EventStatus::Accepted;
    }
    let cordoned = devices.iter().filter(|d| **d == D::Cordoned).count();
    if cordoned == devices.len() {
        EventStatus::Cordoned
    } else if cordoned == 0 {
        EventStatus::Failed
    } else {
        EventStatus::PartiallyFailed
    }
}

/// Whether an event may be cleared now. Seed 002: "Clearing the event
/// queues release work"; a cordon still in flight is finished first, and a
/// release already queued is not queued twice. A `release_failed` event may
/// be cleared again: the devices that failed are tried once more.
pub fn may_clear(status: EventStatus) -> Result<(), DomainError> {
    match status {
        EventStatus::Cordoned
        | EventStatus::PartiallyFailed
        | EventStatus::Failed
        | EventStatus::ReleaseFailed => Ok(()),
        EventStatus::Accepted => Err(DomainError::InvalidState(
            "the event is still being applied; clear it once its cordon is done".into(),
        )),
        EventStatus::ReleasePending | EventStatus::ReleaseRetrying => Err(
            DomainError::InvalidState("the event is already being released".into()),
        ),
        EventStatus::Cleared => Err(DomainError::InvalidState(
            "the event is already cleared".into(),
        )),
    }
}

/// Seed 002: the release "restores the trait for a pre-hold available or
/// in_use host".
pub fn restores_trait(pre_hold: OperationalStatus) -> bool {
    matches!(
        pre_hold,
        OperationalStatus::Available | OperationalStatus::InUse
    )
}

/// The trait list with `wanted` present (`true`) or absent (`false`), or
/// `None` when the list already is: no write is needed, so a re-run after a
/// crash repeats nothing Placement already shows.
pub fn edit_traits(traits: &[String], name: &str, wanted: bool) -> Option<Vec<String>> {
    let has = traits.iter().any(|t| t == name);
    match (has, wanted) {
        (true, true) | (false, false) => None,
        (false, true) => {
            let mut out = traits.to_vec();
            out.push(name.to_string());
            out.sort();
            Some(out)
        }
        (true, false) => Some(traits.iter().filter(|t| *t != name).cloned().collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EventDeviceStatus as D;

    /// "Event status: accepted → cordoned → cleared (or partially_failed /
    /// failed; release sub-states: release_pending, release_retrying,
    /// release_failed)".
    #[test]
    fn event_status_follows_its_devices() {
        let table: &[(&[D], EventStatus)] = &[
            (&[D::Pending, D::Pending], EventStatus::Accepted),
            (&[D::Cordoned, D::Retrying], EventStatus::Accepted),
            (&[D::Cordoned, D::Cordoned], EventStatus::Cordoned),
            (&[D::Cordoned, D::Failed], EventStatus::PartiallyFailed),
            (&[D::Failed, D::Failed], EventStatus::Failed),
            (
                &[D::ReleasePending, D::Cleared],
                EventStatus::ReleasePending,
            ),
            (
                &[D::ReleaseRetrying, D::ReleasePending],
                EventStatus::ReleaseRetrying,
            ),
            (&[D::Cleared, D::Cleared], EventStatus::Cleared),
            (&[D::Cleared, D::ReleaseFailed], EventStatus::ReleaseFailed),
            (&[], EventStatus::Accepted),
        ];
        for (devices, want) in table {
            assert_eq!(event_status(devices), *want, "{devices:?}");
        }
    }

    /// "Clearing the event queues release work".
    #[test]
    fn clearing_is_allowed_once_the_cordon_is_done_and_not_twice() {
        for s in [
            EventStatus::Cordoned,
            EventStatus::PartiallyFailed,
            EventStatus::Failed,
            EventStatus::ReleaseFailed,
        ] {
            assert!(may_clear(s).is_ok(), "{s}");
        }
        for s in [
            EventStatus::Accepted,
            EventStatus::ReleasePending,
            EventStatus::ReleaseRetrying,
            EventStatus::Cleared,
        ] {
            assert!(
                matches!(may_clear(s), Err(DomainError::InvalidState(_))),
                "{s}"
            );
        }
    }

    /// "restores the trait for a pre-hold available or in_use host".
    #[test]
    fn only_a_pre_hold_available_or_in_use_host_gets_the_trait_back() {
        for s in OperationalStatus::ALL {
            let want = matches!(s, OperationalStatus::Available | OperationalStatus::InUse);
            assert_eq!(restores_trait(*s), want, "{s}");
        }
    }

    #[test]
    fn trait_edits_write_only_what_is_missing() {
        let t = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ready = "CUSTOM_CUSTOMER_READY";
        assert_eq!(
            edit_traits(&t(&["HW_CPU_X86_AVX2", ready]), ready, false),
            Some(t(&["HW_CPU_X86_AVX2"]))
        );
        assert_eq!(edit_traits(&t(&["HW_CPU_X86_AVX2"]), ready, false), None);
        assert_eq!(
            edit_traits(&t(&["HW_CPU_X86_AVX2"]), ready, true),
            Some(t(&[ready, "HW_CPU_X86_AVX2"]))
        );
        assert_eq!(edit_traits(&t(&[ready]), ready, true), None);
    }
}
