//! The caller's side of the one request/reply layer: every client crate
//! (`fleet-hub-client`, `fleet-placer-client`, `fleet-workflow-client`)
//! sends through [`request`] (most through a [`Caller`]), so "no answer in time", "nobody is
//! subscribed" and "the reply does not decode" mean the same everywhere.

use std::time::Duration;

use fleet_proto::Message;

use crate::Subjects;

/// Why a request has no reply to read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No answer within the timeout: it may or may not have been applied.
    #[error("no answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// Nobody is subscribed: nothing was sent, nothing applied.
    #[error("no responder is running")]
    NotRunning,
    /// NATS itself failed the request.
    #[error("request: {0}")]
    Transport(String),
    /// The answer is not the reply message it should be.
    #[error("undecodable reply: {0}")]
    BadReply(String),
}

impl RequestError {
    /// What a client says of the failure, naming `service`: `None` when
    /// nobody is subscribed (nothing was sent), else why the service is
    /// unavailable (a timeout may or may not have been applied).
    pub fn unavailable(&self, service: &str) -> Option<String> {
        match self {
            RequestError::NotRunning => None,
            RequestError::Timeout(_) => Some(format!(
                "the {service} did not answer in time; the request may or may not have been applied"
            )),
            RequestError::Transport(m) => Some(format!("{service} request: {m}")),
            RequestError::BadReply(m) => Some(format!("undecodable {service} reply: {m}")),
        }
    }
}

/// Sends `payload` to `subject` and decodes the reply as `M`.
pub async fn request<M: Message + Default>(
    nats: &async_nats::Client,
    subject: String,
    payload: Vec<u8>,
    timeout: Duration,
) -> Result<M, RequestError> {
    let sent = nats.request(subject, payload.into());
    let msg = match tokio::time::timeout(timeout, sent).await {
        Err(_) => return Err(RequestError::Timeout(timeout)),
        Ok(Err(e)) => {
            return Err(match e.kind() {
                async_nats::RequestErrorKind::NoResponders => RequestError::NotRunning,
                async_nats::RequestErrorKind::TimedOut => RequestError::Timeout(timeout),
                _ => RequestError::Transport(e.to_string()),
            })
        }
        Ok(Ok(m)) => m,
    };
    M::decode(msg.payload.as_ref()).map_err(|e| RequestError::BadReply(e.to_string()))
}

/// A client crate's own error, as a failed request becomes one.
pub trait ClientError {
    /// Nobody was subscribed: nothing was sent, nothing applied.
    fn not_running() -> Self;
    /// Why the service is unavailable ([`RequestError::unavailable`]).
    fn unavailable(why: String) -> Self;
}

/// One service's caller: NATS, the subjects, and how long a request
/// waits for its reply.
#[derive(Clone)]
pub struct Caller {
    nats: async_nats::Client,
    subjects: Subjects,
    timeout: Duration,
}

impl Caller {
    pub fn new(nats: async_nats::Client, subjects: Subjects, timeout: Duration) -> Self {
        Caller {
            nats,
            subjects,
            timeout,
        }
    }

    pub fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// [`request`] with this caller's timeout; a failure is the client's
    /// error `E`, naming `service`.
    pub async fn call<M: Message + Default, E: ClientError>(
        &self,
        service: &str,
        subject: String,
        payload: Vec<u8>,
    ) -> Result<M, E> {
        request(&self.nats, subject, payload, self.timeout)
            .await
            .map_err(|e| {
                e.unavailable(service)
                    .map_or_else(E::not_running, E::unavailable)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_says_whether_anything_may_have_been_applied() {
        assert_eq!(RequestError::NotRunning.unavailable("placer"), None);
        let t = RequestError::Timeout(Duration::from_secs(5))
            .unavailable("placer")
            .unwrap();
        assert!(
            t.contains("the placer did not answer") && t.contains("may or may not"),
            "{t}"
        );
        assert_eq!(
            RequestError::BadReply("x".into()).unavailable("workflow service"),
            Some("undecodable workflow service reply: x".into())
        );
    }
}
