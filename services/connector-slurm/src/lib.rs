//! connector-slurm: reads slurmrestd `GET /slurm/v0.0.<n>/nodes` for each
//! configured site and publishes `SlurmRegistered`, `SlurmNodeHealthy` and
//! the normalised SLURM state tokens, keyed by node name within the site.
//! A node seen before that SLURM no longer lists is `NoLongerObserved`
//! (mirror cleared); an unreadable slurmrestd is `SchedulerUnreachable`
//! (mirror kept).

mod config;
pub use config::{Config, SiteConfig};
pub(crate) mod mapping;

use chrono::{DateTime, Utc};
use fleet_connector::{HttpClient, PollContext, Scope, Section, SourceError, Target};
use fleet_domain::Source;
use fleet_proto::v1::{self, condition_snapshot::Mirror};
use fleet_runtime::{Common, Shutdown};
use fleet_slurm::Slurmrestd;

use crate::mapping::{map_nodes, SCHEDULER_UNREACHABLE};

/// One site's slurmrestd, read through `fleet_slurm`.
pub(crate) struct SlurmSite {
    site: String,
    slurm: Slurmrestd,
}

impl SlurmSite {
    pub fn new(site: &str, c: &SiteConfig, http: HttpClient) -> anyhow::Result<Self> {
        let key = format!("connectors.slurm.sites.{site}");
        Ok(SlurmSite {
            site: site.to_string(),
            slurm: Slurmrestd::new(site, &key, c, http)?,
        })
    }
}

impl Target for SlurmSite {
    fn scope(&self) -> Scope<'_> {
        Scope::new(Source::Slurm, &self.site, SCHEDULER_UNREACHABLE)
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
        let nodes = self.slurm.nodes().await?;
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
    use fleet_runtime::config::{Credential, Secret};

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
        assert_eq!(ok.slurm.known_version(), Some(fleet_slurm::ApiVersion(38)));
        assert!(ok.slurm.configured());
    }
}
