//! fleet-latch: how workflows write the durable fabric latches
//! (`FrontendPortsInCustomerVrf`, `BackendPortsInMaintenanceVrf`,
//! `NvLinkGpusInRepairPartition`) after a verified flip or move.
//!
//! A latch write goes through the hub's `write_condition` command
//! (`<root>.hub.cmd.write_condition`), observation-ordered: `observed_at`
//! is when the workflow read the switch or NMX-M. The hub answers with the
//! row it stored; a row different from what was sent means the write was
//! stale-rejected (a later observation is on record), and the workflow
//! must fail rather than report a latch it did not record. Every failure
//! carries the workflow failure code of its latch:
//! `SWITCH_VRF_LATCH_WRITE_FAILED` (front-end),
//! `BACKEND_VRF_LATCH_WRITE_FAILED`, `NVLINK_LATCH_WRITE_FAILED`.
//!
//! Simulated runs verified nothing and must not call this.

use std::time::Duration;

use chrono::{DateTime, Utc};
use fleet_bus::Subjects;
use fleet_domain::failure::FailureCode;
use fleet_domain::{ConditionStatus, ConditionType, Source};
use fleet_proto::{v1, ErrorCode};

/// The three workflow-written latches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Latch {
    /// Front-end VRF flips (`frontend-fabric`).
    FrontendVrf,
    /// Back-end RoCE VRF flips (`backend-fabric`).
    BackendVrf,
    /// NVLink repair-partition moves (`nvlink-fabric`).
    NvlinkPartition,
}

impl Latch {
    pub fn condition_type(self) -> ConditionType {
        match self {
            Latch::FrontendVrf => ConditionType::FrontendPortsInCustomerVrf,
            Latch::BackendVrf => ConditionType::BackendPortsInMaintenanceVrf,
            Latch::NvlinkPartition => ConditionType::NvLinkGpusInRepairPartition,
        }
    }

    pub fn source(self) -> Source {
        match self {
            Latch::FrontendVrf => Source::FrontendFabric,
            Latch::BackendVrf => Source::BackendFabric,
            Latch::NvlinkPartition => Source::NvlinkFabric,
        }
    }

    /// The code a workflow fails with when the write did not land
    /// (`fleet_domain::failure`).
    pub fn failure_code(self) -> FailureCode {
        match self {
            Latch::FrontendVrf => FailureCode::SwitchVrfLatchWriteFailed,
            Latch::BackendVrf => FailureCode::BackendVrfLatchWriteFailed,
            Latch::NvlinkPartition => FailureCode::NvlinkLatchWriteFailed,
        }
    }

    /// The reasons a workflow writes (`conditions.md`, "Latch reasons"),
    /// each with its status: the catalogue's, which the hub checks every
    /// latch write against. `HandoverBreach` is the hub's own custody
    /// entry write and not among them.
    pub fn reasons(self) -> &'static [(&'static str, ConditionStatus)] {
        self.condition_type().latch_reasons().unwrap_or(&[])
    }
}

/// One latch write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatchWrite {
    pub latch: Latch,
    /// Usually `device_id` (no site); any key the hub resolves works.
    pub device: v1::DeviceKey,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
    /// When the flip or move was read back, truncated to the microsecond
    /// PostgreSQL stores so the returned row compares equal.
    pub observed_at: DateTime<Utc>,
}

impl LatchWrite {
    /// A write with the status its reason carries; an unknown reason is
    /// refused before anything is sent.
    pub fn new(
        latch: Latch,
        device: v1::DeviceKey,
        reason: &str,
        message: impl Into<String>,
        observed_at: DateTime<Utc>,
    ) -> Result<Self, LatchError> {
        let status = latch
            .reasons()
            .iter()
            .find(|(r, _)| *r == reason)
            .map(|(_, s)| *s)
            .ok_or_else(|| LatchError::Invalid {
                code: latch.failure_code(),
                message: format!(
                    "{reason:?} is not a {} reason ({})",
                    latch.condition_type(),
                    latch
                        .reasons()
                        .iter()
                        .map(|(r, _)| *r)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })?;
        Ok(LatchWrite {
            latch,
            device,
            status,
            reason: reason.to_string(),
            message: message.into(),
            observed_at: micros(observed_at),
        })
    }

    /// A device named by its fleet id.
    pub fn device_id(id: &str) -> v1::DeviceKey {
        v1::DeviceKey {
            site: String::new(),
            kind: "device_id".into(),
            key: id.to_string(),
        }
    }

    /// The `write_condition` command.
    pub fn command(&self, actor: &str) -> v1::HubCommand {
        v1::HubCommand {
            actor: actor.to_string(),
            expected_version: 0,
            command: Some(v1::hub_command::Command::WriteCondition(
                v1::ConditionWrite {
                    source: self.latch.source().as_str().to_string(),
                    device: Some(self.device.clone()),
                    condition: Some(v1::Condition {
                        r#type: self.latch.condition_type().as_str().to_string(),
                        status: self.status.as_str().to_string(),
                        reason: self.reason.clone(),
                        message: self.message.clone(),
                    }),
                    observed_at: Some(fleet_proto::timestamp(self.observed_at)),
                    hub_ordered: false,
                },
            )),
        }
    }
}

fn micros(t: DateTime<Utc>) -> DateTime<Utc> {
    fleet_proto::datetime(Some(&fleet_proto::timestamp(t))).unwrap_or(t)
}

/// The condition row the hub stored and returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLatch {
    pub device_id: String,
    pub condition_type: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    pub source: String,
    pub observed_at: DateTime<Utc>,
}

impl StoredLatch {
    /// Whether this is the row `w` asked for.
    pub fn records(&self, w: &LatchWrite) -> bool {
        self.condition_type == w.latch.condition_type().as_str()
            && self.status == w.status.as_str()
            && self.reason == w.reason
            && self.message == w.message
            && self.source == w.latch.source().as_str()
            && self.observed_at == w.observed_at
    }
}

/// A latch write that did not land. Every variant carries the latch's
/// failure code ([`LatchError::code`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LatchError {
    #[error("{code}: invalid latch write: {message}")]
    Invalid { code: FailureCode, message: String },
    /// The hub answered with an error (`FORBIDDEN_SOURCE`, `NOT_FOUND`,
    /// `FUTURE_OBSERVATION`, ...).
    #[error("{code}: the hub refused the write ({}): {message}", hub_code.as_str_name())]
    Refused {
        code: FailureCode,
        hub_code: ErrorCode,
        message: String,
    },
    /// The hub kept a later row: this write is not on record.
    #[error(
        "{code}: stale-rejected: the hub kept {} {}/{} observed at {}, not the write observed at {sent_observed_at}",
        stored.condition_type, stored.status, stored.reason, stored.observed_at.to_rfc3339()
    )]
    StaleRejected {
        code: FailureCode,
        stored: Box<StoredLatch>,
        sent_observed_at: String,
    },
    /// No answer (no hub, timeout, NATS away, the hub's store away) after
    /// every attempt.
    #[error("{code}: no answer from the hub after {attempts} attempts: {message}")]
    Unavailable {
        code: FailureCode,
        attempts: u32,
        message: String,
    },
    #[error("{code}: the hub's reply is not a condition row: {message}")]
    BadReply { code: FailureCode, message: String },
}

impl LatchError {
    /// The workflow failure code.
    pub fn code(&self) -> FailureCode {
        match self {
            LatchError::Invalid { code, .. }
            | LatchError::Refused { code, .. }
            | LatchError::StaleRejected { code, .. }
            | LatchError::Unavailable { code, .. }
            | LatchError::BadReply { code, .. } => *code,
        }
    }
}

/// Checks the hub's reply to `w`: the stored row, or why the write is not
/// on record. Pure.
pub fn verify(w: &LatchWrite, reply: &v1::HubReply) -> Result<StoredLatch, LatchError> {
    let code = w.latch.failure_code();
    if let Some(e) = &reply.error {
        return Err(LatchError::Refused {
            code,
            hub_code: fleet_proto::error_code_of(e.code),
            message: e.message.clone(),
        });
    }
    let bad = |message: &str| LatchError::BadReply {
        code,
        message: message.to_string(),
    };
    let row = match &reply.record {
        Some(v1::hub_reply::Record::Condition(row)) => row,
        _ => return Err(bad("the reply carries no condition row")),
    };
    let stored = StoredLatch {
        device_id: row.device_id.clone(),
        condition_type: row.r#type.clone(),
        status: row.status.clone(),
        reason: row.reason.clone(),
        message: row.message.clone(),
        source: row.source.clone(),
        observed_at: fleet_proto::datetime(row.observed_at.as_ref())
            .ok_or_else(|| bad("the condition row has no observed_at"))?,
    };
    if stored.records(w) {
        Ok(stored)
    } else {
        Err(LatchError::StaleRejected {
            code,
            stored: Box::new(stored),
            sent_observed_at: w.observed_at.to_rfc3339(),
        })
    }
}

/// Sends latch writes to the hub.
#[derive(Clone)]
pub struct LatchWriter {
    pub nats: async_nats::Client,
    pub subjects: Subjects,
    /// Who writes (`workflow:<name>:<job>`), recorded as the cause.
    pub actor: String,
    /// How long one attempt waits for the hub.
    pub timeout: Duration,
    /// Attempts while the hub does not answer or answers `UNAVAILABLE`.
    pub attempts: u32,
}

impl LatchWriter {
    pub fn new(nats: async_nats::Client, subjects: Subjects, actor: &str) -> Self {
        LatchWriter {
            nats,
            subjects,
            actor: actor.to_string(),
            timeout: Duration::from_secs(5),
            attempts: 3,
        }
    }

    /// Writes the latch and returns the row the hub stored, which is the
    /// one sent; anything else is an error with the latch's failure code.
    /// Re-sending the same write (a re-run job) is answered with the same
    /// row and succeeds.
    pub async fn write(&self, w: &LatchWrite) -> Result<StoredLatch, LatchError> {
        let code = w.latch.failure_code();
        let hub = fleet_hub_client::HubClient::new(
            self.nats.clone(),
            self.subjects.clone(),
            self.timeout,
        );
        let command = w.command(&self.actor).command;
        let attempts = self.attempts.max(1);
        let mut last = String::new();
        for attempt in 1..=attempts {
            if attempt > 1 {
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt - 1))).await;
            }
            let Some(c) = command.clone() else {
                return Err(LatchError::Invalid {
                    code,
                    message: "no command".into(),
                });
            };
            let reply = match hub.request(&self.actor, 0, c).await {
                Ok(r) => r,
                Err(fleet_hub_client::HubCallError::BadReply(e)) => {
                    return Err(LatchError::BadReply {
                        code,
                        message: format!("undecodable HubReply: {e}"),
                    })
                }
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            match verify(w, &reply) {
                Err(LatchError::Refused {
                    hub_code, message, ..
                }) if hub_code == ErrorCode::Unavailable => {
                    last = format!("{}: {message}", hub_code.as_str_name());
                }
                Err(e) => {
                    tracing::error!(code = code.as_str(), latch = %w.latch.condition_type(), device_key = %w.device.key, error = %e, "latch write failed");
                    return Err(e);
                }
                Ok(stored) => {
                    tracing::info!(latch = %w.latch.condition_type(), device_id = %stored.device_id, status = %stored.status, reason = %stored.reason, "latch recorded");
                    return Ok(stored);
                }
            }
        }
        let e = LatchError::Unavailable {
            code,
            attempts,
            message: last,
        };
        tracing::error!(code = code.as_str(), latch = %w.latch.condition_type(), device_key = %w.device.key, error = %e, "latch write failed");
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-29T16:00:00.123456789Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn write(latch: Latch, reason: &str) -> LatchWrite {
        LatchWrite::new(
            latch,
            LatchWrite::device_id("dev-1"),
            reason,
            "read back from leaf01",
            at(),
        )
        .unwrap()
    }

    fn reply(row: v1::ConditionRow) -> v1::HubReply {
        v1::HubReply {
            error: None,
            version: 3,
            record: Some(v1::hub_reply::Record::Condition(row)),
        }
    }

    fn row_of(w: &LatchWrite) -> v1::ConditionRow {
        let t = Some(fleet_proto::timestamp(w.observed_at));
        v1::ConditionRow {
            device_id: "dev-1".into(),
            r#type: w.latch.condition_type().as_str().into(),
            status: w.status.as_str().into(),
            reason: w.reason.clone(),
            message: w.message.clone(),
            source: w.latch.source().as_str().into(),
            condition_of: "none".into(),
            durable: true,
            observed_at: t,
            received_at: t,
            decisive: false,
            last_transition_at: t,
            stale: false,
        }
    }

    #[test]
    fn reasons_carry_their_status_and_codes() {
        let cases = [
            (
                Latch::FrontendVrf,
                "CustomerVrfFlipVerified",
                ConditionStatus::True,
                "SWITCH_VRF_LATCH_WRITE_FAILED",
            ),
            (
                Latch::FrontendVrf,
                "IsolateFlipVerified",
                ConditionStatus::False,
                "SWITCH_VRF_LATCH_WRITE_FAILED",
            ),
            (
                Latch::BackendVrf,
                "IsolateVerified",
                ConditionStatus::True,
                "BACKEND_VRF_LATCH_WRITE_FAILED",
            ),
            (
                Latch::BackendVrf,
                "ApplyInProgress",
                ConditionStatus::Unknown,
                "BACKEND_VRF_LATCH_WRITE_FAILED",
            ),
            (
                Latch::BackendVrf,
                "ManualReturn",
                ConditionStatus::False,
                "BACKEND_VRF_LATCH_WRITE_FAILED",
            ),
            (
                Latch::NvlinkPartition,
                "MoveVerified",
                ConditionStatus::True,
                "NVLINK_LATCH_WRITE_FAILED",
            ),
            (
                Latch::NvlinkPartition,
                "MoveInProgress",
                ConditionStatus::Unknown,
                "NVLINK_LATCH_WRITE_FAILED",
            ),
            (
                Latch::NvlinkPartition,
                "ReturnVerified",
                ConditionStatus::False,
                "NVLINK_LATCH_WRITE_FAILED",
            ),
        ];
        for (latch, reason, status, code) in cases {
            let w = write(latch, reason);
            assert_eq!(w.status, status, "{reason}");
            assert_eq!(latch.failure_code().as_str(), code);
            assert!(latch.condition_type().is_durable());
            assert!(latch.condition_type().check_owner(latch.source()).is_ok());
        }
        let e = LatchWrite::new(
            Latch::FrontendVrf,
            LatchWrite::device_id("d"),
            "HandoverBreach",
            "",
            at(),
        )
        .unwrap_err();
        assert_eq!(e.code().as_str(), "SWITCH_VRF_LATCH_WRITE_FAILED");
        assert!(
            e.to_string()
                .contains("CustomerVrfFlipVerified, IsolateFlipVerified, FlipInProgress"),
            "{e}"
        );
        assert!(LatchWrite::new(
            Latch::NvlinkPartition,
            LatchWrite::device_id("d"),
            "IsolateVerified",
            "",
            at()
        )
        .is_err());
    }

    #[test]
    fn the_command_is_an_observation_ordered_write() {
        let w = write(Latch::BackendVrf, "IsolateVerified");
        assert_eq!(
            w.observed_at.timestamp_subsec_nanos(),
            123_456_000,
            "microseconds"
        );
        let c = w.command("workflow:backend-isolate:job-7");
        assert_eq!(c.expected_version, 0);
        match c.command {
            Some(v1::hub_command::Command::WriteCondition(cw)) => {
                assert_eq!(cw.source, "backend-fabric");
                assert!(!cw.hub_ordered);
                let cond = cw.condition.unwrap();
                assert_eq!(
                    (
                        cond.r#type.as_str(),
                        cond.status.as_str(),
                        cond.reason.as_str()
                    ),
                    ("BackendPortsInMaintenanceVrf", "True", "IsolateVerified")
                );
                assert_eq!(
                    fleet_proto::datetime(cw.observed_at.as_ref()),
                    Some(w.observed_at)
                );
                assert_eq!(cw.device.unwrap().kind, "device_id");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn verify_accepts_only_the_row_sent() {
        let w = write(Latch::FrontendVrf, "IsolateFlipVerified");
        let stored = verify(&w, &reply(row_of(&w))).unwrap();
        assert_eq!(stored.device_id, "dev-1");
        // A later observation is on record: stale-rejected.
        let mut later = row_of(&w);
        later.observed_at = Some(fleet_proto::timestamp(
            w.observed_at + chrono::Duration::seconds(30),
        ));
        later.status = "True".into();
        later.reason = "CustomerVrfFlipVerified".into();
        let e = verify(&w, &reply(later)).unwrap_err();
        assert!(matches!(e, LatchError::StaleRejected { .. }), "{e}");
        assert_eq!(e.code().as_str(), "SWITCH_VRF_LATCH_WRITE_FAILED");
        assert!(e.to_string().contains("stale-rejected"), "{e}");
        // Same value, but another time or another writer: not this write.
        let earlier = |r: &mut v1::ConditionRow| {
            r.observed_at = Some(fleet_proto::timestamp(
                w.observed_at - chrono::Duration::microseconds(1),
            ))
        };
        let borneo = |r: &mut v1::ConditionRow| r.source = "borneo".into();
        let other = |r: &mut v1::ConditionRow| r.message = "another message".into();
        let changes: [(&str, &dyn Fn(&mut v1::ConditionRow)); 3] = [
            ("observed_at", &earlier),
            ("source", &borneo),
            ("message", &other),
        ];
        for (field, change) in changes {
            let mut r = row_of(&w);
            change(&mut r);
            assert!(
                matches!(verify(&w, &reply(r)), Err(LatchError::StaleRejected { .. })),
                "{field}"
            );
        }
        let refused = v1::HubReply {
            error: Some(v1::HubError {
                code: ErrorCode::NotFound as i32,
                message: "device device_id dev-1".into(),
            }),
            version: 0,
            record: None,
        };
        let e = verify(&w, &refused).unwrap_err();
        assert_eq!(e.code().as_str(), "SWITCH_VRF_LATCH_WRITE_FAILED");
        assert!(
            matches!(&e, LatchError::Refused { hub_code, .. } if *hub_code == ErrorCode::NotFound)
        );
        let garbage = v1::HubReply {
            error: None,
            version: 0,
            record: Some(v1::hub_reply::Record::Device(Default::default())),
        };
        assert!(matches!(
            verify(&w, &garbage),
            Err(LatchError::BadReply { .. })
        ));
    }
}
