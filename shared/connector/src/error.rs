//! Why a source could not be read. Every variant is an outage for the poll
//! that met it; some are worth retrying within the poll first.

/// A failed read of a source system. Messages name the URL (never a
/// credential) and what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("cannot connect to {url}: {message}")]
    Connect { url: String, message: String },
    #[error("{url} did not answer within {timeout_ms} ms")]
    Timeout { url: String, timeout_ms: u64 },
    #[error("{url} answered HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url} refused the credentials (HTTP {status}): {body}")]
    Auth {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url} sent a malformed body: {message}")]
    Malformed { url: String, message: String },
    /// The answer was well-formed JSON but broke the protocol: a
    /// pagination loop, a missing token header, too many pages.
    #[error("{0}")]
    Protocol(String),
    /// Local configuration that only shows at read time (a credential file
    /// that cannot be read).
    #[error("{0}")]
    Config(String),
}

impl SourceError {
    /// The `kind` label of the errors metric.
    pub fn kind(&self) -> &'static str {
        match self {
            SourceError::Connect { .. } => "connect",
            SourceError::Timeout { .. } => "timeout",
            SourceError::Status { status, .. } if *status >= 500 => "http_5xx",
            SourceError::Status { status: 429, .. } => "http_429",
            SourceError::Status { .. } => "http_4xx",
            SourceError::Auth { .. } => "auth",
            SourceError::Malformed { .. } => "malformed",
            SourceError::Protocol(_) => "protocol",
            SourceError::Config(_) => "config",
        }
    }

    /// Worth another attempt within the same poll.
    pub fn is_retryable(&self) -> bool {
        match self {
            SourceError::Connect { .. } | SourceError::Timeout { .. } => true,
            SourceError::Status { status, .. } => {
                *status >= 500 || *status == 429 || *status == 408
            }
            _ => false,
        }
    }

    /// An HTTP 401: the token may have expired and a refresh may help.
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, SourceError::Auth { status: 401, .. })
    }

    pub fn malformed(url: &str, message: impl Into<String>) -> Self {
        SourceError::Malformed {
            url: url.to_string(),
            message: message.into(),
        }
    }
}

/// A short, single-line excerpt of an error body. Knows the error shapes
/// of the systems we read: Ironic's double-encoded `error_message`, NetBox's
/// `detail`, slurmrestd's `errors[]`, Keystone's `error.message`.
pub fn body_excerpt(body: &str) -> String {
    fn faultstring(v: &serde_json::Value) -> Option<String> {
        if let Some(s) = v.get("error_message") {
            // Ironic: a JSON string holding JSON with `faultstring`.
            let inner = s
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| s.to_string());
            return Some(
                serde_json::from_str::<serde_json::Value>(&inner)
                    .ok()
                    .and_then(|i| {
                        i.get("faultstring")
                            .and_then(|f| f.as_str().map(String::from))
                    })
                    .unwrap_or(inner),
            );
        }
        if let Some(d) = v.get("detail").and_then(|d| d.as_str()) {
            return Some(d.to_string());
        }
        if let Some(errors) = v.get("errors").and_then(|e| e.as_array()) {
            let msgs: Vec<String> = errors
                .iter()
                .filter_map(|e| {
                    e.get("description")
                        .or_else(|| e.get("error"))
                        .and_then(|m| m.as_str())
                        .filter(|m| !m.is_empty())
                        .map(String::from)
                })
                .collect();
            if !msgs.is_empty() {
                return Some(msgs.join("; "));
            }
        }
        v.get("error")
            .and_then(|e| e.get("message"))
            .and_then(|m| m.as_str())
            .map(String::from)
    }
    let text = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| faultstring(&v))
        .unwrap_or_else(|| body.to_string());
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    truncate(&one_line, 300)
}

/// At most `max` characters, with an ellipsis when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(max).collect();
        out.push('…');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_know_each_error_shape() {
        let ironic = include_str!("../testdata/ironic-error-404.json");
        assert_eq!(
            body_excerpt(ironic),
            "Node doesnotexist could not be found."
        );
        assert_eq!(
            body_excerpt(r#"{"detail": "Invalid v1 token"}"#),
            "Invalid v1 token"
        );
        assert_eq!(
            body_excerpt(r#"{"errors": [{"error": "Unable to query nodes", "error_number": 1}]}"#),
            "Unable to query nodes"
        );
        assert_eq!(
            body_excerpt(
                r#"{"error": {"code": 401, "message": "The request you have made requires authentication."}}"#
            ),
            "The request you have made requires authentication."
        );
        assert_eq!(
            body_excerpt("<html>\n  Bad Gateway\n</html>"),
            "<html> Bad Gateway </html>"
        );
        assert_eq!(body_excerpt(&"x".repeat(400)).chars().count(), 301);
    }

    #[test]
    fn kinds_and_retries() {
        let s = |status| SourceError::Status {
            url: "u".into(),
            status,
            body: String::new(),
        };
        assert_eq!(s(503).kind(), "http_5xx");
        assert!(s(503).is_retryable());
        assert!(s(429).is_retryable());
        assert!(!s(404).is_retryable());
        assert_eq!(s(404).kind(), "http_4xx");
        let auth = SourceError::Auth {
            url: "u".into(),
            status: 401,
            body: String::new(),
        };
        assert!(auth.is_unauthorized() && !auth.is_retryable());
        assert!(!SourceError::malformed("u", "x").is_retryable());
        assert!(SourceError::Timeout {
            url: "u".into(),
            timeout_ms: 1
        }
        .is_retryable());
    }
}
