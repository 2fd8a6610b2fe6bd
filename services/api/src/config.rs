//! The `api` section.

use std::time::Duration;

use fleet_runtime::ConfigError;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of the API (and its `/healthz`, `/readyz`, `/metrics`).
    pub listen: String,
    /// How long a mutation waits for the hub's (or the placer's, or the
    /// workflow service's) reply before answering 503.
    #[serde(with = "humantime_serde")]
    pub hub_timeout: Duration,
    /// How long a read waits for a database connection before answering 503.
    #[serde(with = "humantime_serde")]
    pub db_timeout: Duration,
    /// Page size when a request names none, and the largest one accepted.
    pub default_page_size: i64,
    pub max_page_size: i64,
    /// How long a verified token (and its scopes) is cached in memory: a
    /// revocation bites within this.
    #[serde(with = "humantime_serde")]
    pub token_cache_ttl: Duration,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Sites with an acceptance policy: their GPU compute goes through
    /// single- and multi-node tests in the standup pipeline, their CPU
    /// bare-metal through single-node acceptance.
    pub standup_policy_sites: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9402".into(),
            hub_timeout: Duration::from_secs(5),
            db_timeout: Duration::from_secs(3),
            default_page_size: 100,
            max_page_size: 1000,
            token_cache_ttl: Duration::from_secs(10),
            max_body_bytes: 1 << 20,
            standup_policy_sites: Vec::new(),
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.default_page_size < 1 || self.default_page_size > self.max_page_size {
            return Err(ConfigError::invalid(
                "api.default_page_size",
                "must be between 1 and api.max_page_size",
            ));
        }
        Ok(())
    }
}
