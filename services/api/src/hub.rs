//! Mutations are hub commands (`fleet_hub_client`). No answer in time, no
//! responder, or no connection is `UNAVAILABLE`, and the message says
//! whether the command may have been applied: the API never guesses.

use fleet_hub_client::HubCallError;
use fleet_proto::v1;
use serde_json::Value;

use crate::error::{ApiError, Code};

#[derive(Clone)]
pub struct HubClient {
    pub client: fleet_hub_client::HubClient,
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
        let verb = fleet_hub_client::verb(&command);
        let applied = match self.client.call(actor, expected_version, command).await {
            Ok(a) => a,
            Err(HubCallError::Refused { code, message }) => {
                let mut err = ApiError::new(code, message);
                if code == Code::Conflict {
                    err =
                        err.with_details(serde_json::json!({"expected_version": expected_version}));
                }
                return Err(err);
            }
            Err(e) => {
                tracing::warn!(verb, error = %e, "hub command not answered");
                return Err(ApiError::unavailable(match e {
                    HubCallError::Timeout(_) => "the hub did not answer in time; the command may or may not have been applied, re-read the device".to_string(),
                    HubCallError::NotRunning => "no hub is running; the command was not sent and nothing was applied, retry later".to_string(),
                    HubCallError::BadReply(_) => "the hub answered something unreadable".to_string(),
                    _ => "the hub is unavailable; the command was not applied".to_string(),
                }));
            }
        };
        let record = applied.record().map_err(|e| {
            tracing::error!(verb, error = %e, "hub reply carries bad JSON");
            ApiError::unavailable("the hub answered something unreadable")
        })?;
        Ok(Reply {
            record,
            version: applied.version,
        })
    }

    pub fn connected(&self) -> bool {
        self.client.nats.connection_state() == async_nats::connection::State::Connected
    }
}
