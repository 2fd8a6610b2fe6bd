//! fleet-slurm: one site's slurmrestd as connector-slurm reads it and the
//! workflow service writes it: the API version (configured, or detected
//! from `/openapi/v3`, else by probing `/ping`), the JWT headers
//! (`X-SLURM-USER-NAME`, `X-SLURM-USER-TOKEN`, resolved per call so a
//! rotated token file is picked up), the node list, one node, and a node
//! update where the version has one (`POST /slurm/v0.0.<n>/node/{name}`,
//! v0.0.39 and later: SLURM 22.05's v0.0.38 binds that path for GET only),
//! and the burn-in's batch jobs (`jobs`).

mod jobs;
mod version;

use fleet_connector::paginate::{join, required_base_url, with_segments};
use fleet_connector::{HttpClient, SourceError};
use fleet_runtime::Credential;
use reqwest::{RequestBuilder, Url};
use serde::{Deserialize, Serialize};

pub use jobs::{Job, Submission};
pub use version::{from_openapi, ApiVersion, PROBE_ORDER};

pub const HEADER_USER_NAME: &str = "X-SLURM-USER-NAME";
pub const HEADER_USER_TOKEN: &str = "X-SLURM-USER-TOKEN";

/// One site's slurmrestd as its configuration names it (the same keys under
/// `connectors.slurm.sites.<site>` and `workflow.sites.<site>.slurm`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SiteConfig {
    /// slurmrestd, e.g. `http://slurm-head:6820`.
    pub url: String,
    /// `v0.0.38`, `v0.0.40`, ...; empty: detected from `/openapi/v3`, else
    /// by probing `/slurm/v0.0.<n>/ping`.
    pub api_version: String,
    /// `X-SLURM-USER-NAME`; empty sends no JWT headers.
    pub user_name: String,
    /// `X-SLURM-USER-TOKEN` (a JWT).
    pub token: Credential,
}

/// `GET /slurm/v0.0.<n>/nodes`.
#[derive(Debug, Clone, Deserialize)]
pub struct NodesResponse {
    pub nodes: Vec<Node>,
    #[serde(default)]
    pub errors: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Node {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub state: Option<OneOrMany>,
    #[serde(default)]
    pub state_flags: Option<Vec<String>>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// A string (v0.0.38) or a list of strings (v0.0.39+).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl Node {
    /// Every state word as reported: `state` then `state_flags`.
    pub fn reported(&self) -> Vec<String> {
        let mut out: Vec<String> = match &self.state {
            None => vec![],
            Some(OneOrMany::One(s)) => vec![s.clone()],
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        out.extend(self.state_flags.iter().flatten().cloned());
        out
    }
}

/// `GET /slurm/v0.0.<n>/node/{name}`.
#[derive(Debug, Clone, Deserialize)]
struct NodeResponse {
    #[serde(default)]
    nodes: Vec<Node>,
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

/// A slurmrestd answer carrying `errors[]`.
#[derive(Debug, Clone, Deserialize)]
struct Answer {
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

/// The JWT headers of one call.
#[derive(Clone)]
struct Auth(Option<(String, String)>);

impl Auth {
    fn apply(&self, r: RequestBuilder) -> RequestBuilder {
        match &self.0 {
            Some((user, token)) => r
                .header(HEADER_USER_NAME, user)
                .header(HEADER_USER_TOKEN, token),
            None => r,
        }
    }
}

/// One site's slurmrestd.
pub struct Slurmrestd {
    site: String,
    /// The configuration key the site is under, for errors.
    key: String,
    base: Url,
    /// Configured, or detected and cached until a 404 says otherwise.
    version: Option<ApiVersion>,
    configured: bool,
    user_name: String,
    token: Credential,
    http: HttpClient,
}

impl Slurmrestd {
    /// `key`: where the site's configuration is (`connectors.slurm.sites.s1`).
    pub fn new(site: &str, key: &str, c: &SiteConfig, http: HttpClient) -> anyhow::Result<Self> {
        let base = required_base_url(&format!("{key}.url"), &c.url)?;
        let version = if c.api_version.trim().is_empty() {
            None
        } else {
            Some(
                ApiVersion::parse(&c.api_version)
                    .map_err(|e| anyhow::anyhow!("configuration key {key}.api_version: {e}"))?,
            )
        };
        anyhow::ensure!(
            c.token.is_configured() != c.user_name.trim().is_empty(),
            "configuration keys {key}.user_name and {key}.token go together: slurmrestd rejects a token without a user name"
        );
        if c.token.is_configured() {
            c.token.resolve(&format!("{key}.token"))?;
        }
        Ok(Slurmrestd {
            site: site.to_string(),
            key: key.to_string(),
            base,
            configured: version.is_some(),
            version,
            user_name: c.user_name.trim().to_string(),
            token: c.token.clone(),
            http,
        })
    }

    pub fn site(&self) -> &str {
        &self.site
    }

    /// The version configured or detected so far.
    pub fn known_version(&self) -> Option<ApiVersion> {
        self.version
    }

    /// Whether the version was configured (never re-detected).
    pub fn configured(&self) -> bool {
        self.configured
    }

    fn auth(&self) -> Result<Auth, SourceError> {
        if self.user_name.is_empty() {
            return Ok(Auth(None));
        }
        let token = self
            .token
            .resolve(&format!("{}.token", self.key))
            .map_err(|e| SourceError::Config(e.to_string()))?
            .ok_or_else(|| SourceError::Config("slurm token is not configured".into()))?;
        Ok(Auth(Some((
            self.user_name.clone(),
            token.expose().to_string(),
        ))))
    }

    /// The configured version, the cached one, `/openapi/v3`, or the first
    /// `/ping` that answers.
    pub async fn version(&mut self) -> Result<ApiVersion, SourceError> {
        if let Some(v) = self.version {
            return Ok(v);
        }
        let auth = self.auth()?;
        let url = join(&self.base, "openapi/v3");
        let detected = match self
            .http
            .json::<serde_json::Value, _>(url.as_str(), |c| auth.apply(c.get(url.clone())))
            .await
        {
            Ok(doc) => version::from_openapi(&doc),
            Err(e @ (SourceError::Connect { .. } | SourceError::Timeout { .. })) => return Err(e),
            Err(e) => {
                tracing::debug!(site = %self.site, error = %e, "no usable /openapi/v3; probing ping");
                None
            }
        };
        let v = match detected {
            Some(v) => v,
            None => self.probe(&auth).await?,
        };
        tracing::info!(site = %self.site, version = %v, "slurmrestd api version detected");
        self.version = Some(v);
        Ok(v)
    }

    async fn probe(&self, auth: &Auth) -> Result<ApiVersion, SourceError> {
        for v in PROBE_ORDER {
            let url = join(&self.base, &v.ping_path());
            match self
                .http
                .send(url.as_str(), |c| auth.apply(c.get(url.clone())))
                .await
            {
                Ok(_) => return Ok(v),
                Err(SourceError::Status { status: 404, .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(SourceError::Protocol(format!(
            "slurmrestd at {} serves none of the versions {}..{} (neither /openapi/v3 nor /slurm/v0.0.<n>/ping)",
            self.base,
            PROBE_ORDER[PROBE_ORDER.len() - 1],
            PROBE_ORDER[0]
        )))
    }

    /// A 404 from a detected version: slurmrestd may have been upgraded;
    /// detect again next call.
    fn forget_detected(&mut self) {
        if !self.configured {
            self.version = None;
        }
    }

    /// `GET /slurm/v0.0.<n>/nodes`.
    pub async fn nodes(&mut self) -> Result<Vec<Node>, SourceError> {
        let v = self.version().await?;
        let auth = self.auth()?;
        let url = join(&self.base, &v.nodes_path());
        let r: NodesResponse = match self
            .http
            .json(url.as_str(), |c| auth.apply(c.get(url.clone())))
            .await
        {
            Ok(r) => r,
            Err(e @ SourceError::Status { status: 404, .. }) => {
                self.forget_detected();
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if r.nodes.is_empty() && !r.errors.is_empty() {
            return Err(SourceError::Protocol(format!(
                "{url} listed no nodes and reported errors: {}",
                fleet_connector::error::body_excerpt(
                    &serde_json::json!({ "errors": r.errors }).to_string()
                )
            )));
        }
        Ok(r.nodes)
    }

    /// `GET /slurm/v0.0.<n>/node/{name}`; `None` when SLURM does not list
    /// the node.
    pub async fn node(&mut self, name: &str) -> Result<Option<Node>, SourceError> {
        let v = self.version().await?;
        let auth = self.auth()?;
        let url = self.node_url(v, name)?;
        match self
            .http
            .json::<NodeResponse, _>(url.as_str(), |c| auth.apply(c.get(url.clone())))
            .await
        {
            Ok(r) => {
                let found = r
                    .nodes
                    .into_iter()
                    .find(|n| n.name.as_deref() == Some(name));
                if found.is_none() && !r.errors.is_empty() {
                    tracing::debug!(site = %self.site, node = name, errors = ?r.errors, "slurmrestd lists no such node");
                }
                Ok(found)
            }
            Err(SourceError::Status { status: 404, .. }) => Ok(None),
            // 22.05 answers an unknown node with a 500 whose errors[] says
            // so (errno 2018, "Invalid node name specified"); any other 500
            // is an outage, never "not listed".
            Err(SourceError::Status {
                status: 500, body, ..
            }) if body.contains("Invalid node name") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether this site's slurmrestd updates nodes over REST (v0.0.39 and
    /// later).
    pub async fn node_update_supported(&mut self) -> Result<bool, SourceError> {
        Ok(self.version().await?.0 >= 39)
    }

    /// `POST /slurm/v0.0.<n>/node/{name}` with `body` (`{"state":
    /// ["RESUME"], "comment": ...}`). A 200 whose `errors[]` is not empty
    /// is a refusal.
    pub async fn update_node(
        &mut self,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<(), SourceError> {
        let v = self.version().await?;
        if v.0 < 39 {
            return Err(SourceError::Protocol(format!(
                "slurmrestd {v} at {} has no node update (it arrived in v0.0.39, SLURM 23.02)",
                self.base
            )));
        }
        let auth = self.auth()?;
        let url = self.node_url(v, name)?;
        let a: Answer = self
            .http
            .json(url.as_str(), |c| auth.apply(c.post(url.clone()).json(body)))
            .await?;
        if a.errors.is_empty() {
            Ok(())
        } else {
            Err(SourceError::Protocol(format!(
                "slurmrestd refused the update of {name}: {}",
                fleet_connector::error::body_excerpt(
                    &serde_json::json!({ "errors": a.errors }).to_string()
                )
            )))
        }
    }

    fn node_url(&self, v: ApiVersion, name: &str) -> Result<Url, SourceError> {
        let url = join(&self.base, &format!("slurm/{v}/node"));
        with_segments(url.clone(), &[name], &url)
    }
}
