//! Configuration with the `config` crate: built-in defaults, then an
//! optional file (`--config fleet.toml`), then the environment
//! (`FLEET__HUB__BATCH_SIZE`, `FLEET__DATABASE__URL`, `FLEET__NATS__URL`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use crate::connectors::ConnectorsConfig;
pub use crate::consumers::{
    GatewayConfig, PlacerConfig, RadarConfig, WorkflowConfig, WorkflowSiteConfig,
};
pub use fleet_bus::{NatsConfig, NatsTls};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetConfig {
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    pub hub: HubConfig,
    pub log: LogConfig,
    /// The placer (`fleet placer`); see `consumers.rs`.
    #[serde(default)]
    pub placer: PlacerConfig,
    /// The node agent gateway (`fleet gateway`).
    #[serde(default)]
    pub gateway: GatewayConfig,
    /// The Radar projection (`fleet radar`).
    #[serde(default)]
    pub radar: RadarConfig,
    /// The workflow service (`fleet workflow`): jobs.
    #[serde(default)]
    pub workflow: WorkflowConfig,
    /// Connector services (`fleet connector <name>`); see `connectors.rs`.
    #[serde(default)]
    pub connectors: ConnectorsConfig,
    /// The operator HTTP API (`fleet api`).
    #[serde(default)]
    pub api: ApiConfig,
    /// How every service stops.
    #[serde(default)]
    pub shutdown: ShutdownConfig,
    /// When an observation or a session goes stale: the hub derives with
    /// it, the API marks rows stale with it, the gateway and the sweeper
    /// read liveness from it. One section, so they never disagree.
    #[serde(default)]
    pub freshness: FreshnessConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct FreshnessConfig {
    /// Freshness TTL when a source has none of its own.
    pub default_ttl_secs: u64,
    /// Per-source TTL (`FLEET__FRESHNESS__TTL_SECS__SLURM=90`).
    pub ttl_secs: BTreeMap<String, u64>,
    /// A device whose node agent sent no heartbeat for this long is
    /// `unreachable`.
    pub unreachable_after_secs: u64,
    /// ... and for this long, `lost`.
    pub lost_after_secs: u64,
}

impl Default for FreshnessConfig {
    fn default() -> Self {
        FreshnessConfig {
            default_ttl_secs: 180,
            ttl_secs: BTreeMap::new(),
            unreachable_after_secs: 60,
            lost_after_secs: 600,
        }
    }
}

/// Keys that moved, with where they went: a configuration still setting
/// one is refused at start instead of being ignored.
const MOVED: &[(&str, &str)] = &[
    ("hub.default_ttl_secs", "freshness.default_ttl_secs"),
    ("hub.ttl_secs", "freshness.ttl_secs"),
    (
        "hub.unreachable_after_secs",
        "freshness.unreachable_after_secs",
    ),
    ("hub.lost_after_secs", "freshness.lost_after_secs"),
];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ShutdownConfig {
    /// Seconds a SIGTERM gives a service's tasks to finish what they hold
    /// (a batch, an answer, the outbox flush) before the rest is aborted
    /// (and redelivered).
    pub grace_secs: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig { grace_secs: 20 }
    }
}

impl ShutdownConfig {
    pub fn grace(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.grace_secs)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ApiConfig {
    /// Address of the API (and its `/healthz`, `/readyz`, `/metrics`).
    pub listen: String,
    /// How long a mutation waits for the hub's reply before answering 503.
    pub hub_timeout_ms: u64,
    /// How long a read waits for a database connection before answering 503.
    pub db_timeout_ms: u64,
    /// Page size when a request names none, and the largest one accepted.
    pub default_page_size: i64,
    pub max_page_size: i64,
    /// Seconds a verified token (and its scopes) is cached in memory.
    pub token_cache_secs: u64,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: "127.0.0.1:9402".into(),
            hub_timeout_ms: 5000,
            db_timeout_ms: 3000,
            default_page_size: 100,
            max_page_size: 1000,
            token_cache_secs: 10,
            max_body_bytes: 1 << 20,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DatabaseConfig {
    pub url: String,
    pub max_connections: u32,
    /// Each service works as its own PostgreSQL role (`fleet_hub`,
    /// `fleet_api`, ...; `migrations/0007_roles.sql`), which the URL's user
    /// must be a member of. `false` works as the URL's user itself.
    #[serde(default = "yes")]
    pub set_role: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HubConfig {
    /// Address of `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// The partitions this replica consumes; empty means all of them.
    #[serde(default)]
    pub partitions: Vec<u32>,
    /// Messages applied in one transaction at most.
    pub batch_size: usize,
    /// Concurrent appliers; each owns the partitions `p mod lanes`.
    pub lanes: usize,
    /// How long a lane waits after a first message to fill its batch.
    pub linger_ms: u64,
    pub ack_wait_secs: u64,
    /// Deliveries after which a message that fails to apply is dead-lettered.
    pub max_deliver: u64,
    pub sweep_interval_ms: u64,
    pub outbox_batch: i64,
    /// Seconds a command handler waits for its transaction.
    pub command_timeout_secs: u64,
    /// Unresolved observation keys not seen for this long are removed.
    #[serde(default = "default_unresolved_retention")]
    pub unresolved_retention_secs: u64,
    /// At most this many unresolved keys are kept (the oldest go first).
    #[serde(default = "default_unresolved_max_rows")]
    pub unresolved_max_rows: i64,
}

fn default_unresolved_retention() -> u64 {
    7 * 24 * 3600
}

fn default_unresolved_max_rows() -> i64 {
    100_000
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: String,
    pub filter: String,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            database: DatabaseConfig {
                url: "postgres://postgres@127.0.0.1:5432/fleet".into(),
                max_connections: 16,
                set_role: true,
            },
            nats: NatsConfig::default(),
            hub: HubConfig {
                listen: "127.0.0.1:9401".into(),
                partitions: vec![],
                batch_size: 256,
                lanes: 4,
                linger_ms: 20,
                ack_wait_secs: 30,
                max_deliver: 5,
                sweep_interval_ms: 5000,
                outbox_batch: 1000,
                command_timeout_secs: 5,
                unresolved_retention_secs: default_unresolved_retention(),
                unresolved_max_rows: default_unresolved_max_rows(),
            },
            log: LogConfig {
                format: "text".into(),
                filter: "info".into(),
            },
            placer: PlacerConfig::default(),
            gateway: GatewayConfig::default(),
            radar: RadarConfig::default(),
            workflow: WorkflowConfig::default(),
            connectors: ConnectorsConfig::default(),
            api: ApiConfig::default(),
            shutdown: ShutdownConfig::default(),
            freshness: FreshnessConfig::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("configuration key {key}: {message}")]
    Invalid { key: &'static str, message: String },
}

impl FleetConfig {
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, None)
    }

    /// `load` with the environment given as a map instead of the process's
    /// (`FLEET__NATS__USER` -> value), so a test can load exactly what
    /// compose or Helm hands a service.
    pub fn load_from(
        file: Option<&Path>,
        env: Option<std::collections::HashMap<String, String>>,
    ) -> Result<Self, ConfigError> {
        let mut b = config::Config::builder()
            .add_source(config::Config::try_from(&FleetConfig::default())?);
        if let Some(f) = file {
            b = b.add_source(config::File::from(f).required(true));
        }
        b = b.add_source(
            config::Environment::with_prefix("FLEET")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .list_separator(",")
                .with_list_parse_key("hub.partitions")
                .source(env),
        );
        let built = b.build()?;
        for (old, new) in MOVED {
            if built.get::<config::Value>(old).is_ok() {
                return Err(ConfigError::Invalid {
                    key: old,
                    message: format!("has moved to {new}"),
                });
            }
        }
        let mut c: FleetConfig = built.try_deserialize()?;
        // One spelling everywhere: a source's `-` may be written `_`, since
        // an environment variable name cannot hold `-`
        // (`FLEET__FRESHNESS__TTL_SECS__HEALTH_STATUS=90` is `health-status`).
        c.freshness.ttl_secs = std::mem::take(&mut c.freshness.ttl_secs)
            .into_iter()
            .map(|(source, secs)| (source.replace('_', "-"), secs))
            .collect();
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let req = |key: &'static str, v: &str| {
            if v.trim().is_empty() {
                Err(ConfigError::Invalid {
                    key,
                    message: "is required".into(),
                })
            } else {
                Ok(())
            }
        };
        req("database.url", &self.database.url)?;
        self.nats.validate().map_err(|e| ConfigError::Invalid {
            key: e.key,
            message: e.message,
        })?;
        if let Some(p) = self
            .hub
            .partitions
            .iter()
            .find(|p| **p >= self.nats.partitions)
        {
            return Err(ConfigError::Invalid {
                key: "hub.partitions",
                message: format!(
                    "partition {p} is not below nats.partitions = {}",
                    self.nats.partitions
                ),
            });
        }
        if self.hub.batch_size == 0 {
            return Err(ConfigError::Invalid {
                key: "hub.batch_size",
                message: "must be at least 1".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_source_with_a_hyphen_can_be_set_from_the_environment() {
        let env: std::collections::HashMap<String, String> = [
            ("FLEET__FRESHNESS__TTL_SECS__HEALTH_STATUS", "90"),
            ("FLEET__FRESHNESS__TTL_SECS__SLURM", "30"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let c = super::FleetConfig::load_from(None, Some(env)).unwrap();
        assert_eq!(c.freshness.ttl_secs.get("health-status"), Some(&90));
        assert_eq!(c.freshness.ttl_secs.get("slurm"), Some(&30));
        assert!(!c.freshness.ttl_secs.contains_key("health_status"));
    }

    #[test]
    fn default_listen_addresses_never_collide() {
        let c = FleetConfig::default();
        let n = &c.connectors;
        let all = [
            &c.hub.listen,
            &c.api.listen,
            &c.placer.listen,
            &c.gateway.listen,
            &c.radar.listen,
            &n.netbox.listen,
            &n.openstack.listen,
            &n.slurm.listen,
            &n.health.listen,
            &n.borneo.listen,
            &n.fabric.listen,
        ];
        let unique: std::collections::BTreeSet<_> = all.iter().collect();
        assert_eq!(unique.len(), all.len(), "{all:?}");
    }

    use super::*;

    #[test]
    fn defaults_then_environment() {
        // One test touches the environment, so it cannot race another.
        std::env::set_var("FLEET__HUB__BATCH_SIZE", "64");
        std::env::set_var("FLEET__HUB__PARTITIONS", "1,3");
        let c = FleetConfig::load(None).unwrap();
        assert_eq!(c.hub.batch_size, 64);
        assert_eq!(c.hub.partitions, vec![1, 3]);
        assert_eq!(c.nats.url, "nats://127.0.0.1:4222");
        std::env::set_var("FLEET__HUB__PARTITIONS", "99");
        let err = FleetConfig::load(None).unwrap_err().to_string();
        assert!(err.contains("hub.partitions"), "{err}");
        std::env::remove_var("FLEET__HUB__BATCH_SIZE");
        std::env::remove_var("FLEET__HUB__PARTITIONS");
        // The freshness keys moved out of `hub`: the old key is refused
        // with where it went, never silently ignored.
        std::env::set_var("FLEET__HUB__TTL_SECS__SLURM", "90");
        let err = FleetConfig::load(None).unwrap_err().to_string();
        assert!(
            err.contains("hub.ttl_secs") && err.contains("freshness.ttl_secs"),
            "{err}"
        );
        std::env::remove_var("FLEET__HUB__TTL_SECS__SLURM");
        std::env::set_var("FLEET__FRESHNESS__TTL_SECS__SLURM", "90");
        let c = FleetConfig::load(None).unwrap();
        assert_eq!(c.freshness.ttl_secs.get("slurm"), Some(&90));
        std::env::remove_var("FLEET__FRESHNESS__TTL_SECS__SLURM");
    }
}
