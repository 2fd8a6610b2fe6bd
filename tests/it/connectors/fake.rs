//! What the connector tests share: a fake HTTP server on port 0 with
//! switchable faults and a request log, fast poll settings, a reader of the
//! observations a connector publishes, and condition lookups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use fleet_connector::PollConfig;
use fleet_proto::{v1, Message};
use fleet_runtime::shutdown::ShutdownTrigger;
use futures::StreamExt;

use crate::support::TestEnv;

/// A fault the fake answers with, for paths under a prefix.
#[derive(Debug, Clone)]
pub enum Fault {
    Status(u16, &'static str),
    /// Answers after the connector's request timeout.
    Hang,
    /// 200 with a body that is not the JSON the connector expects.
    Malformed,
}

#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub uri: String,
    pub headers: HashMap<String, String>,
}

#[derive(Default)]
pub struct Control {
    faults: Mutex<Vec<(String, Fault)>>,
    seen: Mutex<Vec<Seen>>,
}

impl Control {
    pub fn fail(&self, prefix: &str, fault: Fault) {
        let mut f = self.faults.lock().unwrap();
        f.retain(|(p, _)| p != prefix);
        f.push((prefix.to_string(), fault));
    }

    pub fn heal(&self) {
        self.faults.lock().unwrap().clear();
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Requests whose path starts with `prefix`.
    pub fn count(&self, prefix: &str) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.uri.starts_with(prefix))
            .count()
    }
}

async fn intercept(State(control): State<Arc<Control>>, req: Request, next: Next) -> Response {
    let uri = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                v.to_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    control.seen.lock().unwrap().push(Seen {
        method: req.method().to_string(),
        uri: uri.clone(),
        headers,
    });
    let fault = control
        .faults
        .lock()
        .unwrap()
        .iter()
        .find(|(p, _)| uri.starts_with(p.as_str()))
        .map(|(_, f)| f.clone());
    match fault {
        None => next.run(req).await,
        Some(Fault::Status(code, body)) => (
            StatusCode::from_u16(code).unwrap(),
            [("content-type", "application/json")],
            body,
        )
            .into_response(),
        Some(Fault::Hang) => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            next.run(req).await
        }
        Some(Fault::Malformed) => Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from(r#"{"nodes": [{"name": "gpu01", "state": "#))
            .unwrap(),
    }
}

/// Serves `router` on 127.0.0.1 port 0; returns the base URL.
pub async fn serve(router: Router, control: Arc<Control>) -> String {
    let app = router.layer(axum::middleware::from_fn_with_state(control, intercept));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

pub fn header(h: &HeaderMap, name: &str) -> String {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

pub fn json(status: StatusCode, body: serde_json::Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// Polls every 200 ms; one retry; a 400 ms request timeout.
pub fn fast_poll() -> PollConfig {
    PollConfig {
        resync_interval: Duration::from_millis(200),
        jitter: 0.0,
        request_timeout: Duration::from_millis(400),
        connect_timeout: Duration::from_millis(400),
        max_retries: 1,
        backoff_initial: Duration::from_millis(10),
        backoff_max: Duration::from_millis(20),
        max_pages: 50,
        publish_in_flight: 64,
        resync_spread: 0.0,
    }
}

/// A running connector.
pub struct Running {
    pub trigger: ShutdownTrigger,
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    pub fn start<F>(f: F) -> Running
    where
        F: FnOnce(fleet_runtime::Shutdown) -> tokio::task::JoinHandle<anyhow::Result<()>>,
    {
        let (trigger, shutdown) = fleet_runtime::Shutdown::new();
        Running {
            trigger,
            task: f(shutdown),
        }
    }

    pub fn assert_alive(&self) {
        assert!(
            !self.task.is_finished(),
            "the connector stopped on bad input"
        );
    }

    /// Triggers shutdown; the connector must stop cleanly and soon.
    pub async fn stop(self) {
        self.trigger.trigger();
        let r = tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the connector stops within 10 s of shutdown")
            .expect("the connector task does not panic");
        r.expect("the connector returns Ok after shutdown");
    }
}

/// Reads the observations a connector publishes, straight from the
/// `OBSERVATIONS` stream (only for tests that run no hub: the stream is a
/// work queue).
pub struct ObsReader {
    consumer:
        async_nats::jetstream::consumer::Consumer<async_nats::jetstream::consumer::pull::Config>,
}

impl ObsReader {
    pub async fn new(env: &TestEnv, source: &str) -> ObsReader {
        let stream = env.js.get_stream(env.streams.observations()).await.unwrap();
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::Config {
                durable_name: Some(format!("test-{source}")),
                filter_subject: env.subjects.obs_source(source),
                ..Default::default()
            })
            .await
            .unwrap();
        ObsReader { consumer }
    }

    /// Every snapshot available now (waits up to 300 ms for the first).
    pub async fn drain(&self) -> Vec<v1::ConditionSnapshot> {
        let mut out = vec![];
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_millis(300))
            .messages()
            .await
            .unwrap();
        while let Some(Ok(m)) = batch.next().await {
            out.push(v1::ConditionSnapshot::decode(m.payload.as_ref()).unwrap());
            m.ack().await.unwrap();
        }
        out
    }

    /// Waits until a snapshot matches `pred`; returns it.
    pub async fn until(
        &self,
        what: &str,
        pred: impl Fn(&v1::ConditionSnapshot) -> bool,
    ) -> v1::ConditionSnapshot {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.drain().await.into_iter().find(|s| pred(s)) {
                return s;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
        }
    }
}

pub fn key_of(s: &v1::ConditionSnapshot) -> &str {
    s.device
        .as_ref()
        .map(|k| k.key.as_str())
        .unwrap_or_default()
}

pub fn snap_cond<'a>(s: &'a v1::ConditionSnapshot, t: &str) -> Option<&'a v1::Condition> {
    s.conditions.iter().find(|c| c.r#type == t)
}

/// `(status, reason, message)` of a stored condition row.
pub async fn condition_row(
    env: &TestEnv,
    device_id: &str,
    t: &str,
) -> Option<(String, String, String)> {
    sqlx::query_as(
        "SELECT status, reason, message FROM device_conditions WHERE device_id = $1 AND type = $2",
    )
    .bind(device_id)
    .bind(t)
    .fetch_optional(&env.pool)
    .await
    .unwrap()
}

/// A port free right now, for an ops listener a test scrapes.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `/metrics` of a connector's ops server.
pub async fn metrics(port: u16) -> String {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    body
}
