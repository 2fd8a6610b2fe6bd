//! The `connectors.slurm` section: this connector's own configuration.

use std::collections::BTreeMap;

use fleet_connector::PollConfig;
use fleet_runtime::Credential;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: String,
    /// Fleet site id -> that site's slurmrestd.
    pub sites: BTreeMap<String, SiteConfig>,
    pub poll: PollConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9422".into(),
            sites: BTreeMap::new(),
            poll: PollConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SiteConfig {
    /// slurmrestd, e.g. `http://slurm-head:6820`.
    pub url: String,
    /// `v0.0.38`, `v0.0.40`, ...; empty: detected from `/openapi/v3`, else
    /// by probing `/slurm/v0.0.<n>/ping`.
    pub api_version: String,
    /// `X-SLURM-USER-NAME`; empty sends no JWT headers.
    pub user_name: String,
    /// `X-SLURM-USER-TOKEN` (a JWT).
    pub token: Credential,
}
