//! The hub's client: every caller of hub commands (the API, the gateway,
//! connector-netbox's import, the latch helper) sends them through
//! [`HubClient`] over core NATS request/reply (`<root>.hub.cmd.<verb>`),
//! and reads one typed outcome: the stored record, a typed refusal, or why
//! there is no answer (no hub running: nothing was sent; no answer in
//! time: it may or may not have been applied).

use std::time::Duration;

use fleet_bus::{RequestError, Subjects};
use fleet_proto::{v1, ErrorCode, Message};
use v1::hub_command::Command as C;
pub use v1::hub_reply::Record;

pub mod batch;
pub use batch::Batcher;

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
        C::PromoteToManaged(_) => "promote_to_managed",
        C::DeleteDevice(_) => "delete_device",
        C::WriteCondition(_) => "write_condition",
        C::EnrollmentProof(_) => "enrollment_proof",
        C::ImpairmentHold(_) => "impairment_hold",
        C::ImpairmentHolds(_) => "impairment_holds",
        C::Join(_) => "join",
        C::JoinDevices(_) => "join_devices",
        C::SetMaintenance(_) => "set_maintenance",
        C::ApplySnapshot(_) => "apply_snapshot",
        C::CreateSite(_) => "create_site",
        C::UpdateSite(_) => "update_site",
        C::CreateTenant(_) => "create_tenant",
        C::UpdateTenant(_) => "update_tenant",
        C::CreatePool(_) => "create_pool",
        C::UpdatePool(_) => "update_pool",
        C::DeleteInventory(_) => "delete_inventory",
        C::Delegate(_) => "delegate",
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

    /// The hub's refusal of one item of a batched command (a hold, a join).
    pub fn refused(e: v1::HubError) -> HubCallError {
        HubCallError::Refused {
            code: fleet_proto::error_code_of(e.code),
            message: e.message,
        }
    }
}

/// A command the hub applied: what it left (typed per command, see
/// `fleet.v1.HubReply`) and the device version.
#[derive(Debug, Clone)]
pub struct Applied {
    pub record: Option<Record>,
    pub version: i64,
}

impl Applied {
    fn unexpected(&self, want: &str) -> HubCallError {
        HubCallError::BadReply(format!(
            "expected {want}, the hub answered {}",
            match &self.record {
                None => "no record",
                Some(Record::Device(_)) => "a device",
                Some(Record::Devices(_)) => "devices",
                Some(Record::Condition(_)) => "a condition row",
                Some(Record::Created(_)) => "create results",
                Some(Record::Snapshot(_)) => "a snapshot outcome",
                Some(Record::Joined(_)) => "a join",
                Some(Record::Holds(_)) => "hold results",
                Some(Record::Site(_)) => "a site",
                Some(Record::Tenant(_)) => "a tenant",
                Some(Record::Pool(_)) => "a pool",
                Some(Record::Joins(_)) => "join results",
            }
        ))
    }

    /// The device a device command left.
    pub fn device(self) -> Result<v1::DeviceChange, HubCallError> {
        match self.record {
            Some(Record::Device(d)) => Ok(d),
            _ => Err(self.unexpected("a device")),
        }
    }

    /// The devices a list command (triage) left.
    pub fn devices(self) -> Result<Vec<v1::DeviceChange>, HubCallError> {
        match self.record {
            Some(Record::Devices(d)) => Ok(d.devices),
            _ => Err(self.unexpected("devices")),
        }
    }

    /// The row a condition write left (different from what was sent when
    /// the write was stale-rejected).
    pub fn condition(self) -> Result<v1::ConditionRow, HubCallError> {
        match self.record {
            Some(Record::Condition(c)) => Ok(c),
            _ => Err(self.unexpected("a condition row")),
        }
    }

    /// What `apply_snapshot` did.
    pub fn snapshot(self) -> Result<v1::SnapshotApplied, HubCallError> {
        match self.record {
            Some(Record::Snapshot(s)) => Ok(s),
            _ => Err(self.unexpected("a snapshot outcome")),
        }
    }

    /// One result per device of `impairment_holds`, in request order.
    pub fn holds(self) -> Result<Vec<v1::HoldResult>, HubCallError> {
        match self.record {
            Some(Record::Holds(h)) => Ok(h.results),
            _ => Err(self.unexpected("hold results")),
        }
    }

    /// The site an inventory command left.
    pub fn site(self) -> Result<v1::Site, HubCallError> {
        match self.record {
            Some(Record::Site(x)) => Ok(x),
            _ => Err(self.unexpected("a site")),
        }
    }

    /// The tenant an inventory command left.
    pub fn tenant(self) -> Result<v1::Tenant, HubCallError> {
        match self.record {
            Some(Record::Tenant(x)) => Ok(x),
            _ => Err(self.unexpected("a tenant")),
        }
    }

    /// The pool an inventory command left.
    pub fn pool(self) -> Result<v1::Pool, HubCallError> {
        match self.record {
            Some(Record::Pool(x)) => Ok(x),
            _ => Err(self.unexpected("a pool")),
        }
    }

    /// One result per join of `join_devices`, in request order.
    pub fn joins(self) -> Result<Vec<v1::JoinResult>, HubCallError> {
        match self.record {
            Some(Record::Joins(j)) => Ok(j.results),
            _ => Err(self.unexpected("join results")),
        }
    }

    /// The device a join created or re-joined.
    pub fn joined(self) -> Result<v1::Joined, HubCallError> {
        match self.record {
            Some(Record::Joined(j)) => Ok(j),
            _ => Err(self.unexpected("a join")),
        }
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
            return Err(HubCallError::refused(e));
        }
        Ok(Applied {
            record: reply.record,
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
        fleet_bus::request(
            &self.nats,
            self.subjects.hub_cmd(verb),
            c.encode_to_vec(),
            self.timeout,
        )
        .await
        .map_err(|e| match e {
            RequestError::Timeout(t) => HubCallError::Timeout(t.as_millis()),
            RequestError::NotRunning => HubCallError::NotRunning,
            RequestError::Transport(m) => HubCallError::Transport(m),
            RequestError::BadReply(m) => HubCallError::BadReply(m),
        })
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
