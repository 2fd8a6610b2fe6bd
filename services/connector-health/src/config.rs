//! The `connectors.health` section: this connector's own configuration.

use std::collections::BTreeMap;

use fleet_connector::PollConfig;
use fleet_runtime::Credential;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: String,
    /// The label naming the host (the fleet device name) on every health
    /// series.
    pub host_label: String,
    /// Fleet site id -> that site's Prometheus query API.
    pub sites: BTreeMap<String, SiteConfig>,
    pub poll: PollConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9423".into(),
            host_label: "host".into(),
            sites: BTreeMap::new(),
            poll: PollConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SiteConfig {
    /// The base of the query API: Prometheus (`http://prometheus:9090`) or
    /// Mimir (`https://mimir.example.com/prometheus`); the connector reads
    /// `<url>/api/v1/query`.
    pub url: String,
    /// The Mimir tenant, sent in `tenant_header`; empty sends no header.
    pub tenant: String,
    pub tenant_header: String,
    /// Label matchers added to every query so it selects this site's hosts
    /// only, e.g. `site="lon1"`; empty: every series.
    pub selector: String,
    /// `Authorization: Bearer <token>`, when the query API wants one.
    pub token: Credential,
}

impl Default for SiteConfig {
    fn default() -> Self {
        SiteConfig {
            url: String::new(),
            tenant: String::new(),
            tenant_header: "X-Scope-OrgID".into(),
            selector: String::new(),
            token: Credential::default(),
        }
    }
}
