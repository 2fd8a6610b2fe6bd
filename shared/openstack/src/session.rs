//! One site's OpenStack session: the token to send (when the site
//! authenticates) and the endpoint of each service.

use crate::SiteConfig;
use fleet_connector::paginate::base_url;
use fleet_connector::{HttpClient, SourceError};
use reqwest::{Method, Url};
use serde::de::DeserializeOwned;

use crate::keystone::{endpoint, tokens_url, Keystone, HEADER_AUTH_TOKEN};

pub const HEADER_IRONIC_VERSION: &str = "X-OpenStack-Ironic-API-Version";
pub const HEADER_API_VERSION: &str = "OpenStack-API-Version";

pub struct Session {
    pub site: String,
    pub config: SiteConfig,
    /// Configured endpoints; otherwise from the Keystone catalogue.
    ironic_url: Option<Url>,
    placement_url: Option<Url>,
    nova_url: Option<Url>,
    /// The token cache: locked only to read or renew the token, so
    /// requests of one site run at once.
    keystone: Option<tokio::sync::Mutex<Keystone>>,
    pub http: HttpClient,
}

impl Session {
    /// Checks `c` (its keys named under `key`) and builds the session.
    pub fn new(site: &str, key: &str, c: &SiteConfig, http: HttpClient) -> anyhow::Result<Self> {
        let url = |field: &str, v: &str| -> anyhow::Result<Option<Url>> {
            if v.trim().is_empty() {
                Ok(None)
            } else {
                Ok(Some(base_url(&format!("{key}.{field}"), v)?))
            }
        };
        let ironic_url = url("ironic_url", &c.ironic_url)?;
        let placement_url = url("placement_url", &c.placement_url)?;
        let nova_url = url("nova_url", &c.nova_url)?;
        let keystone = match url("auth_url", &c.auth_url)? {
            None => None,
            Some(auth) => {
                for (field, v) in [("username", &c.username), ("project_name", &c.project_name)] {
                    anyhow::ensure!(
                        !v.trim().is_empty(),
                        "configuration key {key}.{field} is required with {key}.auth_url"
                    );
                }
                anyhow::ensure!(
                    c.password.is_configured(),
                    "configuration key {key}.password is required with {key}.auth_url (value, file or env)"
                );
                c.password.resolve(&format!("{key}.password"))?;
                Some(tokio::sync::Mutex::new(Keystone {
                    site: site.to_string(),
                    tokens_url: tokens_url(&auth),
                    config: c.clone(),
                    password: c.password.clone(),
                    cached: None,
                }))
            }
        };
        anyhow::ensure!(
            ironic_url.is_some() || nova_url.is_some() || keystone.is_some(),
            "configuration key {key}.ironic_url is required (or {key}.auth_url, to find Ironic in the catalogue)"
        );
        Ok(Session {
            site: site.to_string(),
            config: c.clone(),
            ironic_url,
            placement_url,
            nova_url,
            keystone,
            http,
        })
    }

    /// Whether Placement can be reached (configured, or a catalogue to
    /// find it in).
    pub fn has_placement(&self) -> bool {
        self.placement_url.is_some() || self.keystone.is_some()
    }

    /// The token to send, if the site authenticates; `force` re-issues it.
    async fn token(&self, force: bool) -> Result<Option<String>, SourceError> {
        match &self.keystone {
            None => Ok(None),
            Some(k) => Ok(Some(
                k.lock().await.token(&self.http, force).await?.value.clone(),
            )),
        }
    }

    /// A configured endpoint, or the catalogue's (`baremetal`,
    /// `placement`, `compute`).
    pub async fn endpoint(&self, service_type: &str) -> Result<Url, SourceError> {
        let configured = match service_type {
            "baremetal" => self.ironic_url.clone(),
            "compute" => self.nova_url.clone(),
            _ => self.placement_url.clone(),
        };
        if let Some(u) = configured {
            return Ok(u);
        }
        let (interface, region) = (self.config.interface.clone(), self.config.region.clone());
        let Some(k) = &self.keystone else {
            return Err(SourceError::Config(format!(
                "no {service_type} endpoint configured"
            )));
        };
        let mut k = k.lock().await;
        let t = k.token(&self.http, false).await?;
        let found = endpoint(&t.catalog, service_type, &interface, &region).ok_or_else(|| {
            SourceError::Protocol(format!(
                "the keystone catalogue has no {service_type} endpoint on interface {interface:?}{}",
                if region.is_empty() { String::new() } else { format!(" in region {region:?}") }
            ))
        })?;
        base_url(&format!("keystone catalogue {service_type}"), &found)
    }

    /// A request with the token and `headers` (and a JSON `body`); a 401
    /// re-issues the token once. Returns the response body as text.
    pub async fn send(
        &self,
        method: Method,
        url: &Url,
        headers: &[(&'static str, String)],
        body: Option<&serde_json::Value>,
    ) -> Result<String, SourceError> {
        self.request(method, url, headers, body, true).await
    }

    /// As `send`, but an action whose repeat is not the same request (a
    /// provision verb, a server create) goes out once: a timeout or a 5xx
    /// is returned for the caller to read the system back
    /// (`HttpClient::send_once`). A refused token is still re-issued: the
    /// action was not taken.
    pub async fn send_once(
        &self,
        method: Method,
        url: &Url,
        headers: &[(&'static str, String)],
        body: Option<&serde_json::Value>,
    ) -> Result<String, SourceError> {
        self.request(method, url, headers, body, false).await
    }

    async fn request(
        &self,
        method: Method,
        url: &Url,
        headers: &[(&'static str, String)],
        body: Option<&serde_json::Value>,
        retry: bool,
    ) -> Result<String, SourceError> {
        let mut refreshed = false;
        loop {
            let token = self.token(refreshed).await?;
            let build = |c: &reqwest::Client| {
                let mut r = c
                    .request(method.clone(), url.clone())
                    .header("Accept", "application/json");
                for (k, v) in headers {
                    r = r.header(*k, v);
                }
                if let Some(t) = &token {
                    r = r.header(HEADER_AUTH_TOKEN, t);
                }
                if let Some(b) = body {
                    r = r.json(b);
                }
                r
            };
            let r = if retry {
                self.http.send(url.as_str(), build).await
            } else {
                self.http.send_once(url.as_str(), build).await
            };
            match r {
                Err(e) if e.is_unauthorized() && self.keystone.is_some() && !refreshed => {
                    tracing::info!(site = %self.site, url = %url, "token refused; re-authenticating");
                    if let Some(k) = &self.keystone {
                        k.lock().await.invalidate();
                    }
                    refreshed = true;
                }
                Err(e) => return Err(e),
                Ok(resp) => {
                    return resp
                        .text()
                        .await
                        .map_err(|e| self.http.transport(url.as_str(), &e))
                }
            }
        }
    }

    /// GET with the token and `headers`, decoded as `T`.
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        url: &Url,
        headers: &[(&'static str, String)],
    ) -> Result<T, SourceError> {
        let text = self.send(Method::GET, url, headers, None).await?;
        serde_json::from_str(&text).map_err(|e| {
            SourceError::malformed(
                url.as_str(),
                format!(
                    "{e} (body starts {:?})",
                    fleet_connector::error::truncate(&text, 80)
                ),
            )
        })
    }
}
