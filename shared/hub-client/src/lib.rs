//! The hub's client: every caller of hub commands (the API, the gateway,
//! connector-netbox's import, the latch helper) sends them through
//! [`HubClient`] over core NATS request/reply (`<root>.hub.cmd.<verb>`),
//! and reads one typed outcome: the stored record, a typed refusal, or why
//! there is no answer (no hub running: nothing was sent; no answer in
//! time: it may or may not have been applied).

use std::time::Duration;

use fleet_bus::Subjects;
use fleet_proto::{v1, ErrorCode, Message};
use v1::hub_command::Command as C;

/// The verb a command is addressed to (`<root>.hub.cmd.<verb>`).
pub fn verb(c: &C) -> &'static str {
    match c {
        C::CreateDevice(_) => "create_device",
        C::CreateDevices(_) => "create_devices",
        C::Cordon(_) => "cordon",
        C::Uncordon(_) => "uncordon",
        C::Drain(_) => "drain",
        C::Taint(_) => "taint",
        C::Triage(_) => "triage",
        C::Provision(_) => "provision",
        C::Adopt(_) => "adopt",
        C::RevokeIdentity(_) => "revoke_identity",
        C::DeleteDevice(_) => "delete_device",
        C::WriteCondition(_) => "write_condition",
        C::EnrollmentProof(_) => "enrollment_proof",
        C::ImpairmentHold(_) => "impairment_hold",
        C::Join(_) => "join",
        C::SetMaintenance(_) => "set_maintenance",
        C::ApplySnapshot(_) => "apply_snapshot",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HubCallError {
    /// No hub was subscribed: the command was not sent, nothing applied.
    #[error("no hub is running; the command was not sent and nothing was applied")]
    NotRunning,
    /// No answer in time: the command may or may not have been applied.
    #[error("the hub did not answer within {0} ms; the command may or may not have been applied")]
    Timeout(u128),
    /// NATS itself failed (disconnected): nothing is known to be applied.
    #[error("the hub is unreachable: {0}")]
    Transport(String),
    /// The reply does not decode.
    #[error("the hub answered something unreadable: {0}")]
    BadReply(String),
    /// The hub refused the command.
    #[error("{}: {message}", code.as_str_name())]
    Refused { code: ErrorCode, message: String },
}

impl HubCallError {
    /// The error code a caller passes on: the hub's own, else UNAVAILABLE.
    pub fn code(&self) -> ErrorCode {
        match self {
            HubCallError::Refused { code, .. } => *code,
            _ => ErrorCode::Unavailable,
        }
    }
}

/// A command the hub applied: the stored record (a device, or a condition
/// row for condition writes) and the device version.
#[derive(Debug, Clone)]
pub struct Applied {
    pub record_json: Vec<u8>,
    pub version: i64,
}

impl Applied {
    pub fn record(&self) -> Result<serde_json::Value, HubCallError> {
        if self.record_json.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_slice(&self.record_json).map_err(|e| HubCallError::BadReply(e.to_string()))
    }
}

#[derive(Clone)]
pub struct HubClient {
    pub nats: async_nats::Client,
    pub subjects: Subjects,
    /// How long one command waits for the hub.
    pub timeout: Duration,
}

impl HubClient {
    pub fn new(nats: async_nats::Client, subjects: Subjects, timeout: Duration) -> Self {
        HubClient {
            nats,
            subjects,
            timeout,
        }
    }

    /// Sends one command as `actor`, checked against `expected_version`.
    pub async fn call(
        &self,
        actor: &str,
        expected_version: i64,
        command: C,
    ) -> Result<Applied, HubCallError> {
        let reply = self.request(actor, expected_version, command).await?;
        if let Some(e) = reply.error {
            return Err(HubCallError::Refused {
                code: fleet_proto::error_code_of(e.code),
                message: e.message,
            });
        }
        Ok(Applied {
            record_json: reply.record_json,
            version: reply.version,
        })
    }

    /// [`HubClient::call`] answering the hub's reply as it came, its typed
    /// error included (for callers that check the record against what
    /// they sent, as the latch helper does).
    pub async fn request(
        &self,
        actor: &str,
        expected_version: i64,
        command: C,
    ) -> Result<v1::HubReply, HubCallError> {
        let verb = verb(&command);
        let c = v1::HubCommand {
            actor: actor.to_string(),
            expected_version,
            command: Some(command),
        };
        let request = self
            .nats
            .request(self.subjects.hub_cmd(verb), c.encode_to_vec().into());
        let msg = match tokio::time::timeout(self.timeout, request).await {
            Err(_) => return Err(HubCallError::Timeout(self.timeout.as_millis())),
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                return Err(HubCallError::NotRunning)
            }
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::TimedOut => {
                return Err(HubCallError::Timeout(self.timeout.as_millis()))
            }
            Ok(Err(e)) => return Err(HubCallError::Transport(e.to_string())),
            Ok(Ok(m)) => m,
        };
        v1::HubReply::decode(msg.payload.as_ref())
            .map_err(|e| HubCallError::BadReply(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_whether_anything_may_have_been_applied() {
        assert_eq!(HubCallError::NotRunning.code(), ErrorCode::Unavailable);
        assert!(HubCallError::NotRunning
            .to_string()
            .contains("nothing was applied"));
        assert!(HubCallError::Timeout(5000)
            .to_string()
            .contains("may or may not"));
        let r = HubCallError::Refused {
            code: ErrorCode::Conflict,
            message: "device changed".into(),
        };
        assert_eq!(r.code(), ErrorCode::Conflict);
        assert_eq!(r.to_string(), "CONFLICT: device changed");
    }
}
