//! OAuth2 client credentials (RFC 6749 §4.4): `POST <token_url>` with
//! `grant_type=client_credentials` (and `scope` when configured), the
//! client authenticated with HTTP basic (`client_secret_basic`). The token
//! is cached until a minute before `expires_in` runs out, and re-issued
//! after a 401. The token and the secret never reach a log or an error:
//! the response is read field by field.

use chrono::{DateTime, Duration, Utc};
use fleet_connector::{HttpClient, SourceError};
use fleet_runtime::Credential;
use reqwest::Url;
use serde_json::Value;

/// Refreshed this long before the server says it expires.
const EXPIRY_MARGIN: Duration = Duration::seconds(60);

#[derive(Clone)]
pub struct Token {
    pub value: String,
    /// `None`: the server gave no `expires_in`; kept until refused.
    pub expires_at: Option<DateTime<Utc>>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("value", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

impl Token {
    pub fn is_fresh(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_none_or(|e| now + EXPIRY_MARGIN < e)
    }
}

/// Reads a token response; errors say what was wrong, never the body.
pub fn parse_token(body: &[u8], now: DateTime<Utc>) -> Result<Token, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        format!(
            "the token response is not JSON (line {} column {})",
            e.line(),
            e.column()
        )
    })?;
    let value = v
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| "the token response has no access_token".to_string())?
        .trim()
        .to_string();
    if let Some(t) = v.get("token_type") {
        match t.as_str() {
            Some(t) if t.eq_ignore_ascii_case("bearer") => {}
            _ => return Err("the token response's token_type is not Bearer".into()),
        }
    }
    let expires_at = match v.get("expires_in") {
        None | Some(Value::Null) => None,
        Some(e) => {
            let secs = e
                .as_i64()
                .or_else(|| e.as_f64().map(|f| f as i64))
                .or_else(|| e.as_str().and_then(|s| s.trim().parse().ok()))
                .filter(|s| *s >= 0)
                .ok_or_else(|| {
                    "the token response's expires_in is not a number of seconds".to_string()
                })?;
            Some(now + Duration::seconds(secs))
        }
    };
    Ok(Token { value, expires_at })
}

/// The form body of the token request.
pub fn token_form(scope: &str) -> Vec<(&'static str, String)> {
    let mut form = vec![("grant_type", "client_credentials".to_string())];
    if !scope.trim().is_empty() {
        form.push(("scope", scope.trim().to_string()));
    }
    form
}

/// The client's credentials and its cached token.
pub struct OAuth {
    pub token_url: Url,
    pub client_id: String,
    pub client_secret: Credential,
    pub scope: String,
    pub cached: Option<Token>,
}

impl OAuth {
    /// A fresh token: the cached one unless `force` or about to expire.
    pub async fn token(&mut self, http: &HttpClient, force: bool) -> Result<String, SourceError> {
        let now = Utc::now();
        match &self.cached {
            Some(t) if !force && t.is_fresh(now) => return Ok(t.value.clone()),
            _ => {}
        }
        let t = self.issue(http).await?;
        tracing::info!(token_url = %self.token_url, expires_at = ?t.expires_at, "borneo token issued");
        let value = t.value.clone();
        self.cached = Some(t);
        Ok(value)
    }

    pub fn invalidate(&mut self) {
        self.cached = None;
    }

    async fn issue(&self, http: &HttpClient) -> Result<Token, SourceError> {
        let key = "connectors.borneo.client_secret";
        let secret = self
            .client_secret
            .resolve(key)
            .map_err(|e| SourceError::Config(e.to_string()))?
            .ok_or_else(|| SourceError::Config(format!("configuration key {key} is required")))?;
        let url = self.token_url.as_str();
        let form = token_form(&self.scope);
        let resp = http
            .send(url, |c| {
                c.post(self.token_url.clone())
                    .header("Accept", "application/json")
                    .basic_auth(&self.client_id, Some(secret.expose()))
                    .form(&form)
            })
            .await?;
        let bytes = resp.bytes().await.map_err(|e| http.transport(url, &e))?;
        parse_token(&bytes, Utc::now()).map_err(|m| SourceError::malformed(url, m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = include_str!("../testdata/oauth-token.json");

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-29T16:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn token_responses() {
        let t = parse_token(SAMPLE.as_bytes(), now()).unwrap();
        assert_eq!(t.value, "ya29.c.b0AXv0zTPx-fleet-test-token");
        assert_eq!(t.expires_at, Some(now() + Duration::seconds(3599)));
        assert!(t.is_fresh(now()));
        assert!(t.is_fresh(now() + Duration::seconds(3500)));
        assert!(!t.is_fresh(now() + Duration::seconds(3560)));
        assert!(!format!("{t:?}").contains("fleet-test-token"));
        let forever = parse_token(br#"{"access_token": "abc"}"#, now()).unwrap();
        assert!(forever.is_fresh(now() + Duration::days(365)));
        let s = parse_token(
            br#"{"access_token": "abc", "token_type": "bearer", "expires_in": "60"}"#,
            now(),
        )
        .unwrap();
        assert_eq!(s.expires_at, Some(now() + Duration::seconds(60)));
        for (body, fragment) in [
            (r#"{"token_type": "Bearer"}"#, "no access_token"),
            (r#"{"access_token": ""}"#, "no access_token"),
            (
                r#"{"access_token": "tok-SECRET", "token_type": "mac"}"#,
                "not Bearer",
            ),
            (
                r#"{"access_token": "tok-SECRET", "expires_in": -5}"#,
                "expires_in",
            ),
            (r#"{"access_token": "tok-SECRET"#, "not JSON"),
        ] {
            let e = parse_token(body.as_bytes(), now()).unwrap_err();
            assert!(e.contains(fragment), "{body}: {e}");
            assert!(!e.contains("SECRET"), "{e}");
        }
    }

    #[test]
    fn the_form() {
        assert_eq!(
            token_form(""),
            vec![("grant_type", "client_credentials".to_string())]
        );
        assert_eq!(
            token_form(" custody.read "),
            vec![
                ("grant_type", "client_credentials".to_string()),
                ("scope", "custody.read".to_string())
            ]
        );
    }
}
