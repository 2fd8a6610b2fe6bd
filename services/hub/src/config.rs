//! The `hub` section.

use std::time::Duration;

use fleet_runtime::{Common, ConfigError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// This replica's name in the partition lease table; empty: the host
    /// name and process id (`<hostname>-<pid>`). Two live replicas must not
    /// share a name; a replica restarted under its name (a StatefulSet pod)
    /// re-claims its leases at once instead of waiting for them to expire.
    pub replica: String,
    /// A replica that has not heartbeated for this long loses its partition
    /// leases to the others; replicas heartbeat every third of it, which
    /// renews every lease they hold. A replica that dies loses its
    /// partitions within about `lease_ttl` plus a third of it.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// Messages applied in one transaction at most.
    pub batch_size: usize,
    /// Concurrent appliers; each owns the partitions `p mod lanes`.
    pub lanes: usize,
    /// How long a batch stays open after its first message was fetched.
    #[serde(with = "humantime_serde")]
    pub linger: Duration,
    /// Redelivery of a message not acknowledged for this long.
    #[serde(with = "humantime_serde")]
    pub ack_wait: Duration,
    /// Deliveries after which a message that fails to apply is dead-lettered.
    pub max_deliver: u64,
    /// The source-silence and liveness sweep.
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
    /// Outbox rows per relay round.
    pub outbox_batch: i64,
    /// A command handler waits twice this for its transaction.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// Unresolved observation keys not seen for this long are removed.
    #[serde(with = "humantime_serde")]
    pub unresolved_retention: Duration,
    /// At most this many unresolved keys are kept (the oldest go first).
    pub unresolved_max_rows: i64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9401".into(),
            replica: String::new(),
            lease_ttl: Duration::from_secs(9),
            batch_size: 256,
            lanes: 4,
            linger: Duration::from_millis(20),
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            sweep_interval: Duration::from_secs(5),
            outbox_batch: 1000,
            command_timeout: Duration::from_secs(5),
            unresolved_retention: Duration::from_secs(7 * 24 * 3600),
            unresolved_max_rows: 100_000,
        }
    }
}

impl Config {
    /// Keys whose environment value is a comma-separated list.
    pub const LISTS: &'static [&'static str] = &[];

    /// The name this replica leases partitions under.
    pub fn replica_name(&self) -> String {
        if !self.replica.is_empty() {
            return self.replica.clone();
        }
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
            })
            .unwrap_or_else(|| "hub".into());
        format!("{host}-{}", std::process::id())
    }

    pub fn validate(&self, _common: &Common) -> Result<(), ConfigError> {
        if self.lease_ttl < Duration::from_secs(1) {
            return Err(ConfigError::invalid("hub.lease_ttl", "must be at least 1s"));
        }
        if self.replica.len() > 200 {
            return Err(ConfigError::invalid(
                "hub.replica",
                "at most 200 characters",
            ));
        }
        if self.batch_size == 0 {
            return Err(ConfigError::invalid("hub.batch_size", "must be at least 1"));
        }
        if self.lanes == 0 {
            return Err(ConfigError::invalid("hub.lanes", "must be at least 1"));
        }
        if self.ack_wait < Duration::from_secs(1) {
            return Err(ConfigError::invalid("hub.ack_wait", "must be at least 1s"));
        }
        Ok(())
    }
}
