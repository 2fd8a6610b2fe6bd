//! connector-netbox: reads `GET /api/dcim/devices/` for each configured
//! site and publishes the NetBox mirror (inventory status, provisioning
//! tags) keyed by device name. NetBox is the inventory source of truth: a
//! device the hub does not know is created through the hub's
//! `create_devices` command (a `CONFLICT` item means it exists already).

mod config;
pub use config::Config;
pub(crate) mod create;
pub(crate) mod mapping;

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use fleet_connector::paginate::{join, required_base_url};
use fleet_connector::{HttpClient, PollContext, Scope, Section, SourceError, Target};
use fleet_domain::Source;
use fleet_proto::v1;
use fleet_runtime::config::Credential;
use fleet_runtime::{Common, Shutdown};
use reqwest::Url;

use crate::mapping::{map_devices, Warning};

pub(crate) const OUTAGE_REASON: &str = "NetboxUnreachable";

use fleet_netbox::AuthScheme;

/// The client of one NetBox for one site.
pub(crate) struct NetboxSite {
    site: String,
    slug: String,
    devices_url: Url,
    page_size: u32,
    max_pages: u32,
    token: Credential,
    scheme: AuthScheme,
    create_devices: bool,
    /// The pool the devices it creates join (`connectors.netbox.pools`).
    pool: Option<String>,
    /// Created inventory-only when the hub does not know the site.
    inventory_only: bool,
    /// The hub answered that it knows the site.
    site_known: bool,
    /// Warnings and refusals logged when they start and when they end.
    recurring: fleet_connector::Recurring,
    http: HttpClient,
    /// Devices the hub is known to have (created, or CONFLICT).
    known: HashSet<String>,
}

impl NetboxSite {
    async fn read(&self) -> Result<Vec<mapping::Device>, SourceError> {
        let auth = self
            .token
            .resolve("connectors.netbox.token")
            .map_err(|e| SourceError::Config(e.to_string()))?
            .map(|t| self.scheme.header(t.expose()));
        let mut first = self.devices_url.clone();
        first
            .query_pairs_mut()
            .append_pair("site", &self.slug)
            .append_pair("limit", &self.page_size.to_string());
        fleet_netbox::list(&self.http, first, self.max_pages, auth.as_deref()).await
    }
}

impl Target for NetboxSite {
    fn scope(&self) -> Scope<'_> {
        Scope::new(Source::Netbox, &self.site, OUTAGE_REASON)
    }

    fn vanished(&self, key: &v1::DeviceKey, at: DateTime<Utc>) -> Option<v1::ConditionSnapshot> {
        Some(mapping::vanished(key, at))
    }

    async fn poll(
        &mut self,
        ctx: PollContext<'_>,
    ) -> Result<Vec<v1::ConditionSnapshot>, SourceError> {
        let devices = self.read().await?;
        let mut mapped = map_devices(&self.site, &self.slug, &devices, ctx.observed_at);
        if let Some(pool) = &self.pool {
            for c in &mut mapped.creates {
                c.pool_id = pool.clone();
            }
        }
        for w in &mapped.warnings {
            ctx.metrics.warning("netbox", w.kind());
            // Logged when it starts and when it ends, not on every poll.
            if !self.recurring.starts(format!("{w:?}")) {
                continue;
            }
            match w {
                Warning::Unnamed { netbox_id } => {
                    tracing::warn!(site = %self.site, netbox_id, "netbox device has no name; skipped")
                }
                Warning::OtherSite { netbox_id, site } => {
                    tracing::warn!(site = %self.site, netbox_id, other_site = %site, "netbox returned a device of another site; skipped")
                }
                Warning::UnknownStatus { name, value } => {
                    tracing::warn!(site = %self.site, device = %name, status = %value, "netbox status outside the inventory vocabulary; stored as unknown")
                }
            }
        }
        if self.create_devices && !self.site_known {
            self.site_known = create::ensure_site(
                ctx.bus,
                ctx.metrics,
                &self.site,
                &self.slug,
                self.inventory_only,
            )
            .await;
        }
        if self.create_devices && self.site_known {
            let wanted: Vec<v1::CreateDevice> = mapped
                .creates
                .into_iter()
                .filter(|c| !self.known.contains(&c.name))
                .collect();
            let created = create::ensure_devices(ctx.bus, ctx.metrics, &self.site, wanted).await;
            self.known.extend(created.known);
            for (name, code, message) in created.rejected {
                if self
                    .recurring
                    .starts(format!("rejected {name} {}", code.as_str_name()))
                {
                    tracing::warn!(site = %self.site, device = %name, code = code.as_str_name(), %message,
                        "hub refused to create device (logged again when it is created or gone)");
                }
            }
        }
        for (what, polls) in self.recurring.end_round() {
            tracing::info!(site = %self.site, %what, polls, "netbox warning ended");
        }
        Ok(mapped.snapshots)
    }
}

/// Builds one target per configured site; fails with the configuration key
/// at fault.
pub(crate) fn targets(c: &Config, http: &HttpClient) -> anyhow::Result<Vec<NetboxSite>> {
    let base = required_base_url("connectors.netbox.url", &c.url)?;
    let scheme = AuthScheme::parse(&c.auth_scheme)
        .map_err(|e| anyhow::anyhow!("configuration key connectors.netbox.auth_scheme: {e}"))?;
    if !c.token.is_configured() {
        tracing::warn!("connectors.netbox.token is not set: reading NetBox anonymously");
    } else {
        // Fail at start, not at the first poll, when the token cannot be read.
        c.token.resolve("connectors.netbox.token")?;
    }
    anyhow::ensure!(
        !c.sites.is_empty(),
        "configuration key connectors.netbox.sites: no site is configured (fleet site id = NetBox site slug)"
    );
    if let Some(s) = c
        .inventory_only_sites
        .iter()
        .find(|s| !c.sites.contains_key(*s))
    {
        anyhow::bail!(
            "configuration key connectors.netbox.inventory_only_sites: {s} is not one of connectors.netbox.sites"
        );
    }
    Ok(c.sites
        .iter()
        .map(|(site, slug)| NetboxSite {
            site: site.clone(),
            slug: if slug.trim().is_empty() {
                site.clone()
            } else {
                slug.trim().to_string()
            },
            devices_url: join(&base, "api/dcim/devices/"),
            page_size: c.page_size.clamp(1, 1000),
            max_pages: c.poll.max_pages,
            token: c.token.clone(),
            scheme,
            create_devices: c.create_devices,
            pool: c.pools.get(site).cloned(),
            inventory_only: c.inventory_only_sites.contains(site),
            site_known: false,
            recurring: Default::default(),
            http: http.clone(),
            known: HashSet::new(),
        })
        .collect())
}

/// Runs the connector with its section (`connectors.netbox`) until shutdown.
pub async fn run(common: Common, c: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let section = Section::new(Source::Netbox, "netbox", &c.listen, &c.poll);
    fleet_connector::serve(&common, section, shutdown, |h| targets(&c, h)).await
}

#[cfg(test)]
mod config_tests {
    use super::*;

    #[test]
    fn configuration_errors_name_their_key() {
        let http = HttpClient::with_defaults("netbox").unwrap();
        let err = |c: Config| targets(&c, &http).err().unwrap().to_string();
        assert!(err(Config::default()).contains("connectors.netbox.url"));
        let base = Config {
            url: "http://netbox:8000".into(),
            ..Default::default()
        };
        assert!(err(base.clone()).contains("connectors.netbox.sites"));
        let e = err(Config {
            auth_scheme: "basic".into(),
            ..base.clone()
        });
        assert!(e.contains("connectors.netbox.auth_scheme"), "{e}");
        let sites = [("s1".to_string(), String::new())].into_iter().collect();
        let t = targets(
            &Config {
                sites,
                ..base.clone()
            },
            &http,
        )
        .unwrap();
        assert_eq!(t[0].slug, "s1", "an empty slug is the site id");
        assert_eq!(
            t[0].devices_url.as_str(),
            "http://netbox:8000/api/dcim/devices/"
        );
    }
}
