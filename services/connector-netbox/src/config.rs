//! The `connectors.netbox` section: this connector's own configuration.

use std::collections::BTreeMap;

use fleet_connector::PollConfig;
use fleet_runtime::Credential;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// NetBox base URL, e.g. `https://netbox.example.com` (the connector
    /// reads `<url>/api/dcim/devices/`).
    pub url: String,
    /// API token, v1 (40 hex characters) or v2 (`nbt_<key>.<secret>`).
    pub token: Credential,
    /// `auto` (v2 tokens starting `nbt_` as `Bearer`, others as `Token`),
    /// `token` or `bearer`.
    pub auth_scheme: String,
    /// Fleet site id -> NetBox site slug (`?site=<slug>`).
    pub sites: BTreeMap<String, String>,
    /// Fleet site id -> the pool the devices it creates there join (none:
    /// no pool until an operator assigns one).
    pub pools: BTreeMap<String, String>,
    /// `limit` of one page.
    pub page_size: u32,
    /// Create devices the hub does not know through `create_device`, and
    /// each configured site the hub does not know through `create_site`.
    pub create_devices: bool,
    /// Fleet site ids created inventory-only (seed 002: "The NetBox agent
    /// sets the site flag from deployment config"). A site that exists
    /// keeps its flag: it is immutable after create.
    pub inventory_only_sites: Vec<String>,
    pub poll: PollConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9420".into(),
            url: String::new(),
            token: Credential::default(),
            auth_scheme: "auto".into(),
            sites: BTreeMap::new(),
            pools: BTreeMap::new(),
            page_size: 100,
            create_devices: true,
            inventory_only_sites: Vec::new(),
            poll: PollConfig::default(),
        }
    }
}
