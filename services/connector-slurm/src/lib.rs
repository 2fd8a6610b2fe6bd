//! connector-slurm: reads slurmrestd `GET /slurm/v0.0.<n>/nodes` for each
//! configured site and publishes `SlurmRegistered`, `SlurmNodeHealthy` and
//! the normalised SLURM state tokens, keyed by node name within the site.
//! A node seen before that SLURM no longer lists is `NoLongerObserved`
//! (mirror cleared); an unreadable slurmrestd is `SchedulerUnreachable`
//! (mirror kept).

mod config;
pub use config::{Config, SiteConfig};
pub(crate) mod mapping;
pub(crate) mod version;

use chrono::{DateTime, Utc};
use fleet_connector::paginate::{base_url, join};
use fleet_connector::{HttpClient, PollContext, Section, SourceError, Target};
use fleet_domain::Source;
use fleet_proto::v1::{self, condition_snapshot::Mirror};
use fleet_runtime::config::Credential;
use fleet_runtime::{Common, Shutdown};
use reqwest::{RequestBuilder, Url};

use crate::mapping::{map_nodes, NodesResponse, SCHEDULER_UNREACHABLE};
use crate::version::{ApiVersion, PROBE_ORDER};

pub(crate) const HEADER_USER_NAME: &str = "X-SLURM-USER-NAME";
pub(crate) const HEADER_USER_TOKEN: &str = "X-SLURM-USER-TOKEN";

/// The client of one site's slurmrestd.
pub(crate) struct SlurmSite {
    site: String,
    base: Url,
    /// Configured, or detected and cached until a 404 says otherwise.
    version: Option<ApiVersion>,
    configured: bool,
    user_name: String,
    token: Credential,
    http: HttpClient,
}

/// The JWT headers, resolved per poll so a rotated token file is picked up.
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

impl SlurmSite {
    pub fn new(site: &str, c: &SiteConfig, http: HttpClient) -> anyhow::Result<Self> {
        let key = format!("connectors.slurm.sites.{site}");
        anyhow::ensure!(
            !c.url.trim().is_empty(),
            "configuration key {key}.url is required"
        );
        let base = base_url(&format!("{key}.url"), &c.url)?;
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
        Ok(SlurmSite {
            site: site.to_string(),
            base,
            configured: version.is_some(),
            version,
            user_name: c.user_name.trim().to_string(),
            token: c.token.clone(),
            http,
        })
    }

    fn auth(&self) -> Result<Auth, SourceError> {
        if self.user_name.is_empty() {
            return Ok(Auth(None));
        }
        let token = self
            .token
            .resolve(&format!("connectors.slurm.sites.{}.token", self.site))
            .map_err(|e| SourceError::Config(e.to_string()))?
            .ok_or_else(|| SourceError::Config("slurm token is not configured".into()))?;
        Ok(Auth(Some((
            self.user_name.clone(),
            token.expose().to_string(),
        ))))
    }

    /// The configured version, the cached one, `/openapi/v3`, or the first
    /// `/ping` that answers.
    async fn version(&mut self, auth: &Auth) -> Result<ApiVersion, SourceError> {
        if let Some(v) = self.version {
            return Ok(v);
        }
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
            None => self.probe(auth).await?,
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

    async fn read(&mut self) -> Result<Vec<mapping::Node>, SourceError> {
        let auth = self.auth()?;
        let v = self.version(&auth).await?;
        let url = join(&self.base, &v.nodes_path());
        let r: NodesResponse = match self
            .http
            .json(url.as_str(), |c| auth.apply(c.get(url.clone())))
            .await
        {
            Ok(r) => r,
            Err(e @ SourceError::Status { status: 404, .. }) => {
                if !self.configured {
                    // slurmrestd was upgraded: detect again next poll.
                    self.version = None;
                }
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
}

impl Target for SlurmSite {
    fn source(&self) -> Source {
        Source::Slurm
    }

    fn site(&self) -> &str {
        &self.site
    }

    fn outage_reason(&self) -> &'static str {
        SCHEDULER_UNREACHABLE
    }

    fn outage_mirror(&self) -> Option<Mirror> {
        mapping::outage_mirror()
    }

    fn vanished(&self, key: &v1::DeviceKey, at: DateTime<Utc>) -> Option<v1::ConditionSnapshot> {
        Some(mapping::no_longer_observed(key, at))
    }

    async fn poll(
        &mut self,
        ctx: PollContext<'_>,
    ) -> Result<Vec<v1::ConditionSnapshot>, SourceError> {
        let nodes = self.read().await?;
        let m = map_nodes(&self.site, &nodes, ctx.observed_at);
        for d in &m.dropped {
            tracing::warn!(site = %self.site, node = %d.node, token = %d.token, "unmodelled slurm state token dropped");
            ctx.metrics.warning("slurm", "unmodelled_token");
        }
        if m.unnamed > 0 {
            tracing::warn!(site = %self.site, count = m.unnamed, "slurmrestd listed nodes without a name; skipped");
            ctx.metrics.warning("slurm", "unnamed_node");
        }
        Ok(m.snapshots)
    }
}

pub(crate) fn targets(c: &Config, http: &HttpClient) -> anyhow::Result<Vec<SlurmSite>> {
    fleet_connector::per_site("slurm", &c.sites, |(site, sc)| {
        SlurmSite::new(site, sc, http.clone())
    })
}

/// Runs the connector with its section (`connectors.slurm`) until shutdown.
pub async fn run(common: Common, c: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let section = Section::new(Source::Slurm, "slurm", &c.listen, &c.poll);
    fleet_connector::serve(&common, section, shutdown, |h| targets(&c, h)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_runtime::config::Secret;

    fn http() -> HttpClient {
        HttpClient::with_defaults("slurm").unwrap()
    }

    #[test]
    fn site_configuration_errors_name_their_key() {
        let err = |c: SiteConfig| SlurmSite::new("s1", &c, http()).err().unwrap().to_string();
        assert!(err(SiteConfig::default()).contains("connectors.slurm.sites.s1.url"));
        let with_url = |c: SiteConfig| SiteConfig {
            url: "http://slurm:6820".into(),
            ..c
        };
        let e = err(with_url(SiteConfig {
            user_name: "root".into(),
            ..Default::default()
        }));
        assert!(
            e.contains("user_name and") && e.contains(".token go together"),
            "{e}"
        );
        let e = err(with_url(SiteConfig {
            token: Credential {
                value: Secret::new("jwt"),
                ..Default::default()
            },
            ..Default::default()
        }));
        assert!(e.contains("go together"), "{e}");
        let e = err(with_url(SiteConfig {
            api_version: "38".into(),
            ..Default::default()
        }));
        assert!(e.contains("connectors.slurm.sites.s1.api_version"), "{e}");
        let ok = SlurmSite::new(
            "s1",
            &with_url(SiteConfig {
                api_version: "v0.0.38".into(),
                user_name: "root".into(),
                token: Credential {
                    value: Secret::new("jwt"),
                    ..Default::default()
                },
                ..Default::default()
            }),
            http(),
        )
        .unwrap();
        assert_eq!(ok.version, Some(ApiVersion(38)));
        assert!(ok.configured);
    }
}
