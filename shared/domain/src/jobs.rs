//! The job model of seed 002 ("Job status", "Job device status"): a job
//! over many devices, each device running one workflow. Pure: the workflow
//! service stores these values and asks this module what a job's status is
//! and which moves are allowed.

use crate::error::DomainError;
use crate::vocab::vocab;

vocab!(
    /// `Job.status`: the aggregate over every device of the job.
    JobStatus, "job status" {
    Pending => "pending",
    Running => "running",
    Succeeded => "succeeded",
    PartiallyFailed => "partially_failed",
    Failed => "failed",
    Cancelled => "cancelled",
});

vocab!(
    /// `JobDeviceStatus.status` once the device has started. Before that
    /// the status is empty (`None` in Rust, `""` on the wire): seed 002,
    /// "there is no pending value".
    DeviceRunStatus, "job device status" {
    Running => "running",
    Succeeded => "succeeded",
    Failed => "failed",
    Cancelled => "cancelled",
    Terminated => "terminated",
    Superseded => "superseded",
});

impl JobStatus {
    /// Seed 002: "Terminal values will not transition further."
    pub fn is_terminal(self) -> bool {
        !matches!(self, JobStatus::Pending | JobStatus::Running)
    }
}

impl DeviceRunStatus {
    pub fn is_terminal(self) -> bool {
        self != DeviceRunStatus::Running
    }
}

/// A device's status moving from `from` to `to`: a device starts
/// (`None -> running`, or straight to `cancelled` when the job is cancelled
/// before it started), and a terminal value never changes again. Moving to
/// the value it has is allowed (a redelivered step reports it again).
pub fn device_transition(
    from: Option<DeviceRunStatus>,
    to: DeviceRunStatus,
) -> Result<DeviceRunStatus, DomainError> {
    match from {
        Some(f) if f == to => Ok(to),
        Some(f) if f.is_terminal() => Err(DomainError::InvalidState(format!(
            "a job device that is {f} stays {f}; it cannot become {to}"
        ))),
        _ => Ok(to),
    }
}

/// `Job.status` from its devices' statuses and whether an operator asked
/// to cancel it. Seed 002 names the values but not how they aggregate;
/// this is the rule (docs/consumers.md, "workflow"):
///
/// - no device started and no cancel: `pending`;
/// - a device still running, or one not started while the job is not
///   cancelled: `running`;
/// - every device terminal (or never started, once cancelled): `succeeded`
///   when all succeeded; `partially_failed` when some succeeded and some did
///   not; `cancelled` when none succeeded and the job was cancelled;
///   `failed` when none succeeded otherwise.
///
/// A device `superseded` by a newer job counts as not succeeded here: this
/// job did not do its work.
pub fn job_status(devices: &[Option<DeviceRunStatus>], cancel_requested: bool) -> JobStatus {
    use DeviceRunStatus as D;
    let running = devices.iter().any(|d| *d == Some(D::Running));
    let not_started = devices.iter().any(|d| d.is_none());
    if running || (not_started && !cancel_requested) {
        let started = devices.iter().any(|d| d.is_some());
        return if started || running {
            JobStatus::Running
        } else {
            JobStatus::Pending
        };
    }
    let succeeded = devices.iter().filter(|d| **d == Some(D::Succeeded)).count();
    if succeeded == devices.len() && !devices.is_empty() {
        JobStatus::Succeeded
    } else if succeeded > 0 {
        JobStatus::PartiallyFailed
    } else if cancel_requested {
        JobStatus::Cancelled
    } else {
        JobStatus::Failed
    }
}

/// The status a stored job moves to: `next` unless the job is already
/// terminal ("terminal values will not transition further").
pub fn job_transition(from: JobStatus, next: JobStatus) -> JobStatus {
    if from.is_terminal() {
        from
    } else {
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DeviceRunStatus as D;
    use JobStatus as J;

    #[test]
    fn the_vocabularies_are_the_seeds() {
        // seed 002 / consumers.md: "pending, running, succeeded,
        // partially_failed, failed, cancelled".
        let jobs: Vec<&str> = J::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            jobs,
            [
                "pending",
                "running",
                "succeeded",
                "partially_failed",
                "failed",
                "cancelled"
            ]
        );
        // "empty until the device starts, then running, succeeded, failed,
        // cancelled, terminated, superseded"; "there is no pending value".
        let devices: Vec<&str> = D::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            devices,
            [
                "running",
                "succeeded",
                "failed",
                "cancelled",
                "terminated",
                "superseded"
            ]
        );
        assert!(D::parse("pending").is_err());
    }

    #[test]
    fn terminal_values_never_change() {
        // seed 002: "Terminal values will not transition further."
        for from in J::ALL.iter().copied().filter(|s| s.is_terminal()) {
            for next in J::ALL.iter().copied() {
                assert_eq!(job_transition(from, next), from, "{from} -> {next}");
            }
        }
        assert_eq!(job_transition(J::Pending, J::Running), J::Running);
        assert_eq!(job_transition(J::Running, J::Failed), J::Failed);
        for from in D::ALL.iter().copied().filter(|s| s.is_terminal()) {
            for to in D::ALL.iter().copied().filter(|t| *t != from) {
                assert!(device_transition(Some(from), to).is_err(), "{from} -> {to}");
            }
            assert_eq!(device_transition(Some(from), from).unwrap(), from);
        }
        // "A row is created at submit; the status is empty until Temporal
        // starts that device."
        assert_eq!(device_transition(None, D::Running).unwrap(), D::Running);
        assert_eq!(device_transition(None, D::Cancelled).unwrap(), D::Cancelled);
        assert_eq!(
            device_transition(Some(D::Running), D::Succeeded).unwrap(),
            D::Succeeded
        );
    }

    #[test]
    fn the_job_aggregates_its_devices() {
        let cases: &[(&str, &[Option<D>], bool, J)] = &[
            ("nothing started: pending", &[None, None], false, J::Pending),
            (
                "one started: running",
                &[Some(D::Running), None],
                false,
                J::Running,
            ),
            (
                "one done, one not started: running",
                &[Some(D::Succeeded), None],
                false,
                J::Running,
            ),
            (
                "all succeeded",
                &[Some(D::Succeeded), Some(D::Succeeded)],
                false,
                J::Succeeded,
            ),
            (
                "some failed",
                &[Some(D::Succeeded), Some(D::Failed)],
                false,
                J::PartiallyFailed,
            ),
            (
                "all failed",
                &[Some(D::Failed), Some(D::Terminated)],
                false,
                J::Failed,
            ),
            (
                "superseded is not this job's success",
                &[Some(D::Superseded)],
                false,
                J::Failed,
            ),
            (
                "cancelled before any started",
                &[None, None],
                true,
                J::Cancelled,
            ),
            (
                "cancelled waits for the running device",
                &[Some(D::Running), None],
                true,
                J::Running,
            ),
            (
                "cancelled after some succeeded",
                &[Some(D::Succeeded), Some(D::Cancelled)],
                true,
                J::PartiallyFailed,
            ),
            (
                "cancelled, the rest never started",
                &[Some(D::Cancelled), None],
                true,
                J::Cancelled,
            ),
        ];
        for (what, devices, cancel, want) in cases {
            assert_eq!(job_status(devices, *cancel), *want, "{what}");
        }
    }
}
