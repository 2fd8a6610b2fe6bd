//! The bus: subject names (built here and nowhere else), stream and consumer
//! set-up, publishing with dedupe and trace headers, and W3C trace context.
//! Works on nats-server 2.9: no subject transforms, no multi-filter
//! consumers, no per-message TTL, no batch publish.

pub mod connect;
pub mod dlq;
pub mod request;
pub mod secret;
pub mod serve;
pub mod streams;
pub mod subjects;

use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use async_nats::HeaderMap;
use bytes::Bytes;

pub use connect::{connect, connect_now, NatsConfig, NatsConfigError, NatsTls};
pub use request::{request, Caller, ClientError, RequestError};
pub use secret::{redact_url, Secret};
pub use serve::{serve, Limits, Refusal, Responder, ResponderMetrics, Route};
pub use streams::{
    await_hub_streams, await_streams, check_observations, ensure_owned, ensure_streams,
    observation_streams, observations_held, pull_consumer, ObservationStream, Owner, StreamNames,
};
pub use subjects::{Queue, Subjects};

pub const HEADER_SCHEMA: &str = "Fleet-Schema";
pub const HEADER_TRACEPARENT: &str = "traceparent";
pub const HEADER_DLQ_REASON: &str = "Fleet-Dlq-Reason";
pub const HEADER_DLQ_ERROR: &str = "Fleet-Dlq-Error";
pub const HEADER_DLQ_SUBJECT: &str = "Fleet-Dlq-Subject";

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS at {url} as user {user}: {source}. Check nats.url and the service's credentials (nats.user, nats.password); locally start NATS with: start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server")]
    Connect {
        /// Redacted.
        url: String,
        user: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error(transparent)]
    Config(NatsConfigError),
    #[error("configuration key {key}: cannot read {path}: {source}")]
    CredentialFile {
        key: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("stream {stream} was made for nats.partitions = {recorded}, but this service has nats.partitions = {configured}: its observations would land on partitions no hub consumes. Set the same nats.partitions everywhere")]
    Partitions {
        stream: String,
        configured: u32,
        recorded: u32,
    },
    #[error("stream {stream} (one stream of every observation, from before the streams per partition) still holds {messages} messages: stop the connectors and the gateway, let the previous hub version drain it, then start this hub, which removes it. Nothing was changed")]
    LegacyObservations { stream: String, messages: u64 },
    #[error("jetstream {what}: {source}")]
    JetStream {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl BusError {
    pub fn js(what: impl Into<String>, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        BusError::JetStream {
            what: what.into(),
            source: Box::new(e),
        }
    }
}

/// The headers every message carries: `Nats-Msg-Id`, `Fleet-Schema`, and
/// `traceparent` when a trace is known.
pub fn headers(schema: &str, traceparent: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(HEADER_SCHEMA, schema);
    if let Some(tp) = traceparent {
        h.insert(HEADER_TRACEPARENT, tp);
    }
    h
}

/// Publishes to a stream with a dedupe id and returns the PubAck future; the
/// caller must await it (a dropped future loses the ack silently).
pub async fn publish(
    js: &jetstream::Context,
    subject: String,
    msg_id: &str,
    headers: HeaderMap,
    payload: Bytes,
) -> Result<PublishAckFuture, BusError> {
    js.send_publish(
        subject,
        PublishMessage::build()
            .payload(payload)
            .headers(headers)
            .message_id(msg_id),
    )
    .await
    .map_err(|e| BusError::js("publish", e))
}

/// Publishes and awaits the PubAck.
pub async fn publish_acked(
    js: &jetstream::Context,
    subject: String,
    msg_id: &str,
    headers: HeaderMap,
    payload: Bytes,
) -> Result<(), BusError> {
    publish(js, subject, msg_id, headers, payload)
        .await?
        .await
        .map_err(|e| BusError::js("publish ack", e))?;
    Ok(())
}

/// `hash(key) mod P`: FNV-1a, stable across processes and versions.
pub fn partition(key: &str, partitions: u32) -> u32 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    (h % partitions.max(1) as u64) as u32
}

/// Publishes an observation to `<root>.obs.<source>.<partition>.<device>`
/// (the partition token that of the source's [`Queue`]) with `Nats-Msg-Id`
/// = source + device key + `observed_at`, and returns the PubAck future
/// (await it).
#[allow(clippy::too_many_arguments)]
pub async fn publish_observation(
    js: &jetstream::Context,
    subjects: &Subjects,
    partitions: u32,
    source: &str,
    key: &fleet_proto::v1::DeviceKey,
    observed_at_nanos: i64,
    schema: &str,
    traceparent: Option<&str>,
    payload: Bytes,
) -> Result<PublishAckFuture, BusError> {
    let p = partition(
        &format!("{}/{}/{}", key.site, key.kind, key.key),
        partitions,
    );
    let subject = subjects.obs(source, p, key);
    let msg_id = format!(
        "{}:{}:{}:{}:{}",
        source, key.site, key.kind, key.key, observed_at_nanos
    );
    publish(js, subject, &msg_id, headers(schema, traceparent), payload).await
}
