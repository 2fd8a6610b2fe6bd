//! Keystone v3 password authentication: the request body, the token and its
//! expiry, and endpoint lookup in the service catalogue. Pure except for
//! [`Keystone::authenticate`].

use crate::SiteConfig;
use chrono::{DateTime, Duration, Utc};
use fleet_connector::paginate::join;
use fleet_connector::{HttpClient, SourceError};
use fleet_runtime::Credential;
use reqwest::Url;
use serde::Deserialize;

pub const HEADER_SUBJECT_TOKEN: &str = "X-Subject-Token";
pub const HEADER_AUTH_TOKEN: &str = "X-Auth-Token";

/// A token is refreshed this long before Keystone says it expires.
const EXPIRY_MARGIN: Duration = Duration::seconds(60);

#[derive(Debug, Deserialize)]
pub struct TokenResponse {
    pub token: TokenBody,
}

#[derive(Debug, Deserialize)]
pub struct TokenBody {
    pub expires_at: String,
    #[serde(default)]
    pub catalog: Vec<Service>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Service {
    #[serde(rename = "type")]
    pub service_type: String,
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Endpoint {
    pub interface: String,
    pub url: String,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub region_id: Option<String>,
}

/// A token with what came with it.
#[derive(Clone)]
pub struct Token {
    pub value: String,
    pub expires_at: DateTime<Utc>,
    pub catalog: Vec<Service>,
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
        now + EXPIRY_MARGIN < self.expires_at
    }
}

/// The `POST /v3/auth/tokens` body for a password, project-scoped token.
pub fn password_body(c: &SiteConfig, password: &str) -> serde_json::Value {
    serde_json::json!({
        "auth": {
            "identity": {
                "methods": ["password"],
                "password": {
                    "user": {
                        "name": c.username,
                        "domain": { "name": c.user_domain_name },
                        "password": password,
                    }
                }
            },
            "scope": {
                "project": {
                    "name": c.project_name,
                    "domain": { "name": c.project_domain_name },
                }
            }
        }
    })
}

/// `<auth_url>/auth/tokens`, whether or not `auth_url` ends in `/v3`.
pub fn tokens_url(auth_url: &Url) -> Url {
    if auth_url.path().trim_end_matches('/').ends_with("/v3") {
        join(auth_url, "auth/tokens")
    } else {
        join(auth_url, "v3/auth/tokens")
    }
}

/// The catalogue endpoint of `service_type` on `interface`, in `region`
/// when one is given.
pub fn endpoint(
    catalog: &[Service],
    service_type: &str,
    interface: &str,
    region: &str,
) -> Option<String> {
    catalog
        .iter()
        .filter(|s| s.service_type == service_type)
        .flat_map(|s| s.endpoints.iter())
        .find(|e| {
            e.interface == interface
                && (region.is_empty()
                    || e.region.as_deref() == Some(region)
                    || e.region_id.as_deref() == Some(region))
        })
        .map(|e| e.url.clone())
}

/// One site's Keystone and its cached token.
pub struct Keystone {
    pub site: String,
    pub tokens_url: Url,
    pub config: SiteConfig,
    pub password: Credential,
    pub cached: Option<Token>,
}

impl Keystone {
    /// A fresh token: the cached one unless `force` or it is about to expire.
    pub async fn token(&mut self, http: &HttpClient, force: bool) -> Result<&Token, SourceError> {
        let now = Utc::now();
        let fresh = self.cached.as_ref().is_some_and(|t| t.is_fresh(now));
        if force || !fresh {
            let t = self.authenticate(http).await?;
            tracing::info!(site = %self.site, expires_at = %t.expires_at, "keystone token issued");
            self.cached = Some(t);
        }
        self.cached
            .as_ref()
            .ok_or_else(|| SourceError::Protocol("no keystone token".into()))
    }

    pub fn invalidate(&mut self) {
        self.cached = None;
    }

    async fn authenticate(&self, http: &HttpClient) -> Result<Token, SourceError> {
        let key = format!("connectors.openstack.sites.{}.password", self.site);
        let password = self
            .password
            .resolve(&key)
            .map_err(|e| SourceError::Config(e.to_string()))?
            .ok_or_else(|| SourceError::Config(format!("configuration key {key} is required")))?;
        let body = password_body(&self.config, password.expose());
        let url = self.tokens_url.as_str();
        let resp = http
            .send(url, |c| c.post(self.tokens_url.clone()).json(&body))
            .await?;
        let value = resp
            .headers()
            .get(HEADER_SUBJECT_TOKEN)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                SourceError::Protocol(format!("{url} issued no {HEADER_SUBJECT_TOKEN} header"))
            })?;
        let body: TokenResponse = http.decode(url, resp).await?;
        let expires_at = DateTime::parse_from_rfc3339(&body.token.expires_at)
            .map_err(|e| {
                SourceError::malformed(
                    url,
                    format!("token.expires_at {:?}: {e}", body.token.expires_at),
                )
            })?
            .with_timezone(&Utc);
        Ok(Token {
            value,
            expires_at,
            catalog: body.token.catalog,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_names_user_project_and_domains() {
        let c = SiteConfig {
            username: "fleet".into(),
            project_name: "service".into(),
            ..Default::default()
        };
        let b = password_body(&c, "pw");
        let user = &b["auth"]["identity"]["password"]["user"];
        assert_eq!(user["name"], "fleet");
        assert_eq!(user["domain"]["name"], "Default");
        assert_eq!(user["password"], "pw");
        assert_eq!(b["auth"]["identity"]["methods"][0], "password");
        assert_eq!(b["auth"]["scope"]["project"]["name"], "service");
    }

    #[test]
    fn tokens_url_with_and_without_v3() {
        let u = |s: &str| Url::parse(s).unwrap();
        assert_eq!(
            tokens_url(&u("https://k:5000/v3")).as_str(),
            "https://k:5000/v3/auth/tokens"
        );
        assert_eq!(
            tokens_url(&u("https://k:5000/v3/")).as_str(),
            "https://k:5000/v3/auth/tokens"
        );
        assert_eq!(
            tokens_url(&u("https://k/identity")).as_str(),
            "https://k/identity/v3/auth/tokens"
        );
    }

    #[test]
    fn catalogue_lookup_by_type_interface_and_region() {
        let body: TokenResponse = serde_json::from_value(serde_json::json!({"token": {
            "expires_at": "2026-11-29T17:00:00.000000Z",
            "catalog": [
                {"type": "baremetal", "name": "ironic", "endpoints": [
                    {"interface": "internal", "region": "r1", "region_id": "r1", "url": "http://ironic-int:6385"},
                    {"interface": "public", "region": "r1", "region_id": "r1", "url": "https://ironic-r1:6385"},
                    {"interface": "public", "region": "r2", "region_id": "r2", "url": "https://ironic-r2:6385"}
                ]},
                {"type": "placement", "endpoints": [
                    {"interface": "public", "region_id": "r1", "url": "https://placement/placement"}
                ]}
            ]
        }}))
        .unwrap();
        let cat = &body.token.catalog;
        assert_eq!(
            endpoint(cat, "baremetal", "public", "r2").as_deref(),
            Some("https://ironic-r2:6385")
        );
        assert_eq!(
            endpoint(cat, "baremetal", "internal", "").as_deref(),
            Some("http://ironic-int:6385")
        );
        assert_eq!(
            endpoint(cat, "placement", "public", "r1").as_deref(),
            Some("https://placement/placement")
        );
        assert_eq!(endpoint(cat, "compute", "public", ""), None);
        let t = Token {
            value: "secret-token".into(),
            expires_at: DateTime::parse_from_rfc3339(&body.token.expires_at)
                .unwrap()
                .with_timezone(&Utc),
            catalog: vec![],
        };
        assert!(t.is_fresh(t.expires_at - Duration::seconds(120)));
        assert!(!t.is_fresh(t.expires_at - Duration::seconds(30)));
        assert!(!format!("{t:?}").contains("secret-token"));
    }
}
