//! connector-fabric: live front-end and back-end port VRF membership from
//! the switches' NVUE REST API (Cumulus Linux), mapped to devices through
//! NetBox cables, and NVLink partition membership from NVIDIA NMX-M. It
//! publishes, per device, one snapshot per source: `frontend-fabric`
//! (`FrontendPortsObservedInCustomerVrf`), `backend-fabric`
//! (`BackendPortsObservedInMaintenanceVrf`) and `nvlink-fabric`
//! (`NvLinkGpusObservedInRepairPartition`). Observations only: the durable
//! latches are written by workflows after verified flips, never from here.
//! The contracts read are documented in [`fleet_fabric`]'s `netbox`,
//! `nvue` and `nmx`, the clients this connector reads through (the
//! workflow service writes through the same ones).

mod config;
pub use config::{Config, SiteConfig};
pub(crate) mod mapping;
pub use fleet_fabric::nvue;
pub(crate) use fleet_fabric::{netbox, nmx};

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use fleet_connector::paginate::base_url;
use fleet_connector::PollConfig;
use fleet_connector::{
    ConnectorMetrics, HttpClient, PollContext, Runtime, Scope, SourceError, Target,
};
use fleet_domain::Source;
use fleet_fabric::netbox::{AuthScheme, Netbox};
use fleet_fabric::nmx::Nmx;
use fleet_fabric::nvue::Nvue;
use fleet_proto::v1;
use fleet_runtime::{Common, Shutdown};
use reqwest::Url;
use serde_json::{Map, Value};

use crate::mapping::{
    map_nvlink, map_plane, nvlink_vanished, plane_vanished, NameMatcher, Plane, PortRead,
    NETBOX_UNREACHABLE, NMX_UNREACHABLE,
};
use crate::netbox::PortLink;

/// One plane of one site.
pub(crate) struct PlaneSite {
    plane: Plane,
    site: String,
    netbox: Netbox,
    /// The NetBox site slug.
    slug: String,
    /// Switch (NetBox name) -> `<nvue>/nvue_v1/interface?rev=...`.
    switches: BTreeMap<String, Url>,
    nvue: Nvue,
    matcher: NameMatcher,
    /// Far ends that are not devices (spines).
    excluded: NameMatcher,
}

/// One site's NMX-M.
pub(crate) struct NvlinkSite {
    site: String,
    nmx: Nmx,
    repair_partition: String,
}

/// Every target a fabric site has: a plane per switch set, NVLink with an
/// NMX-M.
pub(crate) enum FabricTarget {
    Plane(Box<PlaneSite>),
    Nvlink(NvlinkSite),
}

impl PlaneSite {
    fn switch_names(&self) -> BTreeSet<String> {
        self.switches.keys().cloned().collect()
    }

    async fn read_links(&self) -> Result<Vec<PortLink>, SourceError> {
        self.netbox
            .switch_links(&self.slug, &self.switch_names(), |d| {
                self.excluded.matches(d)
            })
            .await
    }

    async fn read_switch(&self, url: &Url) -> Result<Map<String, Value>, SourceError> {
        self.nvue.read(url).await
    }

    async fn poll_plane(
        &mut self,
        ctx: &PollContext<'_>,
    ) -> Result<Vec<v1::ConditionSnapshot>, SourceError> {
        let links = self.read_links().await?;
        let source = self.plane.source().as_str();
        let needed: BTreeSet<&str> = links.iter().map(|l| l.switch.as_str()).collect();
        let mut reads: BTreeMap<&str, Result<Map<String, Value>, String>> = BTreeMap::new();
        for (name, url) in &self.switches {
            if !needed.contains(name.as_str()) {
                continue;
            }
            let r = self.read_switch(url).await.map_err(|e| {
                tracing::error!(source, site = %self.site, switch = %name, kind = e.kind(), error = %e, "switch cannot be read; its ports are Unknown");
                ctx.metrics.error(source, &self.site, &format!("switch_{}", e.kind()));
                fleet_connector::error::truncate(&e.to_string(), 200)
            });
            reads.insert(name, r);
        }
        let read = |l: &PortLink| match reads.get(l.switch.as_str()) {
            Some(Ok(ifaces)) => match nvue::port_vrf(ifaces, &l.port) {
                Ok(v) => PortRead::Vrf(v),
                Err(e) => PortRead::Unresolved(e.to_string()),
            },
            Some(Err(e)) => PortRead::SwitchUnreachable(e.clone()),
            None => PortRead::SwitchUnreachable("not read".into()),
        };
        let out = map_plane(
            self.plane,
            &self.site,
            &links,
            read,
            &self.matcher,
            ctx.observed_at,
        );
        let unresolved = out
            .iter()
            .filter(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.reason == mapping::PORT_VRF_UNRESOLVED)
            })
            .count();
        if unresolved > 0 {
            tracing::warn!(source, site = %self.site, devices = unresolved, "switch ports whose VRF could not be resolved");
            ctx.metrics.warning(source, "port_vrf_unresolved");
        }
        Ok(out)
    }
}

impl NvlinkSite {
    async fn poll_nvlink(
        &mut self,
        ctx: &PollContext<'_>,
    ) -> Result<Vec<v1::ConditionSnapshot>, SourceError> {
        let (partitions, gpus, nodes) = self.nmx.lists().await?;
        let read = nmx::membership(&partitions, &gpus, &nodes, &self.repair_partition);
        let source = Source::NvlinkFabric.as_str();
        if read.repair_partition_id.is_none() {
            tracing::warn!(site = %self.site, partition = %self.repair_partition, "NMX-M lists no partition of the configured repair_partition name; no GPU reads as in it");
            ctx.metrics.warning(source, "repair_partition_absent");
        }
        if read.unnamed > 0 {
            tracing::warn!(site = %self.site, count = read.unnamed, "NMX-M compute nodes without a host name; skipped");
            ctx.metrics.warning(source, "unnamed_node");
        }
        Ok(map_nvlink(
            &self.site,
            &read,
            &self.repair_partition,
            ctx.observed_at,
        ))
    }
}

impl Target for FabricTarget {
    fn scope(&self) -> Scope<'_> {
        match self {
            FabricTarget::Plane(p) => Scope::new(p.plane.source(), &p.site, NETBOX_UNREACHABLE),
            FabricTarget::Nvlink(n) => Scope::new(Source::NvlinkFabric, &n.site, NMX_UNREACHABLE),
        }
    }

    fn vanished(&self, key: &v1::DeviceKey, at: DateTime<Utc>) -> Option<v1::ConditionSnapshot> {
        Some(match self {
            FabricTarget::Plane(p) => plane_vanished(p.plane, key, at),
            FabricTarget::Nvlink(_) => nvlink_vanished(key, at),
        })
    }

    async fn poll(
        &mut self,
        ctx: PollContext<'_>,
    ) -> Result<Vec<v1::ConditionSnapshot>, SourceError> {
        match self {
            FabricTarget::Plane(p) => p.poll_plane(&ctx).await,
            FabricTarget::Nvlink(n) => n.poll_nvlink(&ctx).await,
        }
    }
}

fn client(
    poll: &PollConfig,
    metrics: &ConnectorMetrics,
    source: Source,
) -> anyhow::Result<HttpClient> {
    Ok(HttpClient::new(poll, metrics.clone(), source.as_str())?)
}

/// The targets of one site, checking its configuration.
pub(crate) fn site_targets(
    site: &str,
    s: &SiteConfig,
    c: &Config,
    metrics: &ConnectorMetrics,
) -> anyhow::Result<Vec<FabricTarget>> {
    let key = format!("connectors.fabric.sites.{site}");
    let mut out = Vec::new();
    let revision = c.nvue_revision.trim();
    for (plane, switches) in [
        (Plane::Frontend, &s.frontend_switches),
        (Plane::Backend, &s.backend_switches),
    ] {
        if switches.is_empty() {
            continue;
        }
        let field = match plane {
            Plane::Frontend => "frontend_switches",
            Plane::Backend => "backend_switches",
        };
        let matcher = match plane {
            Plane::Frontend => NameMatcher::non_empty(&s.customer_vrfs).map_err(|e| {
                anyhow::anyhow!(
                    "configuration key {key}.customer_vrfs (required with {field}): {e}"
                )
            })?,
            Plane::Backend => NameMatcher::non_empty(std::slice::from_ref(&s.maintenance_vrf))
                .map_err(|e| {
                    anyhow::anyhow!(
                        "configuration key {key}.maintenance_vrf (required with {field}): {e}"
                    )
                })?,
        };
        anyhow::ensure!(
            !c.netbox_url.trim().is_empty(),
            "configuration key connectors.fabric.netbox_url is required with {key}.{field}"
        );
        anyhow::ensure!(
            !s.netbox_site.trim().is_empty(),
            "configuration key {key}.netbox_site is required with {key}.{field}"
        );
        anyhow::ensure!(
            !c.nvue_username.trim().is_empty() && c.nvue_password.is_configured(),
            "configuration keys connectors.fabric.nvue_username and nvue_password are required with {key}.{field}"
        );
        anyhow::ensure!(
            matches!(revision, "operational" | "applied"),
            "configuration key connectors.fabric.nvue_revision {revision:?} is not operational or applied"
        );
        c.nvue_password.resolve("connectors.fabric.nvue_password")?;
        let scheme = AuthScheme::parse(&c.netbox_auth_scheme).map_err(|e| {
            anyhow::anyhow!("configuration key connectors.fabric.netbox_auth_scheme: {e}")
        })?;
        if c.netbox_token.is_configured() {
            c.netbox_token.resolve("connectors.fabric.netbox_token")?;
        }
        let netbox = base_url("connectors.fabric.netbox_url", &c.netbox_url)?;
        let http = client(&c.poll, metrics, plane.source())?;
        let mut urls = BTreeMap::new();
        for (name, url) in switches {
            let base = base_url(&format!("{key}.{field}.{name}"), url)?;
            urls.insert(
                name.trim().to_string(),
                nvue::interfaces_url(&base, revision),
            );
        }
        let mut netbox = Netbox::new(
            http.clone(),
            &netbox,
            c.netbox_token.clone(),
            "connectors.fabric.netbox_token",
            scheme,
        );
        netbox.page_size = c.netbox_page_size.clamp(1, 1000);
        netbox.max_pages = c.poll.max_pages;
        out.push(FabricTarget::Plane(Box::new(PlaneSite {
            plane,
            site: site.to_string(),
            netbox,
            slug: s.netbox_site.trim().to_string(),
            switches: urls,
            nvue: Nvue {
                http,
                username: c.nvue_username.trim().to_string(),
                password: c.nvue_password.clone(),
                password_key: "connectors.fabric.nvue_password".into(),
            },
            matcher,
            excluded: NameMatcher::new(&s.exclude_peers)
                .map_err(|e| anyhow::anyhow!("configuration key {key}.exclude_peers: {e}"))?,
        })));
    }
    if !s.nmx_url.trim().is_empty() {
        anyhow::ensure!(
            !s.repair_partition.trim().is_empty(),
            "configuration key {key}.repair_partition is required with {key}.nmx_url"
        );
        anyhow::ensure!(
            s.nmx_username.trim().is_empty() != s.nmx_password.is_configured(),
            "configuration keys {key}.nmx_username and {key}.nmx_password go together"
        );
        for (field, cred) in [
            ("nmx_password", &s.nmx_password),
            ("nmx_token", &s.nmx_token),
        ] {
            if cred.is_configured() {
                cred.resolve(&format!("{key}.{field}"))?;
            }
        }
        out.push(FabricTarget::Nvlink(NvlinkSite {
            site: site.to_string(),
            nmx: Nmx {
                http: client(&c.poll, metrics, Source::NvlinkFabric)?,
                base: base_url(&format!("{key}.nmx_url"), &s.nmx_url)?,
                username: s.nmx_username.trim().to_string(),
                password: s.nmx_password.clone(),
                token: s.nmx_token.clone(),
                key: key.clone(),
            },
            repair_partition: s.repair_partition.trim().to_string(),
        }));
    }
    anyhow::ensure!(
        !out.is_empty(),
        "configuration key {key}: configure frontend_switches, backend_switches or nmx_url"
    );
    Ok(out)
}

pub(crate) fn targets(c: &Config, metrics: &ConnectorMetrics) -> anyhow::Result<Vec<FabricTarget>> {
    let per_site = fleet_connector::per_site("fabric", &c.sites, |(site, s)| {
        site_targets(site, s, c, metrics)
    })?;
    Ok(per_site.into_iter().flatten().collect())
}

/// Runs the connector with its section (`connectors.fabric`) until shutdown.
pub async fn run(common: Common, c: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let c = &c;
    let rt = Runtime::start_named(
        &common,
        Source::FrontendFabric,
        "fabric",
        &c.listen,
        shutdown.clone(),
    )
    .await
    .context("starting connector-fabric")?;
    let targets = targets(c, &rt.metrics)?;
    rt.run(targets, &c.poll, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_runtime::config::{Credential, Secret};

    fn secret(s: &str) -> Credential {
        Credential {
            value: Secret::new(s),
            ..Default::default()
        }
    }

    fn top() -> Config {
        Config {
            netbox_url: "https://netbox.example.com".into(),
            nvue_username: "cumulus".into(),
            nvue_password: secret("pw"),
            ..Default::default()
        }
    }

    fn err(s: SiteConfig, c: &Config) -> String {
        site_targets("s1", &s, c, &ConnectorMetrics::new())
            .err()
            .unwrap()
            .to_string()
    }

    #[test]
    fn configuration_errors_name_their_key() {
        let c = top();
        assert!(err(SiteConfig::default(), &c).contains("configure frontend_switches"));
        let fe = SiteConfig {
            netbox_site: "dc1".into(),
            frontend_switches: [("leaf01".to_string(), "https://leaf01:8765".to_string())].into(),
            ..Default::default()
        };
        let e = err(fe.clone(), &c);
        assert!(e.contains("sites.s1.customer_vrfs"), "{e}");
        let fe = SiteConfig {
            customer_vrfs: vec!["cust-*".into()],
            ..fe
        };
        let e = err(
            fe.clone(),
            &Config {
                nvue_password: Credential::default(),
                ..top()
            },
        );
        assert!(e.contains("nvue_password"), "{e}");
        let e = err(
            SiteConfig {
                netbox_site: String::new(),
                ..fe.clone()
            },
            &c,
        );
        assert!(e.contains("sites.s1.netbox_site"), "{e}");
        let e = err(
            SiteConfig {
                backend_switches: [("be01".to_string(), "https://be01:8765".to_string())].into(),
                ..fe.clone()
            },
            &c,
        );
        assert!(e.contains("sites.s1.maintenance_vrf"), "{e}");
        let e = err(
            SiteConfig {
                nmx_url: "https://nmx".into(),
                ..fe.clone()
            },
            &c,
        );
        assert!(e.contains("sites.s1.repair_partition"), "{e}");
        let ok = site_targets(
            "s1",
            &SiteConfig {
                backend_switches: [("be01".to_string(), "https://be01:8765/".to_string())].into(),
                maintenance_vrf: "maint".into(),
                nmx_url: "https://nmx".into(),
                repair_partition: "repair".into(),
                nmx_token: secret("tok"),
                ..fe
            },
            &c,
            &ConnectorMetrics::new(),
        )
        .unwrap();
        let sources: Vec<Source> = ok.iter().map(|t| t.scope().source).collect();
        assert_eq!(
            sources,
            vec![
                Source::FrontendFabric,
                Source::BackendFabric,
                Source::NvlinkFabric
            ]
        );
        match &ok[1] {
            FabricTarget::Plane(p) => assert_eq!(
                p.switches["be01"].as_str(),
                "https://be01:8765/nvue_v1/interface?rev=operational"
            ),
            _ => panic!("the back-end plane"),
        }
    }
}
