//! The HTTP client every connector uses: a per-request timeout, retries with
//! exponential back-off for what may pass (connection errors, timeouts, 408,
//! 429, 5xx), and typed errors that name the URL and never a credential.

use std::time::Duration;

use crate::config::PollConfig;
use reqwest::{Client, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;

use crate::backoff::{self, Backoff};
use crate::error::{body_excerpt, SourceError};
use crate::metrics::ConnectorMetrics;

/// rustls is built without a default crypto provider (async-nats already
/// links ring); install ring for the process once.
fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[derive(Clone)]
pub struct HttpClient {
    client: Client,
    timeout_ms: u64,
    max_retries: u32,
    backoff: Backoff,
    metrics: ConnectorMetrics,
    source: &'static str,
}

impl HttpClient {
    pub fn new(
        poll: &PollConfig,
        metrics: ConnectorMetrics,
        source: &'static str,
    ) -> Result<Self, SourceError> {
        install_crypto_provider();
        let client = Client::builder()
            .timeout(poll.request_timeout.max(Duration::from_millis(1)))
            .connect_timeout(poll.connect_timeout.max(Duration::from_millis(1)))
            .user_agent(concat!("fleet-connector/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| SourceError::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(HttpClient {
            client,
            timeout_ms: poll.request_timeout.as_millis() as u64,
            max_retries: poll.max_retries,
            backoff: Backoff {
                initial: poll.backoff_initial,
                max: poll.backoff_max.max(poll.backoff_initial),
            },
            metrics,
            source,
        })
    }

    /// A client with the default poll settings and metrics of its own
    /// (configuration checks and tests).
    pub fn with_defaults(source: &'static str) -> Result<Self, SourceError> {
        Self::new(&PollConfig::default(), ConnectorMetrics::new(), source)
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Sends the request `build` makes (once per attempt) and returns a
    /// response with a 2xx status. 401 and 403 are `Auth` errors and are not
    /// retried here: the caller may refresh its token and call again.
    pub async fn send<F>(&self, url: &str, build: F) -> Result<Response, SourceError>
    where
        F: Fn(&Client) -> RequestBuilder,
    {
        self.send_with(url, build, self.max_retries).await
    }

    /// Sends the request once, never again: an action whose repeat is not
    /// the same request (a provision verb, a server create). A timeout or
    /// a 5xx leaves its outcome unknown; the caller reads the system back
    /// before it decides to ask again.
    pub async fn send_once<F>(&self, url: &str, build: F) -> Result<Response, SourceError>
    where
        F: Fn(&Client) -> RequestBuilder,
    {
        self.send_with(url, build, 0).await
    }

    async fn send_with<F>(
        &self,
        url: &str,
        build: F,
        max_retries: u32,
    ) -> Result<Response, SourceError>
    where
        F: Fn(&Client) -> RequestBuilder,
    {
        let mut attempt = 0;
        loop {
            match self.attempt(url, &build).await {
                Ok(r) => return Ok(r),
                Err(e) if e.is_retryable() && attempt < max_retries => {
                    let wait = self.backoff.delay(attempt, backoff::unit());
                    tracing::warn!(
                        source = self.source,
                        url,
                        attempt = attempt + 1,
                        wait_ms = wait.as_millis() as u64,
                        error = %e,
                        "request failed; retrying"
                    );
                    self.metrics.retry(self.source, e.kind());
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn attempt<F>(&self, url: &str, build: &F) -> Result<Response, SourceError>
    where
        F: Fn(&Client) -> RequestBuilder,
    {
        let resp = build(&self.client)
            .send()
            .await
            .map_err(|e| self.transport(url, &e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.text().await.unwrap_or_default();
        let body = body_excerpt(&body);
        Err(match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => SourceError::Auth {
                url: url.to_string(),
                status: status.as_u16(),
                body,
            },
            _ => SourceError::Status {
                url: url.to_string(),
                status: status.as_u16(),
                body,
            },
        })
    }

    /// Sends and decodes a JSON body into `T`.
    pub async fn json<T, F>(&self, url: &str, build: F) -> Result<T, SourceError>
    where
        T: DeserializeOwned,
        F: Fn(&Client) -> RequestBuilder,
    {
        let resp = self.send(url, build).await?;
        self.decode(url, resp).await
    }

    /// Reads a response body and decodes it; a body that is not the
    /// expected JSON is `Malformed` with serde's line and column.
    pub async fn decode<T: DeserializeOwned>(
        &self,
        url: &str,
        resp: Response,
    ) -> Result<T, SourceError> {
        let bytes = resp.bytes().await.map_err(|e| self.transport(url, &e))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            SourceError::malformed(
                url,
                format!(
                    "{e} (body starts {:?})",
                    crate::error::truncate(&String::from_utf8_lossy(&bytes), 80)
                ),
            )
        })
    }

    pub fn transport(&self, url: &str, e: &reqwest::Error) -> SourceError {
        if e.is_timeout() {
            return SourceError::Timeout {
                url: url.to_string(),
                timeout_ms: self.timeout_ms,
            };
        }
        // reqwest repeats the URL in its message; the error names it already.
        let message = match e.url() {
            Some(u) => chain(e).replace(&format!(" for url ({u})"), ""),
            None => chain(e),
        };
        if e.is_decode() {
            return SourceError::malformed(url, message);
        }
        SourceError::Connect {
            url: url.to_string(),
            message,
        }
    }
}

/// An error and its causes on one line ("error sending request: client
/// error (Connect): tcp connect error: Connection refused").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = s.source();
    }
    parts.join(": ")
}
