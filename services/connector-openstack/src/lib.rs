//! connector-openstack: for each configured site, a Keystone v3 password
//! token (cached, refreshed before expiry and on a 401), Ironic
//! `GET /v1/nodes?detail=true` paginated by marker, and customer-ready from
//! one Placement query (`required=<trait>`) or, at standalone-Ironic sites,
//! from the node's `traits`. Publishes the six openstack conditions and the
//! Ironic mirror per node.

mod config;
pub use config::Config;
pub(crate) mod mapping;

use std::collections::HashSet;

use crate::mapping::{
    map_node, Context, KeyBy, NodesPage, Providers, Readiness, ResourceProviders,
    IRONIC_UNREACHABLE, NO_LONGER_OBSERVED,
};
use chrono::{DateTime, Utc};
use fleet_connector::paginate::{join, Pages};
use fleet_connector::snapshot::all_unknown;
use fleet_connector::{HttpClient, PollContext, Scope, Section, SourceError, Target};
use fleet_domain::Source;
use fleet_openstack::ironic::nodes_url;
use fleet_openstack::{Session, HEADER_API_VERSION, HEADER_IRONIC_VERSION};
use fleet_proto::v1;
use fleet_runtime::{Common, Shutdown};

/// What one poll read from Placement.
struct Placement {
    ready: HashSet<String>,
    providers: HashSet<String>,
}

/// One site's OpenStack.
pub(crate) struct OpenstackSite {
    site: String,
    config: fleet_openstack::SiteConfig,
    key_by: KeyBy,
    ironic_version: String,
    placement_version: String,
    customer_ready_trait: String,
    page_size: u32,
    max_pages: u32,
    session: Session,
}

impl OpenstackSite {
    pub fn new(
        site: &str,
        c: &fleet_openstack::SiteConfig,
        top: &Config,
        http: HttpClient,
    ) -> anyhow::Result<Self> {
        let key = format!("connectors.openstack.sites.{site}");
        let session = Session::new(site, &key, c, http)?;
        anyhow::ensure!(
            !c.placement_enabled || session.has_placement(),
            "configuration key {key}.placement_url is required when placement_enabled (or {key}.auth_url, or placement_enabled = false at a standalone-Ironic site)"
        );
        if c.maintenance_project_id.trim().is_empty() {
            tracing::warn!(
                site,
                "{key}.maintenance_project_id is not set: InMaintenancePool is Unknown"
            );
        }
        let key_by = KeyBy::parse(&top.key_by)
            .map_err(|e| anyhow::anyhow!("configuration key connectors.openstack.key_by: {e}"))?;
        anyhow::ensure!(
            !top.customer_ready_trait.trim().is_empty(),
            "configuration key connectors.openstack.customer_ready_trait is required"
        );
        Ok(OpenstackSite {
            site: site.to_string(),
            config: c.clone(),
            key_by,
            ironic_version: top.ironic_api_version.trim().to_string(),
            placement_version: format!("placement {}", top.placement_api_version.trim()),
            customer_ready_trait: top.customer_ready_trait.trim().to_string(),
            page_size: top.page_size.clamp(1, 1000),
            max_pages: top.poll.max_pages,
            session,
        })
    }

    async fn read_nodes(&mut self) -> Result<Vec<mapping::Node>, SourceError> {
        let ironic = self.session.endpoint("baremetal").await?;
        let mut url = nodes_url(&ironic);
        url.query_pairs_mut()
            .append_pair("detail", "true")
            .append_pair("limit", &self.page_size.to_string());
        let headers = [(HEADER_IRONIC_VERSION, self.ironic_version.clone())];
        let mut pages = Pages::new(&url, self.max_pages);
        let mut nodes = Vec::new();
        loop {
            let page: NodesPage = self.session.get_json(&url, &headers).await?;
            nodes.extend(page.nodes);
            match pages.next(page.next.as_deref())? {
                Some(next) => url = next,
                None => return Ok(nodes),
            }
        }
    }

    /// The resource providers carrying the customer-ready trait (one
    /// query), and every resource provider (one more: the nodes' Placement
    /// bindings).
    async fn read_placement(&mut self) -> Result<Placement, SourceError> {
        let placement = self.session.endpoint("placement").await?;
        let all = join(&placement, "resource_providers");
        let mut ready = all.clone();
        ready
            .query_pairs_mut()
            .append_pair("required", &self.customer_ready_trait);
        let headers = [(HEADER_API_VERSION, self.placement_version.clone())];
        let rp: ResourceProviders = self.session.get_json(&ready, &headers).await?;
        let listed: ResourceProviders = self.session.get_json(&all, &headers).await?;
        Ok(Placement {
            ready: rp.ids(),
            providers: listed.ids(),
        })
    }
}

impl Target for OpenstackSite {
    fn scope(&self) -> Scope<'_> {
        Scope::new(Source::Openstack, &self.site, IRONIC_UNREACHABLE)
    }

    fn vanished(&self, key: &v1::DeviceKey, at: DateTime<Utc>) -> Option<v1::ConditionSnapshot> {
        all_unknown(
            Source::Openstack,
            key.clone(),
            at,
            NO_LONGER_OBSERVED,
            "ironic no longer lists the node",
            None,
        )
    }

    async fn poll(
        &mut self,
        ctx: PollContext<'_>,
    ) -> Result<Vec<v1::ConditionSnapshot>, SourceError> {
        let nodes = self.read_nodes().await?;
        let ready = if self.config.placement_enabled {
            Some(self.read_placement().await.map_err(|e| {
                // Ironic was read: only CustomerReady is unknown.
                tracing::error!(site = %self.site, kind = e.kind(), error = %e, "placement cannot be read; CustomerReady is Unknown");
                ctx.metrics.error("openstack", &self.site, &format!("placement_{}", e.kind()));
                fleet_connector::error::truncate(&e.to_string(), 300)
            }))
        } else {
            None
        };
        let (readiness, providers) = match &ready {
            None => (Readiness::NodeTraits, Providers::NotUsed),
            Some(Ok(p)) => (
                Readiness::Placement(&p.ready),
                Providers::Listed(&p.providers),
            ),
            Some(Err(msg)) => (Readiness::Unreadable(msg), Providers::Unreadable(msg)),
        };
        let c = Context {
            site: &self.site,
            key_by: self.key_by,
            customer_ready_trait: &self.customer_ready_trait,
            maintenance_project_id: self.config.maintenance_project_id.trim(),
            readiness,
            providers,
            observed_at: ctx.observed_at,
        };
        let mut out = Vec::with_capacity(nodes.len());
        for n in &nodes {
            let (snap, fell_back) = map_node(n, &c);
            if fell_back {
                tracing::warn!(site = %self.site, uuid = %n.uuid, "ironic node has no name; keyed by its uuid");
                ctx.metrics.warning("openstack", "unnamed_node");
            }
            out.push(snap);
        }
        Ok(out)
    }
}

pub(crate) fn targets(c: &Config, http: &HttpClient) -> anyhow::Result<Vec<OpenstackSite>> {
    fleet_connector::per_site("openstack", &c.sites, |(site, sc)| {
        OpenstackSite::new(site, sc, c, http.clone())
    })
}

/// Runs the connector with its section (`connectors.openstack`) until shutdown.
pub async fn run(common: Common, c: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let section = Section::new(Source::Openstack, "openstack", &c.listen, &c.poll);
    fleet_connector::serve(&common, section, shutdown, |h| targets(&c, h)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_errors_name_their_key() {
        let metrics = fleet_connector::ConnectorMetrics::new();
        let top = Config::default();
        let http = HttpClient::new(&top.poll, metrics, "openstack").unwrap();
        let err = |c: fleet_openstack::SiteConfig| {
            OpenstackSite::new("s1", &c, &top, http.clone())
                .err()
                .unwrap()
                .to_string()
        };
        assert!(err(fleet_openstack::SiteConfig::default())
            .contains("connectors.openstack.sites.s1.ironic_url"));
        let e = err(fleet_openstack::SiteConfig {
            ironic_url: "http://i:6385".into(),
            ..Default::default()
        });
        assert!(e.contains("placement_url"), "{e}");
        let e = err(fleet_openstack::SiteConfig {
            auth_url: "http://k:5000/v3".into(),
            username: "u".into(),
            ..Default::default()
        });
        assert!(e.contains("sites.s1.project_name"), "{e}");
        assert!(OpenstackSite::new(
            "s1",
            &fleet_openstack::SiteConfig {
                ironic_url: "http://i:6385".into(),
                placement_enabled: false,
                ..Default::default()
            },
            &top,
            http.clone()
        )
        .is_ok());
    }
}
