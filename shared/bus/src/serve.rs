//! The one request/reply responder of the mesh: every service that answers
//! requests (the hub's commands, the placer, radar, the gateway) serves
//! through [`serve`]. It subscribes (in a queue group, or on its own for a
//! broadcast), answers each request under a bounded concurrency and a
//! deadline, counts every answer by route and error code, and keeps the
//! rule that internal error text (a database's, a peer's) never leaves the
//! service: a [`Refusal`]'s `internal` part is logged, only its public
//! message is sent.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fleet_proto::ErrorCode;
use futures::StreamExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tracing::Instrument;

/// A request the service refuses: a code, the message the caller reads,
/// and what only the service's log may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
    pub internal: Option<String>,
}

impl Refusal {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
            internal: None,
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }
    /// A dependency failed: the caller reads `message`, the log gets the
    /// error itself.
    pub fn unavailable(message: impl Into<String>, internal: impl std::fmt::Display) -> Self {
        Refusal {
            code: ErrorCode::Unavailable,
            message: message.into(),
            internal: Some(internal.to_string()),
        }
    }
}

/// A service that answers requests.
pub trait Responder: Send + Sync + 'static {
    /// The service's name in logs and metrics (`hub`, `placer`, ...).
    const SERVICE: &'static str;
    /// Answers one request on `route` (the static name of the
    /// subscription), `subject` the subject it came on.
    fn respond(
        self: Arc<Self>,
        route: &'static str,
        subject: String,
        payload: Bytes,
    ) -> impl Future<Output = Result<Bytes, Refusal>> + Send;
    /// The service's own reply message carrying an error.
    fn refused(&self, route: &'static str, code: ErrorCode, message: &str) -> Bytes;
}

/// One subscription: its name in metrics, its subject, its queue group
/// (`None`: every replica hears it, a broadcast).
#[derive(Debug, Clone)]
pub struct Route {
    pub name: &'static str,
    pub subject: String,
    pub queue: Option<String>,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Requests answered at once; the next waits (NATS buffers it).
    pub concurrency: usize,
    /// How long one answer may take; past it the caller is told it may or
    /// may not have been applied.
    pub deadline: Duration,
}

type Labels = Vec<(String, String)>;

/// Answers by service, route and code (`OK` or an `ErrorCode` name: a
/// closed set), and their latency.
#[derive(Clone)]
pub struct ResponderMetrics {
    answers: Family<Labels, Counter>,
    latency: Family<Labels, Histogram>,
}

impl Default for ResponderMetrics {
    fn default() -> Self {
        ResponderMetrics {
            answers: Family::default(),
            latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_5, 2.0, 16))
            }),
        }
    }
}

impl ResponderMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "responder_answers",
            "Requests answered, by service, route and code",
            self.answers.clone(),
        );
        registry.register(
            "responder_latency_seconds",
            "Time to answer a request, by service and route",
            self.latency.clone(),
        );
    }

    fn record(&self, service: &str, route: &str, code: &str, took: Duration) {
        self.answers
            .get_or_create(&vec![
                ("service".into(), service.into()),
                ("route".into(), route.into()),
                ("code".into(), code.into()),
            ])
            .inc();
        self.latency
            .get_or_create(&vec![
                ("service".into(), service.into()),
                ("route".into(), route.into()),
            ])
            .observe(took.as_secs_f64());
    }

    /// How many answers so far with this code (tests).
    pub fn answered(&self, service: &str, route: &str, code: &str) -> u64 {
        self.answers
            .get_or_create(&vec![
                ("service".into(), service.into()),
                ("route".into(), route.into()),
                ("code".into(), code.into()),
            ])
            .get()
    }
}

/// Serves `route` until `stop` resolves, then stops taking requests and
/// waits (at most one deadline) for the answers in hand.
pub async fn serve<R: Responder>(
    nats: async_nats::Client,
    responder: Arc<R>,
    route: Route,
    limits: Limits,
    metrics: ResponderMetrics,
    stop: impl Future<Output = ()> + Send,
) {
    tokio::pin!(stop);
    let mut sub = loop {
        let subscribed = match &route.queue {
            Some(q) => nats.queue_subscribe(route.subject.clone(), q.clone()).await,
            None => nats.subscribe(route.subject.clone()).await,
        };
        match subscribed {
            Ok(s) => break s,
            Err(e) => {
                tracing::warn!(service = R::SERVICE, subject = %route.subject, error = %e, "cannot subscribe; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = &mut stop => return,
                }
            }
        }
    };
    let permits = limits.concurrency.max(1);
    let limit = Arc::new(tokio::sync::Semaphore::new(permits));
    loop {
        let msg = tokio::select! { m = sub.next() => m, _ = &mut stop => None };
        let Some(msg) = msg else { break };
        let Some(reply_to) = msg.reply.clone() else {
            continue;
        };
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => p,
            _ = &mut stop => break,
        };
        let Ok(permit) = permit else { break };
        let (nats, responder, metrics, name) =
            (nats.clone(), responder.clone(), metrics.clone(), route.name);
        let deadline = limits.deadline;
        tokio::spawn(async move {
            let _permit = permit;
            let started = Instant::now();
            let span = tracing::info_span!("fleet.request", service = R::SERVICE, route = name);
            let answer = tokio::time::timeout(
                deadline,
                responder
                    .clone()
                    .respond(name, msg.subject.to_string(), msg.payload)
                    .instrument(span),
            )
            .await;
            let (reply, code) = match answer {
                Ok(Ok(reply)) => (reply, "OK"),
                Ok(Err(r)) => {
                    if let Some(internal) = &r.internal {
                        tracing::warn!(service = R::SERVICE, route = name, code = r.code.as_str_name(), error = %internal, "request failed");
                    }
                    (
                        responder.refused(name, r.code, &r.message),
                        r.code.as_str_name(),
                    )
                }
                Err(_) => {
                    tracing::warn!(
                        service = R::SERVICE,
                        route = name,
                        deadline_ms = deadline.as_millis() as u64,
                        "request past its deadline"
                    );
                    let message = format!(
                        "the {} did not answer within {} ms; the request may or may not have been applied",
                        R::SERVICE,
                        deadline.as_millis()
                    );
                    let code = ErrorCode::Unavailable;
                    (responder.refused(name, code, &message), code.as_str_name())
                }
            };
            if let Err(e) = nats.publish(reply_to, reply).await {
                tracing::warn!(service = R::SERVICE, route = name, error = %e, "could not send a reply");
            }
            metrics.record(R::SERVICE, name, code, started.elapsed());
        });
    }
    let _ = sub.unsubscribe().await;
    // Drain: the answers in hand finish (each within its deadline).
    let _ = tokio::time::timeout(limits.deadline, limit.acquire_many(permits as u32)).await;
}
