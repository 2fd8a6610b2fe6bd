//! connector-fabric: live front-end and back-end port VRF membership from
//! the switches' NVUE REST API (Cumulus Linux), mapped to devices through
//! NetBox cables, and NVLink partition membership from NVIDIA NMX-M. It
//! publishes, per device, one snapshot per source: `frontend-fabric`
//! (`FrontendPortsObservedInCustomerVrf`), `backend-fabric`
//! (`BackendPortsObservedInMaintenanceVrf`) and `nvlink-fabric`
//! (`NvLinkGpusObservedInRepairPartition`). Observations only: the durable
//! latches are written by workflows after verified flips, never from here.
//! The contracts read are documented in [`netbox`], [`nvue`] and [`nmx`].

mod config;
pub use config::{Config, SiteConfig};
pub(crate) mod mapping;
pub(crate) mod netbox;
pub(crate) mod nmx;
pub mod nvue;

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use fleet_connector::paginate::{base_url, collect_pages, join};
use fleet_connector::PollConfig;
use fleet_connector::{ConnectorMetrics, HttpClient, PollContext, Runtime, SourceError, Target};
use fleet_domain::Source;
use fleet_proto::v1;
use fleet_runtime::config::Credential;
use fleet_runtime::{Common, Shutdown};
use reqwest::{RequestBuilder, Url};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::mapping::{
    map_nvlink, map_plane, nvlink_vanished, plane_vanished, NameMatcher, Plane, PortRead,
    NETBOX_UNREACHABLE, NMX_UNREACHABLE,
};
use crate::netbox::{port_links, InterfacePage, PortLink};

/// `Authorization` for a NetBox token: `Bearer` for v2 (`nbt_`) tokens or
/// when configured, `Token` otherwise.
pub(crate) fn netbox_auth(scheme: &str, token: &str) -> Result<String, String> {
    let bearer = match scheme.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => token.starts_with("nbt_"),
        "token" => false,
        "bearer" => true,
        other => return Err(format!("{other:?} is not auto, token or bearer")),
    };
    Ok(if bearer {
        format!("Bearer {token}")
    } else {
        format!("Token {token}")
    })
}

/// The NetBox interfaces of one plane's switches.
pub(crate) struct NetboxCables {
    interfaces_url: Url,
    slug: String,
    token: Credential,
    scheme: String,
    page_size: u32,
    max_pages: u32,
}

/// One plane of one site.
pub(crate) struct PlaneSite {
    plane: Plane,
    site: String,
    netbox: NetboxCables,
    /// Switch (NetBox name) -> `<nvue>/nvue_v1/interface?rev=...`.
    switches: BTreeMap<String, Url>,
    nvue_username: String,
    nvue_password: Credential,
    matcher: NameMatcher,
    /// Far ends that are not devices (spines).
    excluded: NameMatcher,
    http: HttpClient,
}

/// One site's NMX-M.
pub(crate) struct NvlinkSite {
    site: String,
    base: Url,
    username: String,
    password: Credential,
    token: Credential,
    repair_partition: String,
    http: HttpClient,
}

/// Every target a fabric site has: a plane per switch set, NVLink with an
/// NMX-M.
pub(crate) enum FabricTarget {
    Plane(PlaneSite),
    Nvlink(NvlinkSite),
}

impl PlaneSite {
    fn switch_names(&self) -> BTreeSet<String> {
        self.switches.keys().cloned().collect()
    }

    async fn read_links(&self) -> Result<Vec<PortLink>, SourceError> {
        let auth = self
            .netbox
            .token
            .resolve("connectors.fabric.netbox_token")
            .map_err(|e| SourceError::Config(e.to_string()))?
            .map(|t| netbox_auth(&self.netbox.scheme, t.expose()))
            .transpose()
            .map_err(|e| {
                SourceError::Config(format!(
                    "configuration key connectors.fabric.netbox_auth_scheme: {e}"
                ))
            })?;
        let mut first = self.netbox.interfaces_url.clone();
        {
            let mut q = first.query_pairs_mut();
            q.append_pair("site", &self.netbox.slug)
                .append_pair("cabled", "true");
            for s in self.switches.keys() {
                q.append_pair("device", s);
            }
            q.append_pair("limit", &self.netbox.page_size.to_string());
        }
        let interfaces = collect_pages(first, self.netbox.max_pages, |url: Url| {
            let auth = auth.clone();
            async move {
                let page: InterfacePage = self
                    .http
                    .json(url.as_str(), |c| {
                        let r = c.get(url.clone()).header("Accept", "application/json");
                        match &auth {
                            Some(a) => r.header("Authorization", a),
                            None => r,
                        }
                    })
                    .await?;
                Ok((page.results, page.next))
            }
        })
        .await?;
        Ok(port_links(&interfaces, &self.switch_names(), |d| {
            self.excluded.matches(d)
        }))
    }

    async fn read_switch(&self, url: &Url) -> Result<Map<String, Value>, SourceError> {
        let password = self
            .nvue_password
            .resolve("connectors.fabric.nvue_password")
            .map_err(|e| SourceError::Config(e.to_string()))?;
        let body: Value = self
            .http
            .json(url.as_str(), |c| {
                c.get(url.clone())
                    .header("Accept", "application/json")
                    .basic_auth(&self.nvue_username, password.as_ref().map(|p| p.expose()))
            })
            .await?;
        nvue::interfaces(body).map_err(|m| SourceError::malformed(url.as_str(), m))
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
    fn auth(
        &self,
        r: RequestBuilder,
        token: Option<&str>,
        password: Option<&str>,
    ) -> RequestBuilder {
        match token {
            Some(t) => r.bearer_auth(t),
            None if !self.username.is_empty() => r.basic_auth(&self.username, password),
            None => r,
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, SourceError> {
        let key = format!("connectors.fabric.sites.{}", self.site);
        let token = self
            .token
            .resolve(&format!("{key}.nmx_token"))
            .map_err(|e| SourceError::Config(e.to_string()))?;
        let password = self
            .password
            .resolve(&format!("{key}.nmx_password"))
            .map_err(|e| SourceError::Config(e.to_string()))?;
        let url = join(&self.base, path);
        self.http
            .json(url.as_str(), |c| {
                self.auth(
                    c.get(url.clone()).header("Accept", "application/json"),
                    token.as_ref().map(|t| t.expose()),
                    password.as_ref().map(|p| p.expose()),
                )
            })
            .await
    }

    async fn poll_nvlink(
        &mut self,
        ctx: &PollContext<'_>,
    ) -> Result<Vec<v1::ConditionSnapshot>, SourceError> {
        let partitions: Vec<nmx::Partition> = self.get("nmx/v1/partitions").await?;
        let gpus: Vec<nmx::Gpu> = self.get("nmx/v1/gpus").await?;
        let nodes: Vec<nmx::ComputeNode> = self.get("nmx/v1/compute-nodes").await?;
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
    fn source(&self) -> Source {
        match self {
            FabricTarget::Plane(p) => p.plane.source(),
            FabricTarget::Nvlink(_) => Source::NvlinkFabric,
        }
    }

    fn site(&self) -> &str {
        match self {
            FabricTarget::Plane(p) => &p.site,
            FabricTarget::Nvlink(n) => &n.site,
        }
    }

    fn outage_reason(&self) -> &'static str {
        match self {
            FabricTarget::Plane(_) => NETBOX_UNREACHABLE,
            FabricTarget::Nvlink(_) => NMX_UNREACHABLE,
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
        netbox_auth(&c.netbox_auth_scheme, "").map_err(|e| {
            anyhow::anyhow!("configuration key connectors.fabric.netbox_auth_scheme: {e}")
        })?;
        if c.netbox_token.is_configured() {
            c.netbox_token.resolve("connectors.fabric.netbox_token")?;
        }
        let netbox = base_url("connectors.fabric.netbox_url", &c.netbox_url)?;
        let mut urls = BTreeMap::new();
        for (name, url) in switches {
            let base = base_url(&format!("{key}.{field}.{name}"), url)?;
            let mut u = join(&base, "nvue_v1/interface");
            u.query_pairs_mut().append_pair("rev", revision);
            urls.insert(name.trim().to_string(), u);
        }
        out.push(FabricTarget::Plane(PlaneSite {
            plane,
            site: site.to_string(),
            netbox: NetboxCables {
                interfaces_url: join(&netbox, "api/dcim/interfaces/"),
                slug: s.netbox_site.trim().to_string(),
                token: c.netbox_token.clone(),
                scheme: c.netbox_auth_scheme.clone(),
                page_size: c.netbox_page_size.clamp(1, 1000),
                max_pages: c.poll.max_pages,
            },
            switches: urls,
            nvue_username: c.nvue_username.trim().to_string(),
            nvue_password: c.nvue_password.clone(),
            matcher,
            excluded: NameMatcher::new(&s.exclude_peers)
                .map_err(|e| anyhow::anyhow!("configuration key {key}.exclude_peers: {e}"))?,
            http: client(&c.poll, metrics, plane.source())?,
        }));
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
            base: base_url(&format!("{key}.nmx_url"), &s.nmx_url)?,
            username: s.nmx_username.trim().to_string(),
            password: s.nmx_password.clone(),
            token: s.nmx_token.clone(),
            repair_partition: s.repair_partition.trim().to_string(),
            http: client(&c.poll, metrics, Source::NvlinkFabric)?,
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
    use fleet_runtime::config::Secret;

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
        let sources: Vec<Source> = ok.iter().map(|t| t.source()).collect();
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

    #[test]
    fn netbox_auth_schemes() {
        assert_eq!(netbox_auth("auto", "nbt_k.s").unwrap(), "Bearer nbt_k.s");
        assert_eq!(netbox_auth("", "0123").unwrap(), "Token 0123");
        assert_eq!(netbox_auth("bearer", "0123").unwrap(), "Bearer 0123");
        assert!(netbox_auth("basic", "x").is_err());
    }
}
