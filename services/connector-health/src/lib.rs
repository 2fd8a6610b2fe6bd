//! connector-health: reads the Prometheus query API (`GET
//! <url>/api/v1/query`; Mimir serves it under `/prometheus`, the tenant in
//! `X-Scope-OrgID`) for each configured site, one instant query per series
//! of the contract in [`mapping`] for all hosts of the site (never one per
//! host), and publishes the `chassis_health` composite and the ten health
//! conditions per host, keyed by host name within the site. An unreadable
//! query API is `MimirUnreachable` with the composite emptied, so
//! `health_status` goes `unknown`, never `critical`.

mod config;
pub use config::{Config, SiteConfig};
pub mod mapping;

use chrono::{DateTime, Utc};
use fleet_connector::paginate::{join, required_base_url};
use fleet_connector::{HttpClient, PollContext, Scope, Section, SourceError, Target};
use fleet_domain::Source;
use fleet_proto::v1::{self, condition_snapshot::Mirror};
use fleet_runtime::config::Credential;
use fleet_runtime::{Common, Shutdown};
use reqwest::header::HeaderName;
use reqwest::Url;

use crate::mapping::{map_site, Context, QueryResponse, Sample, MIMIR_UNREACHABLE, SERIES};

/// One site's query API.
pub(crate) struct HealthSite {
    site: String,
    query_url: Url,
    tenant: Option<(HeaderName, String)>,
    site_selector: String,
    host_label: String,
    token: Credential,
    http: HttpClient,
}

/// A Prometheus label name.
fn valid_label(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl HealthSite {
    pub fn new(
        site: &str,
        c: &SiteConfig,
        host_label: &str,
        http: HttpClient,
    ) -> anyhow::Result<Self> {
        let key = format!("connectors.health.sites.{site}");
        let base = required_base_url(&format!("{key}.url"), &c.url)?;
        let tenant = if c.tenant.trim().is_empty() {
            None
        } else {
            let name = HeaderName::from_bytes(c.tenant_header.trim().as_bytes()).map_err(|e| {
                anyhow::anyhow!(
                    "configuration key {key}.tenant_header {:?}: {e}",
                    c.tenant_header
                )
            })?;
            Some((name, c.tenant.trim().to_string()))
        };
        anyhow::ensure!(
            !c.selector.contains(['{', '}']),
            "configuration key {key}.selector: give label matchers only (site=\"lon1\"), without braces"
        );
        anyhow::ensure!(
            valid_label(host_label),
            "configuration key connectors.health.host_label {host_label:?} is not a Prometheus label name"
        );
        if c.token.is_configured() {
            c.token.resolve(&format!("{key}.token"))?;
        }
        Ok(HealthSite {
            site: site.to_string(),
            query_url: join(&base, "api/v1/query"),
            tenant,
            site_selector: c.selector.trim().to_string(),
            host_label: host_label.to_string(),
            token: c.token.clone(),
            http,
        })
    }

    fn context(&self) -> Context<'_> {
        Context {
            site: &self.site,
            host_label: &self.host_label,
            site_selector: &self.site_selector,
        }
    }

    /// One instant query.
    async fn query(&self, promql: &str, token: Option<&str>) -> Result<Vec<Sample>, SourceError> {
        let mut url = self.query_url.clone();
        url.query_pairs_mut().append_pair("query", promql);
        let resp: QueryResponse = self
            .http
            .json(url.as_str(), |c| {
                let mut r = c.get(url.clone()).header("Accept", "application/json");
                if let Some((name, tenant)) = &self.tenant {
                    r = r.header(name, tenant);
                }
                if let Some(t) = token {
                    r = r.bearer_auth(t);
                }
                r
            })
            .await?;
        mapping::vector(resp).map_err(|m| SourceError::Protocol(format!("{url}: {m}")))
    }

    /// The ten series, one query each.
    async fn read(&self) -> Result<[Vec<Sample>; 10], SourceError> {
        let token = self
            .token
            .resolve(&format!("connectors.health.sites.{}.token", self.site))
            .map_err(|e| SourceError::Config(e.to_string()))?;
        let token = token.as_ref().map(|t| t.expose());
        let mut out: [Vec<Sample>; 10] = std::array::from_fn(|_| vec![]);
        for (slot, series) in out.iter_mut().zip(SERIES.iter()) {
            *slot = self
                .query(&mapping::query(series.metric, &self.site_selector), token)
                .await?;
        }
        Ok(out)
    }
}

impl Target for HealthSite {
    fn scope(&self) -> Scope<'_> {
        Scope::new(Source::HealthStatus, &self.site, MIMIR_UNREACHABLE)
    }

    fn outage_mirror(&self) -> Option<Mirror> {
        Some(Mirror::Health(v1::HealthMirror::default()))
    }

    fn outage(
        &self,
        key: &v1::DeviceKey,
        at: DateTime<Utc>,
        message: &str,
    ) -> Option<v1::ConditionSnapshot> {
        Some(mapping::outage(&self.context(), &key.key, at, message))
    }

    fn vanished(&self, key: &v1::DeviceKey, at: DateTime<Utc>) -> Option<v1::ConditionSnapshot> {
        Some(mapping::vanished(&self.context(), &key.key, at))
    }

    async fn poll(
        &mut self,
        ctx: PollContext<'_>,
    ) -> Result<Vec<v1::ConditionSnapshot>, SourceError> {
        let results = self.read().await?;
        let m = map_site(&self.context(), &results, ctx.observed_at);
        for w in &m.warnings {
            match w {
                mapping::Warning::NoHostLabel { metric, count } => {
                    tracing::warn!(site = %self.site, metric = %metric, count, host_label = %self.host_label, "health samples without the host label; skipped")
                }
                mapping::Warning::UnrecognizedValue { metric, host, raw } => {
                    tracing::warn!(site = %self.site, metric = %metric, host = %host, value = %raw, "health value outside 0 (Ok), 1 (Warning), 2 (Critical)")
                }
            }
            ctx.metrics.warning(Source::HealthStatus.as_str(), w.kind());
        }
        Ok(m.snapshots)
    }
}

pub(crate) fn targets(c: &Config, http: &HttpClient) -> anyhow::Result<Vec<HealthSite>> {
    fleet_connector::per_site("health", &c.sites, |(site, sc)| {
        HealthSite::new(site, sc, c.host_label.trim(), http.clone())
    })
}

/// Runs the connector with its section (`connectors.health`) until shutdown.
pub async fn run(common: Common, c: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let section = Section::new(Source::HealthStatus, "health", &c.listen, &c.poll);
    fleet_connector::serve(&common, section, shutdown, |h| targets(&c, h)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http() -> HttpClient {
        HttpClient::with_defaults("health-status").unwrap()
    }

    #[test]
    fn configuration_errors_name_their_key() {
        let err = |c: SiteConfig, label: &str| {
            HealthSite::new("s1", &c, label, http())
                .err()
                .unwrap()
                .to_string()
        };
        assert!(err(SiteConfig::default(), "host").contains("connectors.health.sites.s1.url"));
        let with_url = |c: SiteConfig| SiteConfig {
            url: "http://mimir/prometheus".into(),
            ..c
        };
        let e = err(
            with_url(SiteConfig {
                selector: r#"{site="x"}"#.into(),
                ..Default::default()
            }),
            "host",
        );
        assert!(e.contains("sites.s1.selector"), "{e}");
        let e = err(
            with_url(SiteConfig {
                tenant: "t".into(),
                tenant_header: "bad header".into(),
                ..Default::default()
            }),
            "host",
        );
        assert!(e.contains("sites.s1.tenant_header"), "{e}");
        let e = err(with_url(SiteConfig::default()), "9host");
        assert!(e.contains("host_label"), "{e}");
        let ok = HealthSite::new(
            "s1",
            &with_url(SiteConfig {
                tenant: "fleet".into(),
                selector: r#"site="lon1""#.into(),
                ..Default::default()
            }),
            "host",
            http(),
        )
        .unwrap();
        assert_eq!(
            ok.query_url.as_str(),
            "http://mimir/prometheus/api/v1/query"
        );
        assert_eq!(ok.tenant.as_ref().unwrap().0.as_str(), "x-scope-orgid");
    }
}
