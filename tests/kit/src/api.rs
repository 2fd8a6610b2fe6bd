//! The operator API over real HTTP for tests: an API on port 0 against the
//! environment, tokens, and a minimal HTTP/1.1 client that shows the raw
//! status and body (no client library rewrites what the server sent).

use std::net::SocketAddr;
use std::time::Duration;

pub use fleet_api::Scope;
use fleet_runtime::shutdown::ShutdownTrigger;
use fleet_runtime::{Common, Shutdown};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::TestEnv;

/// The refusals of `api.md`: an HTTP status and the error code.
pub type Refusal = (u16, &'static str);
pub const INVALID_ARGUMENT: Refusal = (400, "INVALID_ARGUMENT");
pub const UNAUTHENTICATED: Refusal = (401, "UNAUTHENTICATED");
pub const FORBIDDEN: Refusal = (403, "FORBIDDEN");
pub const NOT_FOUND: Refusal = (404, "NOT_FOUND");
pub const CONFLICT: Refusal = (409, "CONFLICT");
pub const INVALID_STATE: Refusal = (409, "INVALID_STATE");
pub const UNAVAILABLE: Refusal = (503, "UNAVAILABLE");
pub const INSUFFICIENT_CAPACITY: Refusal = (409, "INSUFFICIENT_CAPACITY");
pub const FUTURE_OBSERVATION: Refusal = (400, "FUTURE_OBSERVATION");
pub const FORBIDDEN_SOURCE: Refusal = (403, "FORBIDDEN_SOURCE");

pub struct Resp {
    pub status: u16,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }

    /// The error code of an error response.
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("not an error body: {}", self.body))
            .to_string()
    }

    /// Asserts an error answer: this status and this code (`what` says
    /// which request, in the failure message).
    pub fn assert_error(&self, (status, code): Refusal, what: impl std::fmt::Display) {
        assert_eq!(
            (self.status, self.code().as_str()),
            (status, code),
            "{what}: {}",
            self.body
        );
    }

    /// Asserts `status` and returns the JSON body.
    pub fn expect(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}", self.body);
        self.json()
    }
}

/// A minimal HTTP/1.1 client (one request per connection).
pub async fn http_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> Resp {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if let Some(ct) = content_type {
        head.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut buf))
        .await
        .expect("response in time")
        .unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Resp { status, body }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

pub async fn get(addr: SocketAddr, path: &str, token: &str) -> Resp {
    http_raw(addr, "GET", path, Some(token), None, b"").await
}

/// A request with a JSON body.
pub async fn send(addr: SocketAddr, method: &str, path: &str, token: &str, body: Value) -> Resp {
    http_raw(
        addr,
        method,
        path,
        Some(token),
        Some("application/json"),
        body.to_string().as_bytes(),
    )
    .await
}

/// A POST with a JSON body.
pub async fn post(addr: SocketAddr, path: &str, token: &str, body: Value) -> Resp {
    send(addr, "POST", path, token, body).await
}

/// Runs an API on 127.0.0.1 port 0 until the trigger fires.
pub async fn start_api(
    common: &Common,
    config: &fleet_api::Config,
) -> (SocketAddr, ShutdownTrigger) {
    let app = fleet_api::App::connect(common, config)
        .await
        .expect("api connects");
    let (trigger, shutdown) = Shutdown::new();
    let addr = fleet_api::serve(app, "127.0.0.1:0", shutdown)
        .await
        .expect("api binds");
    (addr, trigger)
}

/// A token with `scopes`, stored in the environment's database.
pub async fn token(env: &TestEnv, scopes: &[Scope]) -> String {
    fleet_api::create_token(&env.pool, scopes, "test")
        .await
        .unwrap()
        .1
}

/// Quick to answer 503 when the hub or PostgreSQL is away.
pub fn api_config() -> fleet_api::Config {
    fleet_api::Config {
        hub_timeout: Duration::from_secs(2),
        db_timeout: Duration::from_secs(1),
        ..Default::default()
    }
}
