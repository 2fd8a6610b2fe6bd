//! The storm guard (issue 16): a job, or a remediation, that would take
//! more than a configured share of a site's or pool's in-service devices
//! out of service within a window waits, before its first external write,
//! for an operator's confirmation. Pure: the workflow service counts, this
//! decides.
//!
//! The numbers are chosen so that a source outage can never trip it:
//! - the denominator is the devices that have entered service and have not
//!   failed, which no outage changes (an outage makes statuses `unknown`
//!   and connectivity `unreachable`, never `entered_service_at` or
//!   `failed`);
//! - the numerator is only what admitted jobs and events take: no status
//!   change, outage or STATUS event adds to it.
//!   And nothing remediates on its own: the workflow service creates jobs
//!   and events only when asked through its API.

use std::time::Duration;

use crate::eligibility::Workflow;
use crate::vocab::OperationalStatus;

/// How much of a scope may be taken out of service within a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// At most this share of a scope's in-service devices...
    pub max_share: f64,
    /// ...but never fewer than this many devices (a small site can still
    /// work on a few at once).
    pub min_devices: usize,
    /// ...within this window.
    pub window: Duration,
}

/// A site or a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ScopeKind {
    Site,
    Pool,
}

impl ScopeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeKind::Site => "site",
            ScopeKind::Pool => "pool",
        }
    }
}

/// One scope's count, as the guard saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Count {
    pub scope_kind: ScopeKind,
    pub scope_id: String,
    /// Devices of the scope in service (entered service, not failed).
    pub in_service: usize,
    /// Devices of the scope this job or event would take out of service.
    pub taking: usize,
    /// Devices of the scope admitted work took out within the window.
    pub in_window: usize,
}

impl Policy {
    /// The most devices of a scope with `in_service` devices that may be
    /// out within the window: "more than a configured share" trips.
    pub fn limit(&self, in_service: usize) -> usize {
        let share = (self.max_share.clamp(0.0, 1.0) * in_service as f64).floor() as usize;
        share.max(self.min_devices)
    }

    /// Whether taking `c.taking` more devices trips the guard.
    pub fn trips(&self, c: &Count) -> bool {
        c.taking > 0 && c.in_window + c.taking > self.limit(c.in_service)
    }
}

impl Workflow {
    /// Whether the workflow takes a device out of service when it runs on
    /// one that is in service (seed 002: Move to Test Cluster quarantines,
    /// an isolate or a repair move takes the host from its customer, an
    /// Unimage of a host in use ends its instance).
    pub fn takes_out_of_service(self) -> bool {
        matches!(
            self,
            Workflow::MoveToTestCluster
                | Workflow::UnimageNode
                | Workflow::FrontendVrfIsolate
                | Workflow::BackendVrfIsolate
                | Workflow::NvlinkRepairMove
        )
    }
}

/// Whether a device in `status` counts as taken out of service by work on
/// it: a device serving or able to serve. `unknown` counts when the device
/// has entered service: an outage makes a job look larger, never smaller.
pub fn in_service(status: OperationalStatus, entered_service: bool) -> bool {
    use OperationalStatus as O;
    match status {
        O::Available | O::InUse | O::Delegated => true,
        O::Unknown => entered_service,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            max_share: 0.10,
            min_devices: 5,
            window: Duration::from_secs(3600),
        }
    }

    fn count(in_service: usize, taking: usize, in_window: usize) -> Count {
        Count {
            scope_kind: ScopeKind::Site,
            scope_id: "s1".into(),
            in_service,
            taking,
            in_window,
        }
    }

    /// "more than a configured share of a site's or pool's schedulable
    /// devices out of service within a window pauses".
    #[test]
    fn more_than_the_share_within_the_window_trips() {
        let p = policy();
        // 10 % of 100 is 10: ten may go, the eleventh trips.
        assert!(!p.trips(&count(100, 10, 0)));
        assert!(p.trips(&count(100, 11, 0)));
        assert!(p.trips(&count(100, 12, 0)));
        // What the window already holds counts: 5 then 6 within it trips.
        assert!(!p.trips(&count(100, 5, 0)));
        assert!(p.trips(&count(100, 6, 5)));
        // A job that takes nothing never trips, whatever the window holds.
        assert!(!p.trips(&count(100, 0, 50)));
    }

    /// A small scope may still work on `min_devices` at once.
    #[test]
    fn a_small_scope_takes_min_devices() {
        let p = policy();
        assert_eq!(p.limit(20), 5);
        assert!(!p.trips(&count(20, 5, 0)));
        assert!(p.trips(&count(20, 6, 0)));
        assert_eq!(p.limit(0), 5);
        assert_eq!(p.limit(1000), 100);
    }

    /// "a source outage never trips it": an outage turns statuses
    /// `unknown`, which counts as in service for a device that entered
    /// service (the job looks larger, never smaller), and the denominator
    /// is not a status at all.
    #[test]
    fn an_outage_makes_a_job_look_larger_never_smaller() {
        use OperationalStatus as O;
        assert!(in_service(O::Unknown, true));
        assert!(!in_service(O::Unknown, false));
        assert!(in_service(O::InUse, true));
        assert!(!in_service(O::Quarantine, true));
        assert!(!in_service(O::Failed, true));
    }

    #[test]
    fn which_workflows_take_devices_out_of_service() {
        assert!(Workflow::MoveToTestCluster.takes_out_of_service());
        assert!(Workflow::FrontendVrfIsolate.takes_out_of_service());
        assert!(!Workflow::ImageNode.takes_out_of_service());
        assert!(!Workflow::Release.takes_out_of_service());
        assert!(!Workflow::Enrollment.takes_out_of_service());
    }
}
