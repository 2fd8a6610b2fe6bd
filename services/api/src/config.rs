//! The `api` section.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_domain::acceptance::GateScope;
use fleet_domain::standup::Stage;

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
    /// The standup pipeline's acceptance policies.
    pub standup: StandupConfig,
}

/// `api.standup`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StandupConfig {
    /// Per site: its acceptance policy. A site without one runs GPU compute
    /// and CPU bare-metal `enrolment -> quarantine -> release`.
    pub sites: BTreeMap<String, AcceptancePolicy>,
}

/// `api.standup.sites.<site>`: the site's acceptance policy. Its GPU
/// compute goes through single- and multi-node tests, its CPU bare-metal
/// through single-node acceptance; a burn-in stage advances once its job
/// succeeded and every gate of the stage passes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AcceptancePolicy {
    pub gates: Vec<GateConfig>,
    /// Per pool of the site: gates that replace the site's for the pool's
    /// devices.
    pub pools: BTreeMap<String, PoolPolicy>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolPolicy {
    pub gates: Vec<GateConfig>,
}

/// One acceptance gate ("site conditions").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateConfig {
    /// Its name in the matrix (`node_health`, `nvlink_domain`, `pod`).
    pub name: String,
    /// `single_node_test` or `multi_node_test`.
    pub stage: Stage,
    /// `device` (its health), `rack` (every device of its rack passed the
    /// stage: an NVLink-domain gate) or `pool` (every device of its pool: a
    /// pod gate).
    pub scope: GateScope,
}

impl AcceptancePolicy {
    /// The gates of a device in `pool`.
    pub fn gates_for(&self, pool: Option<&str>) -> &[GateConfig] {
        pool.and_then(|p| self.pools.get(p))
            .map_or(&self.gates, |p| &p.gates)
    }
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
            standup: StandupConfig::default(),
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
        for (site, policy) in &self.standup.sites {
            let lists = std::iter::once((format!("api.standup.sites.{site}.gates"), &policy.gates))
                .chain(policy.pools.iter().map(|(pool, p)| {
                    (
                        format!("api.standup.sites.{site}.pools.{pool}.gates"),
                        &p.gates,
                    )
                }));
            for (key, gates) in lists {
                let mut seen = std::collections::BTreeSet::new();
                for g in gates {
                    if !g.stage.gated() {
                        return Err(ConfigError::invalid(
                            &key,
                            format!(
                                "gate {:?} is on {}: only single_node_test and multi_node_test have acceptance gates",
                                g.name, g.stage
                            ),
                        ));
                    }
                    if g.name.trim().is_empty() || !seen.insert((g.stage, g.name.as_str())) {
                        return Err(ConfigError::invalid(
                            &key,
                            format!(
                                "gate names must be non-empty and unique per stage ({:?})",
                                g.name
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
