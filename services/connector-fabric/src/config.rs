//! The `connectors.fabric` section: this connector's own configuration.

use std::collections::BTreeMap;

use fleet_connector::PollConfig;
use fleet_runtime::Credential;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: String,
    /// NetBox, for the device-to-port map (its cables).
    pub netbox_url: String,
    pub netbox_token: Credential,
    /// `auto`, `token` or `bearer` (as `connectors.netbox.auth_scheme`).
    pub netbox_auth_scheme: String,
    pub netbox_page_size: u32,
    /// HTTP basic credentials of the switches' NVUE REST API.
    pub nvue_username: String,
    pub nvue_password: Credential,
    /// The NVUE revision read: `operational` (what the switch runs) or
    /// `applied`.
    pub nvue_revision: String,
    /// Fleet site id -> that site's fabric.
    pub sites: BTreeMap<String, SiteConfig>,
    pub poll: PollConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9425".into(),
            netbox_url: String::new(),
            netbox_token: Credential::default(),
            netbox_auth_scheme: "auto".into(),
            netbox_page_size: 1000,
            nvue_username: String::new(),
            nvue_password: Credential::default(),
            nvue_revision: "operational".into(),
            sites: BTreeMap::new(),
            poll: PollConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SiteConfig {
    /// The NetBox site slug whose cables map switch ports to devices.
    pub netbox_site: String,
    /// Front-end switch (its NetBox device name) -> its NVUE API base URL
    /// (`https://leaf01:8765`).
    pub frontend_switches: BTreeMap<String, String>,
    /// RoCE back-end switch -> its NVUE API base URL.
    pub backend_switches: BTreeMap<String, String>,
    /// The VRFs that are customer VRFs: exact names, or prefixes ending in
    /// `*` (`cust-*`). Required with `frontend_switches`.
    pub customer_vrfs: Vec<String>,
    /// The back-end maintenance VRF. Required with `backend_switches`.
    pub maintenance_vrf: String,
    /// Cable peers that are not devices (spines, border leaves): names or
    /// `prefix*` patterns.
    pub exclude_peers: Vec<String>,
    /// NVIDIA NMX-M (`https://nmx-m.example.com`); empty: no NVLink
    /// observations at this site.
    pub nmx_url: String,
    /// NMX-M HTTP basic credentials, or a bearer token.
    pub nmx_username: String,
    pub nmx_password: Credential,
    pub nmx_token: Credential,
    /// The name of the NVLink repair partition. Required with `nmx_url`.
    pub repair_partition: String,
}
