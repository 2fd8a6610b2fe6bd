//! Ending the sessions of a device whose identity generation moved on
//! (revoke, delete) before the API answers: a broadcast every gateway
//! replica hears (`<root>.gateway.cmd.end_sessions`, no queue group).
//! The API waits for the first answer, then a short while for the other
//! replicas'; with no gateway running there is no session to end.

use std::time::Duration;

use fleet_proto::{v1, Message};
use futures::StreamExt;

use crate::hub::HubClient;

/// After the first replica answered, how long the others get.
const STRAGGLERS: Duration = Duration::from_millis(100);

/// What the replicas said: how many answered, and whether one closed a
/// session.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    pub replicas: usize,
    pub closed: bool,
}

impl HubClient {
    pub async fn end_sessions(&self, device_id: &str) -> Result<Ended, String> {
        let fleet_hub_client::HubClient {
            nats,
            subjects,
            timeout,
        } = &self.client;
        let inbox = nats.new_inbox();
        let mut replies = nats
            .subscribe(inbox.clone())
            .await
            .map_err(|e| e.to_string())?;
        let body = v1::EndSessions {
            device_id: device_id.to_string(),
        };
        nats.publish_with_reply(
            subjects.gateway_cmd("end_sessions"),
            inbox,
            body.encode_to_vec().into(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let mut ended = Ended::default();
        let mut deadline = tokio::time::Instant::now() + *timeout;
        while let Ok(Some(m)) = tokio::time::timeout_at(deadline, replies.next()).await {
            // No gateway subscribed: nothing holds a session.
            if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                return Ok(ended);
            }
            let r = v1::SessionsEnded::decode(m.payload.as_ref())
                .map_err(|e| format!("undecodable SessionsEnded: {e}"))?;
            if let Some(e) = r.error {
                return Err(format!("gateway {}: {}", r.gateway_id, e.message));
            }
            ended.replicas += 1;
            ended.closed |= r.closed;
            deadline = tokio::time::Instant::now() + STRAGGLERS;
        }
        if ended.replicas == 0 {
            return Err("no gateway answered in time".into());
        }
        Ok(ended)
    }
}
