//! The bus: subject names (built here and nowhere else), stream and consumer
//! set-up, publishing with dedupe and trace headers, and W3C trace context.
//! Works on nats-server 2.9: no subject transforms, no multi-filter
//! consumers, no per-message TTL, no batch publish.

pub mod streams;
pub mod subjects;
pub mod trace;

use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use async_nats::HeaderMap;
use bytes::Bytes;

pub use streams::{ensure_streams, pull_consumer, StreamNames};
pub use subjects::Subjects;

pub const HEADER_SCHEMA: &str = "Fleet-Schema";
pub const HEADER_TRACEPARENT: &str = "traceparent";
pub const HEADER_DLQ_REASON: &str = "Fleet-Dlq-Reason";
pub const HEADER_DLQ_ERROR: &str = "Fleet-Dlq-Error";
pub const HEADER_DLQ_SUBJECT: &str = "Fleet-Dlq-Subject";

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS at {url}: {source}. Start it with: start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server")]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
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

/// Connects with an endless reconnect policy and a client name.
pub async fn connect(url: &str, name: &str) -> Result<async_nats::Client, BusError> {
    async_nats::ConnectOptions::new()
        .name(name)
        .retry_on_initial_connect()
        .connection_timeout(std::time::Duration::from_secs(3))
        .connect(url)
        .await
        .map_err(|source| BusError::Connect {
            url: url.to_string(),
            source,
        })
}

/// Connects and fails fast when nothing answers (for start-up checks).
pub async fn connect_now(url: &str, name: &str) -> Result<async_nats::Client, BusError> {
    async_nats::ConnectOptions::new()
        .name(name)
        .connection_timeout(std::time::Duration::from_secs(3))
        .connect(url)
        .await
        .map_err(|source| BusError::Connect {
            url: url.to_string(),
            source,
        })
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
/// with `Nats-Msg-Id` = source + device key + `observed_at`, and returns
/// the PubAck future (await it).
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
