//! The `gateway` section.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_runtime::ConfigError;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// This replica's id in connectivity observations; empty: `gw-<host>`.
    pub gateway_id: String,
    /// The heartbeat interval the gateway asks agents for (whole seconds
    /// on the wire).
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// How often live sessions are checked against PostgreSQL for an
    /// identity-generation bump (revoke, re-join, delete).
    #[serde(with = "humantime_serde")]
    pub identity_check_interval: Duration,
    /// How often the gateway re-publishes its `GpuCountMismatch` snapshot
    /// for each live session (keeps it fresh at the hub).
    #[serde(with = "humantime_serde")]
    pub snapshot_resync_interval: Duration,
    /// Deadline of a relayed command when the caller names none, and the
    /// longest one accepted.
    #[serde(with = "humantime_serde")]
    pub command_deadline: Duration,
    #[serde(with = "humantime_serde")]
    pub max_command_deadline: Duration,
    /// Requests served at once.
    pub concurrency: usize,
    /// How long the gateway waits for the hub's answer to a command (a
    /// join, an adoption); an agent's request gets twice this.
    #[serde(with = "humantime_serde")]
    pub hub_timeout: Duration,
    /// Joins and session opens that arrive together are done in bulk (a
    /// join batch is one `join_devices` hub command and one statement for
    /// the credentials; an open batch one statement): up to this many
    /// (at most 1,000) ...
    pub batch_max: usize,
    /// ... gathered for at most this long after the first ...
    #[serde(with = "humantime_serde")]
    pub batch_linger: Duration,
    /// ... with at most this many batches of each kind out at once (while
    /// all are, the next batch gathers).
    pub batch_in_flight: usize,
    /// Platform secrets handed to platform and tenant-owned agents at
    /// session open (break-glass keys, ...); never to tenant-controlled ones.
    pub platform_secrets: BTreeMap<String, String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9411".into(),
            gateway_id: String::new(),
            heartbeat_interval: Duration::from_secs(10),
            identity_check_interval: Duration::from_secs(2),
            snapshot_resync_interval: Duration::from_secs(60),
            command_deadline: Duration::from_secs(30),
            max_command_deadline: Duration::from_secs(600),
            concurrency: 256,
            hub_timeout: Duration::from_secs(10),
            batch_max: 200,
            batch_linger: Duration::from_millis(5),
            batch_in_flight: 4,
            platform_secrets: BTreeMap::new(),
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.heartbeat_interval < Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                "gateway.heartbeat_interval",
                "must be at least 1s (agents are told whole seconds)",
            ));
        }
        if self.command_deadline > self.max_command_deadline {
            return Err(ConfigError::invalid(
                "gateway.command_deadline",
                "must not exceed gateway.max_command_deadline",
            ));
        }
        if !(1..=1000).contains(&self.batch_max) {
            return Err(ConfigError::invalid(
                "gateway.batch_max",
                "must be 1 to 1000 (the most the hub's join_devices takes)",
            ));
        }
        if self.batch_in_flight == 0 {
            return Err(ConfigError::invalid(
                "gateway.batch_in_flight",
                "must be at least 1",
            ));
        }
        if self.batch_linger > Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                "gateway.batch_linger",
                "must be at most 1s (a join or an open waits this long for company)",
            ));
        }
        Ok(())
    }
}
