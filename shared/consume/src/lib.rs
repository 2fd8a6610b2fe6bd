//! A durable consumer of `STATUS` for the services that read status
//! (`spec/consumers.md`): bind (re-created in a retry loop, since a pull
//! consumer can vanish across a reconnect), fetch batches, decode
//! `StatusChanged`, hand each batch to the service, and ack only after the
//! service says its effect is done. An undecodable message is copied to
//! `DLQ` (`<root>.dlq.status.<reason>`) and terminated, never retried.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use fleet_bus::{StreamNames, Subjects};
use fleet_proto::{v1, Message};
use fleet_runtime::Shutdown;
use futures::StreamExt;
use tracing::Instrument;

/// One decoded `StatusChanged` and the message it came in.
pub struct StatusEvent {
    pub msg: jetstream::Message,
    pub event: v1::StatusChanged,
}

impl StatusEvent {
    /// The `traceparent` the hub published the event with.
    pub fn traceparent(&self) -> Option<&str> {
        self.msg
            .headers
            .as_ref()
            .and_then(|h| h.get(fleet_bus::HEADER_TRACEPARENT))
            .map(|v| v.as_str())
    }
}

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct StatusConsumer {
    pub stream: String,
    pub durable: String,
    /// One filter subject (nats-server 2.9 has no multi-filter consumers).
    pub filter: String,
    pub ack_wait: Duration,
    pub batch: usize,
    pub fetch_wait: Duration,
}

impl StatusConsumer {
    /// `service`'s durable consumer (`<service>-<axis>`) of the `STATUS`
    /// events of `axis`: up to `batch` at a fetch, each redelivered when
    /// not acked within `ack_wait`.
    pub fn axis(
        streams: &StreamNames,
        subjects: &Subjects,
        service: &str,
        axis: &str,
        ack_wait: Duration,
        batch: usize,
    ) -> Self {
        StatusConsumer {
            stream: streams.status(),
            durable: format!("{service}-{axis}"),
            filter: subjects.status_axis(axis),
            ack_wait,
            batch,
            fetch_wait: Duration::from_millis(200),
        }
    }

    /// Runs until shutdown. `handle` gets each batch of decoded events; on
    /// `Ok` they are acked, on `Err` they are redelivered after a pause.
    /// The batch in hand is finished even when shutdown arrives meanwhile.
    pub async fn run<F, Fut, E>(
        self,
        js: jetstream::Context,
        subjects: Subjects,
        mut shutdown: Shutdown,
        mut handle: F,
    ) where
        F: FnMut(Vec<StatusEvent>) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let mut backoff = Duration::from_millis(200);
        while !shutdown.is_triggered() {
            let consumer = match fleet_bus::pull_consumer(
                &js,
                &self.stream,
                &self.durable,
                self.filter.clone(),
                self.ack_wait,
            )
            .await
            {
                Ok(c) => {
                    backoff = Duration::from_millis(200);
                    c
                }
                Err(e) => {
                    tracing::warn!(durable = %self.durable, error = %e, "cannot bind consumer; retrying");
                    tokio::select! { _ = tokio::time::sleep(backoff) => {}, _ = shutdown.wait() => return }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            loop {
                if shutdown.is_triggered() {
                    return;
                }
                let batch = consumer
                    .batch()
                    .max_messages(self.batch)
                    .expires(self.fetch_wait)
                    .messages()
                    .await;
                let mut batch = match batch {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(durable = %self.durable, error = %e, "fetch failed; re-binding consumer");
                        tokio::time::sleep(backoff).await;
                        break;
                    }
                };
                let mut events = Vec::new();
                let mut broken = false;
                while let Some(m) = batch.next().await {
                    match m {
                        Ok(msg) => match v1::StatusChanged::decode(msg.payload.as_ref()) {
                            Ok(event) => events.push(StatusEvent { msg, event }),
                            Err(e) => {
                                fleet_bus::dlq::dead_letter(
                                    &js,
                                    &subjects,
                                    "status",
                                    &msg,
                                    "undecodable",
                                    &format!("undecodable StatusChanged: {e}"),
                                )
                                .await;
                            }
                        },
                        Err(e) => {
                            tracing::debug!(durable = %self.durable, error = %e, "batch ended with an error");
                            broken = true;
                            break;
                        }
                    }
                }
                if !events.is_empty() {
                    let msgs: Vec<jetstream::Message> =
                        events.iter().map(|e| e.msg.clone()).collect();
                    // The batch's work joins the trace of its first event:
                    // connector -> hub -> this consumer is one trace.
                    let span = tracing::info_span!("status.consume", durable = %self.durable, events = events.len());
                    if let Some(e) = events.first() {
                        fleet_runtime::telemetry::set_parent_from(&span, e.msg.headers.as_ref());
                    }
                    match handle(events).instrument(span).await {
                        Ok(()) => {
                            for m in &msgs {
                                if let Err(e) = m.ack().await {
                                    tracing::warn!(error = %e, subject = %m.subject, "ack failed after the effect; a redelivery repeats it");
                                }
                            }
                        }
                        Err(e) => {
                            tracing::warn!(durable = %self.durable, error = %e, "handling a status batch failed; it will be redelivered");
                            for m in &msgs {
                                let _ =
                                    m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                            }
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }
                if broken {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}
