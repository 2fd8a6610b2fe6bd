//! Mutations are hub commands over NATS request/reply. No answer in time,
//! no responder, or no connection is `UNAVAILABLE`: the API never guesses.

use std::time::Duration;

use fleet_bus::Subjects;
use fleet_proto::{v1, Message};
use serde_json::Value;

use crate::error::{ApiError, Code};

#[derive(Clone)]
pub struct HubClient {
    pub nats: async_nats::Client,
    pub subjects: Subjects,
    pub timeout: Duration,
}

/// A successful reply: the stored record and the device version.
pub struct Reply {
    pub record: Value,
    pub version: i64,
}

impl HubClient {
    pub async fn command(
        &self,
        actor: &str,
        expected_version: i64,
        command: v1::hub_command::Command,
    ) -> Result<Reply, ApiError> {
        let verb = verb(&command);
        let c = v1::HubCommand {
            actor: actor.to_string(),
            expected_version,
            command: Some(command),
        };
        let subject = self.subjects.hub_cmd(verb);
        let request = self.nats.request(subject, c.encode_to_vec().into());
        let msg = match tokio::time::timeout(self.timeout, request).await {
            Err(_) => {
                tracing::warn!(verb, "hub did not answer in time");
                return Err(ApiError::unavailable(
                    "the hub did not answer in time; the command may or may not have been applied, re-read the device",
                ));
            }
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                tracing::warn!(verb, "no hub is running");
                return Err(ApiError::unavailable(
                    "no hub is running; the command was not sent and nothing was applied, retry later",
                ));
            }
            Ok(Err(e)) => {
                tracing::warn!(verb, error = %e, "hub request failed");
                return Err(ApiError::unavailable(
                    "the hub is unavailable; the command was not applied",
                ));
            }
            Ok(Ok(m)) => m,
        };
        let reply = v1::HubReply::decode(msg.payload.as_ref()).map_err(|e| {
            tracing::error!(verb, error = %e, "undecodable hub reply");
            ApiError::unavailable("the hub answered something unreadable")
        })?;
        if let Some(e) = reply.error {
            let code = Code::parse(&e.code).unwrap_or(Code::Unavailable);
            // The hub's store failures carry database text: never pass it on.
            let message = if code == Code::Unavailable {
                tracing::warn!(verb, error = %e.message, "hub could not apply the command");
                "the hub could not complete the command; retry later".to_string()
            } else {
                e.message
            };
            let mut err = ApiError::new(code, message);
            if code == Code::Conflict {
                err = err.with_details(serde_json::json!({"expected_version": expected_version}));
            }
            return Err(err);
        }
        let record = if reply.record_json.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&reply.record_json).map_err(|e| {
                tracing::error!(verb, error = %e, "hub reply carries bad JSON");
                ApiError::unavailable("the hub answered something unreadable")
            })?
        };
        Ok(Reply {
            record,
            version: reply.version,
        })
    }

    pub fn connected(&self) -> bool {
        self.nats.connection_state() == async_nats::connection::State::Connected
    }
}

/// The hub's verb for a command (`<root>.hub.cmd.<verb>`).
pub fn verb(c: &v1::hub_command::Command) -> &'static str {
    use v1::hub_command::Command as C;
    match c {
        C::CreateDevice(_) => "create_device",
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
        C::SetMaintenance(_) => "set_maintenance",
        C::Join(_) => "join",
        C::ApplySnapshot(_) => "apply_snapshot",
        C::CreateDevices(_) => "create_devices",
    }
}
