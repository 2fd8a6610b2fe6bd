//! What the connector tests share: a fake HTTP server (wiremock) with
//! switchable faults and a request log, fast poll settings, a running
//! connector, a reader of the observations a connector publishes, and
//! condition lookups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_connector::PollConfig;
use fleet_proto::{v1, Message};
use fleet_runtime::shutdown::ShutdownTrigger;
use futures::StreamExt;
use serde_json::Value;
use wiremock::matchers::{method, path_regex};
use wiremock::{Match, Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::TestEnv;

/// A fault the fake answers with, for paths under a prefix.
#[derive(Debug, Clone)]
pub enum Fault {
    Status(u16, &'static str),
    /// Answers after the connector's request timeout.
    Hang,
    /// 200 with a body that is not the JSON the connector expects.
    Malformed,
}

impl Fault {
    /// What the message of the outage this fault causes says of it, under
    /// [`fast_poll`]'s request timeout.
    pub fn outage_fragment(&self) -> String {
        match self {
            Fault::Status(code, _) => format!("HTTP {code}"),
            Fault::Hang => "did not answer within 400 ms".into(),
            Fault::Malformed => "malformed body".into(),
        }
    }

    fn response(&self) -> ResponseTemplate {
        match self {
            Fault::Status(code, body) => {
                ResponseTemplate::new(*code).set_body_raw(*body, "application/json")
            }
            Fault::Hang => ResponseTemplate::new(200).set_delay(Duration::from_secs(5)),
            Fault::Malformed => ResponseTemplate::new(200).set_body_raw(
                r#"{"nodes": [{"name": "gpu01", "state": "#,
                "application/json",
            ),
        }
    }
}

/// A request as the fake received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// Lowercase names.
    pub headers: HashMap<String, String>,
}

impl From<&Request> for Seen {
    fn from(r: &Request) -> Seen {
        let uri = match r.url.query() {
            Some(q) => format!("{}?{q}", r.url.path()),
            None => r.url.path().to_string(),
        };
        let headers = r
            .headers
            .iter()
            .map(|(k, v)| {
                let v = v.to_str().unwrap_or_default().to_string();
                (k.as_str().to_ascii_lowercase(), v)
            })
            .collect();
        Seen {
            method: r.method.to_string(),
            uri,
            headers,
        }
    }
}

/// The faults switched on, by path prefix.
#[derive(Default)]
struct Faults(Mutex<Vec<(String, Fault)>>);

impl Faults {
    fn of(&self, request: &Request) -> Option<Fault> {
        let path = request.url.path();
        let faults = self.0.lock().unwrap();
        let found = faults.iter().find(|(p, _)| path.starts_with(p.as_str()));
        found.map(|(_, f)| f.clone())
    }
}

/// The highest-priority mock of every fake, mounted first: it matches a
/// request under a failing prefix and answers with the fault. (One
/// standing mock rather than a scoped mock per fault: wiremock 0.6 sorts
/// its mocks by priority in place, after which dropping a scoped mock's
/// guard can take another mock out of scope.)
struct FaultLayer(Arc<Faults>);

impl Match for FaultLayer {
    fn matches(&self, request: &Request) -> bool {
        self.0.of(request).is_some()
    }
}

impl Respond for FaultLayer {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        // Healed between the match and now: one more failed request.
        let fault = self.0.of(request).unwrap_or(Fault::Status(503, "{}"));
        fault.response()
    }
}

/// A fake of an external system on 127.0.0.1 port 0: the routes a test
/// mounts speak the system's JSON; a fault switched on over a path prefix
/// answers instead (a higher-priority mock) until healed; every request is
/// recorded.
pub struct FakeHttp {
    server: MockServer,
    faults: Arc<Faults>,
}

impl FakeHttp {
    pub async fn start() -> FakeHttp {
        let server = MockServer::start().await;
        let faults = Arc::new(Faults::default());
        Mock::given(FaultLayer(faults.clone()))
            .respond_with(FaultLayer(faults.clone()))
            .with_priority(1)
            .named("faults")
            .mount(&server)
            .await;
        FakeHttp { server, faults }
    }

    /// The base URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        self.server.uri()
    }

    /// Answers `verb` requests whose path matches `path` (a regex).
    pub async fn route(&self, verb: &str, path: &str, respond: impl Respond + 'static) {
        Mock::given(method(verb))
            .and(path_regex(path))
            .respond_with(respond)
            .mount(&self.server)
            .await;
    }

    /// Every request under `prefix` answers with `fault` (replacing a
    /// fault on the same prefix) until [`FakeHttp::heal`].
    pub fn fail(&self, prefix: &str, fault: Fault) {
        let mut f = self.faults.0.lock().unwrap();
        f.retain(|(p, _)| p != prefix);
        f.push((prefix.to_string(), fault));
    }

    /// Switches every fault off.
    pub fn heal(&self) {
        self.faults.0.lock().unwrap().clear();
    }

    /// Every request so far, in order.
    pub async fn seen(&self) -> Vec<Seen> {
        self.server
            .received_requests()
            .await
            .expect("the fake records requests")
            .iter()
            .map(Seen::from)
            .collect()
    }

    /// Requests whose path starts with `prefix`.
    pub async fn count(&self, prefix: &str) -> usize {
        self.seen()
            .await
            .iter()
            .filter(|s| s.uri.starts_with(prefix))
            .count()
    }
}

/// A responder that hands each request to `f` with the fake's state.
pub fn with<T: Send + Sync + 'static>(
    state: &Arc<T>,
    f: fn(&T, &Request) -> ResponseTemplate,
) -> impl Respond + 'static {
    let state = state.clone();
    move |r: &Request| f(&state, r)
}

/// A JSON answer.
pub fn json(status: u16, body: Value) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(body)
}

/// A header of the request, empty when absent.
pub fn header(r: &Request, name: &str) -> String {
    r.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// The request's query parameters, decoded, in order.
pub fn query(r: &Request) -> Vec<(String, String)> {
    r.url.query_pairs().into_owned().collect()
}

/// One query parameter (the first of the name).
pub fn param(r: &Request, name: &str) -> Option<String> {
    r.url
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// A query parameter that must be a number when present: `Err` is the
/// 400 a typed query would answer.
pub fn number_param(r: &Request, name: &str) -> Result<Option<usize>, ResponseTemplate> {
    match param(r, name) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            ResponseTemplate::new(400).set_body_string(format!("{name} is not a number"))
        }),
    }
}

/// The JSON body of a request that declares it: `Err` is the 415 or 400 a
/// JSON handler answers otherwise.
pub fn json_body(r: &Request) -> Result<Value, ResponseTemplate> {
    if !header(r, "content-type").starts_with("application/json") {
        return Err(ResponseTemplate::new(415).set_body_string("expected application/json"));
    }
    r.body_json()
        .map_err(|e| ResponseTemplate::new(400).set_body_string(format!("malformed JSON: {e}")))
}

/// Base64 (RFC 4648, padded), for expected basic-auth headers.
pub fn base64(input: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
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
        ..Default::default()
    }
}

/// A running connector.
pub struct Running {
    pub trigger: ShutdownTrigger,
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Runs a connector's `run(common, config, shutdown)` on the
    /// environment.
    pub fn spawn<C, F>(
        env: &TestEnv,
        config: C,
        run: impl FnOnce(fleet_runtime::Common, C, fleet_runtime::Shutdown) -> F,
    ) -> Running
    where
        F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let (trigger, shutdown) = fleet_runtime::Shutdown::new();
        let task = tokio::spawn(run(env.common.clone(), config, shutdown));
        Running { trigger, task }
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

/// A hub a connector test runs behind its connector.
pub struct HubTask {
    trigger: ShutdownTrigger,
    task: tokio::task::JoinHandle<()>,
}

impl HubTask {
    pub async fn start(env: &TestEnv) -> HubTask {
        let (_hub, trigger, task) = crate::start_hub(env).await;
        HubTask { trigger, task }
    }

    /// The connector (cleanly, soon), then the hub; then the environment
    /// is removed.
    pub async fn stop(self, connector: Running, env: TestEnv) {
        connector.stop().await;
        crate::stop(self.trigger, self.task).await;
        env.cleanup().await;
    }
}

/// Reads the observations a connector publishes, straight from the reads'
/// observation streams, one consumer a partition (only for tests that run
/// no hub: the streams are work queues).
pub struct ObsReader {
    consumers: Vec<
        async_nats::jetstream::consumer::Consumer<async_nats::jetstream::consumer::pull::Config>,
    >,
}

impl ObsReader {
    pub async fn new(env: &TestEnv, source: &str) -> ObsReader {
        let mut consumers = vec![];
        for p in 0..env.common.nats.partitions {
            let queue = fleet_bus::Queue::Reads;
            let stream = env
                .js
                .get_stream(env.streams.observations(queue, p))
                .await
                .unwrap();
            let consumer = stream
                .create_consumer(async_nats::jetstream::consumer::pull::Config {
                    durable_name: Some(format!("test-{source}")),
                    filter_subject: format!(
                        "{}.obs.{source}.{}.>",
                        env.common.nats.subject_root,
                        queue.token(p)
                    ),
                    ..Default::default()
                })
                .await
                .unwrap();
            consumers.push(consumer);
        }
        ObsReader { consumers }
    }

    /// Every snapshot available now (waits up to 300 ms for the first).
    pub async fn drain(&self) -> Vec<v1::ConditionSnapshot> {
        let fetches = self.consumers.iter().map(|c| async move {
            let mut out = vec![];
            let mut batch = c
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
        });
        futures::future::join_all(fetches)
            .await
            .into_iter()
            .flatten()
            .collect()
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

    /// After `settle`, what was published meanwhile is dropped; then
    /// nothing at all may come for `quiet`.
    pub async fn assert_silent(&self, settle: Duration, quiet: Duration, why: &str) {
        tokio::time::sleep(settle).await;
        self.drain().await;
        tokio::time::sleep(quiet).await;
        assert!(self.drain().await.is_empty(), "{why}");
    }
}

/// Outages of a fake system, watched through what the connector publishes.
pub struct Outages<'a> {
    pub http: &'a FakeHttp,
    pub reader: &'a ObsReader,
    pub connector: &'a Running,
}

impl Outages<'_> {
    /// `fault` under `prefix` until a snapshot `outage` matches (returned);
    /// the connector must still run; then healed, until a snapshot
    /// `readable` matches again.
    pub async fn cycle(
        &self,
        prefix: &str,
        fault: Fault,
        outage: impl Fn(&v1::ConditionSnapshot) -> bool,
        readable: impl Fn(&v1::ConditionSnapshot) -> bool,
    ) -> v1::ConditionSnapshot {
        self.http.fail(prefix, fault.clone());
        let s = self
            .reader
            .until(&format!("outage {fault:?}"), outage)
            .await;
        self.connector.assert_alive();
        self.http.heal();
        self.reader.until("readable again", readable).await;
        s
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

/// `(status, reason, message, source)` of a stored condition row.
pub async fn condition_row_with_source(
    env: &TestEnv,
    device_id: &str,
    t: &str,
) -> Option<(String, String, String, String)> {
    sqlx::query_as(
        "SELECT status, reason, message, source FROM device_conditions WHERE device_id = $1 AND type = $2",
    )
    .bind(device_id)
    .bind(t)
    .fetch_optional(&env.pool)
    .await
    .unwrap()
}

/// `(status, reason, message)` of a stored condition row.
pub async fn condition_row(
    env: &TestEnv,
    device_id: &str,
    t: &str,
) -> Option<(String, String, String)> {
    let (status, reason, message, _) = condition_row_with_source(env, device_id, t).await?;
    Some((status, reason, message))
}

/// A port free right now, for an ops listener a test scrapes.
pub fn free_port() -> u16 {
    fleet_runtime::http::free_listen_addr().unwrap().port()
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

/// Asserts every line is in the metrics.
pub fn assert_metrics(m: &str, lines: &[&str]) {
    for line in lines {
        assert!(m.contains(line), "metrics lack {line}:\n{m}");
    }
}
