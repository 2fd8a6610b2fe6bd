//! The `connectors.slurm` section: this connector's own configuration.

use std::collections::BTreeMap;

use fleet_connector::PollConfig;
pub use fleet_slurm::SiteConfig;
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
