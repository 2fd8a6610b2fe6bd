//! The `connectors.openstack` section: this connector's own configuration.

use std::collections::BTreeMap;

use fleet_connector::PollConfig;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: String,
    /// How snapshots name a device: `name` (the Ironic node name) or
    /// `infrastructure_ref` (the Ironic node UUID).
    pub key_by: String,
    /// `X-OpenStack-Ironic-API-Version`; 1.43 or later (`detail=true`), and
    /// 1.50 or later so `lessee`, `owner` and `traits` are returned.
    pub ironic_api_version: String,
    /// `OpenStack-API-Version: placement <v>`; 1.18 or later (`required=`).
    pub placement_api_version: String,
    /// The trait that marks a node customer-ready.
    pub customer_ready_trait: String,
    /// `limit` of one Ironic page.
    pub page_size: u32,
    /// Fleet site id -> that site's OpenStack.
    pub sites: BTreeMap<String, fleet_openstack::SiteConfig>,
    pub poll: PollConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9421".into(),
            key_by: "name".into(),
            ironic_api_version: "1.80".into(),
            placement_api_version: "1.18".into(),
            customer_ready_trait: "CUSTOM_CUSTOMER_READY".into(),
            page_size: 500,
            sites: BTreeMap::new(),
            poll: PollConfig::default(),
        }
    }
}
