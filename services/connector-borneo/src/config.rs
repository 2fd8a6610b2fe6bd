//! The `connectors.borneo` section: this connector's own configuration.

use std::collections::BTreeMap;

use fleet_connector::PollConfig;
use fleet_runtime::Credential;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: String,
    /// The partner custody API, e.g. `https://borneo.example.com` (the
    /// connector reads `<url>/v1/partners/<partner>/machines`).
    pub url: String,
    /// The OAuth2 token endpoint (client-credentials grant).
    pub token_url: String,
    pub client_id: String,
    pub client_secret: Credential,
    /// The `scope` of the token request; empty sends none.
    pub scope: String,
    /// `page_size` of one page of machines.
    pub page_size: u32,
    /// Fleet site id -> Borneo partner id.
    pub sites: BTreeMap<String, String>,
    pub poll: PollConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9424".into(),
            url: String::new(),
            token_url: String::new(),
            client_id: String::new(),
            client_secret: Credential::default(),
            scope: String::new(),
            page_size: 500,
            sites: BTreeMap::new(),
            poll: PollConfig::default(),
        }
    }
}
