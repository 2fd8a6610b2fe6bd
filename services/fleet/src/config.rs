//! The whole configuration of the `fleet` binary: the shared sections
//! (`fleet_runtime::Common`) beside every service's own section, each owned
//! by its crate with its defaults and validation. Loaded once (defaults,
//! then `--config fleet.toml`, then `FLEET__SECTION__KEY`), checked, and
//! handed to a service as its `Common` and its own `Config`.

use std::collections::HashMap;
use std::path::Path;

use fleet_runtime::config::{
    self, ConfigError, DatabaseConfig, FreshnessConfig, Layout, LogConfig, NatsConfig,
    ShutdownConfig,
};
use fleet_runtime::Common;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    pub log: LogConfig,
    pub shutdown: ShutdownConfig,
    pub freshness: FreshnessConfig,
    pub hub: fleet_hub::Config,
    pub api: fleet_api::Config,
    pub placer: fleet_placer::Config,
    pub gateway: fleet_gateway::Config,
    pub radar: fleet_radar::Config,
    pub workflow: fleet_workflow::Config,
    pub connectors: Connectors,
}

/// `connectors.<name>`: one section per connector service.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Connectors {
    pub netbox: fleet_connector_netbox::Config,
    pub openstack: fleet_connector_openstack::Config,
    pub slurm: fleet_connector_slurm::Config,
    pub health: fleet_connector_health::Config,
    pub borneo: fleet_connector_borneo::Config,
    pub fabric: fleet_connector_fabric::Config,
}

/// Keys that moved between sections: refused at start with where they went.
const MOVED: &[(&str, &str)] = &[
    ("hub.default_ttl_secs", "freshness.default_ttl"),
    ("hub.ttl_secs", "freshness.ttl"),
    ("hub.unreachable_after_secs", "freshness.unreachable_after"),
    ("hub.lost_after_secs", "freshness.lost_after"),
    (
        "freshness.ttl_secs",
        "freshness.ttl (durations: FLEET__FRESHNESS__TTL__SLURM=90s)",
    ),
    (
        "hub.partitions",
        "hub.replica and hub.lease_ttl (replicas share the partitions through leases, docs/scaling.md)",
    ),
];

impl FleetConfig {
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, None)
    }

    /// `load` with the environment given as a map instead of the process's
    /// (`FLEET__NATS__USER` -> value), so a test can load exactly what
    /// compose or Helm hands a service.
    pub fn load_from(
        file: Option<&Path>,
        env: Option<HashMap<String, String>>,
    ) -> Result<Self, ConfigError> {
        let c: FleetConfig = config::load(
            file,
            env,
            Layout {
                lists: fleet_hub::Config::LISTS,
                moved: MOVED,
            },
        )?;
        c.validate()?;
        Ok(c)
    }

    /// Every section's own checks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let common = self.common();
        common.validate()?;
        self.hub.validate(&common)?;
        self.api.validate()?;
        self.gateway.validate()?;
        self.workflow.validate()?;
        Ok(())
    }

    /// The sections every service shares.
    pub fn common(&self) -> Common {
        Common {
            database: self.database.clone(),
            nats: self.nats.clone(),
            log: self.log.clone(),
            shutdown: self.shutdown.clone(),
            freshness: self.freshness.clone(),
        }
    }

    /// The listen address of every service, by its key.
    pub fn listen_addresses(&self) -> Vec<(&'static str, &str)> {
        let n = &self.connectors;
        vec![
            ("hub.listen", &self.hub.listen),
            ("api.listen", &self.api.listen),
            ("placer.listen", &self.placer.listen),
            ("gateway.listen", &self.gateway.listen),
            ("radar.listen", &self.radar.listen),
            ("workflow.listen", &self.workflow.listen),
            ("connectors.netbox.listen", &n.netbox.listen),
            ("connectors.openstack.listen", &n.openstack.listen),
            ("connectors.slurm.listen", &n.slurm.listen),
            ("connectors.health.listen", &n.health.listen),
            ("connectors.borneo.listen", &n.borneo.listen),
            ("connectors.fabric.listen", &n.fabric.listen),
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The configuration from `file` (if any) and these environment
    /// variables only.
    fn load(file: Option<&Path>, env: &[(&str, &str)]) -> Result<FleetConfig, ConfigError> {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        FleetConfig::load_from(file, Some(env.collect()))
    }

    #[test]
    fn default_listen_addresses_never_collide() {
        let c = FleetConfig::default();
        let all = c.listen_addresses();
        let unique: std::collections::BTreeSet<_> = all.iter().map(|(_, a)| *a).collect();
        assert_eq!(unique.len(), all.len(), "{all:?}");
    }

    #[test]
    fn defaults_then_environment() {
        let c = load(
            None,
            &[
                ("FLEET__HUB__BATCH_SIZE", "64"),
                ("FLEET__HUB__LEASE_TTL", "3s"),
                ("FLEET__HUB__LINGER", "5ms"),
                ("FLEET__CONNECTORS__SLURM__POLL__RESYNC_INTERVAL", "30s"),
            ],
        )
        .unwrap();
        assert_eq!(c.hub.batch_size, 64);
        assert_eq!(c.hub.lease_ttl, Duration::from_secs(3));
        assert_eq!(c.hub.linger, Duration::from_millis(5));
        assert_eq!(
            c.connectors.slurm.poll.resync_interval,
            Duration::from_secs(30)
        );
        assert_eq!(c.nats.url, "nats://127.0.0.1:4222");
        let err = load(None, &[("FLEET__HUB__LEASE_TTL", "100ms")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("hub.lease_ttl"), "{err}");
        // The static assignment is gone: a deployment still setting it is
        // refused at start, with where to go.
        let err = load(None, &[("FLEET__HUB__PARTITIONS", "1,3")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("hub.partitions") && err.contains("hub.replica"),
            "{err}"
        );
    }

    #[test]
    fn old_keys_are_refused_with_their_new_name() {
        let err = |k: &str, v: &str| load(None, &[(k, v)]).unwrap_err().to_string();
        let e = err("FLEET__HUB__TTL_SECS__SLURM", "90");
        assert!(
            e.contains("hub.ttl_secs") && e.contains("freshness.ttl"),
            "{e}"
        );
        let e = err("FLEET__HUB__LINGER_MS", "20");
        assert!(e.contains("`hub.linger`") && e.contains("duration"), "{e}");
        let e = err("FLEET__CONNECTORS__SLURM__POLL__RESYNC_INTERVAL_SECS", "30");
        assert!(e.contains("`connectors.slurm.poll.resync_interval`"), "{e}");
        let e = err("FLEET__PLACER__NO_SUCH_KEY", "1");
        assert!(e.contains("placer.no_such_key"), "{e}");
    }

    #[test]
    fn a_file_fills_sites_over_the_defaults() {
        let dir = std::env::temp_dir().join(format!("fleet-config-{}.toml", std::process::id()));
        std::fs::write(
            &dir,
            r#"
            [connectors.netbox]
            url = "http://netbox:8000"
            sites = { s1 = "dc1" }
            [connectors.openstack.sites.s1]
            ironic_url = "http://ironic:6385"
            placement_enabled = false
            [connectors.slurm.sites.s1]
            url = "http://slurm:6820"
            token = { file = "/run/secrets/jwt" }
            [connectors.slurm.poll]
            resync_interval = "30s"
            [connectors.health.sites.s1]
            url = "https://mimir.example.com/prometheus"
            tenant = "fleet"
            [connectors.borneo]
            url = "https://borneo.example.com"
            client_secret = { env = "BORNEO_SECRET" }
            sites = { s1 = "partner-1" }
            [connectors.fabric.sites.s1]
            netbox_site = "dc1"
            frontend_switches = { leaf01 = "https://leaf01:8765" }
            customer_vrfs = ["cust-*"]
            [workflow.sites.s1]
            image_source = "http://images/ubuntu.qcow2"
            [workflow.sites.s1.openstack]
            ironic_url = "http://ironic:6385"
        "#,
        )
        .unwrap();
        let c = load(Some(&dir), &[]).unwrap();
        std::fs::remove_file(&dir).unwrap();
        let n = &c.connectors;
        assert_eq!(n.netbox.sites["s1"], "dc1");
        assert_eq!(n.netbox.page_size, 100);
        let os = &n.openstack.sites["s1"];
        assert!(!os.placement_enabled);
        assert_eq!(os.user_domain_name, "Default");
        assert_eq!(n.slurm.sites["s1"].token.file, "/run/secrets/jwt");
        assert_eq!(n.slurm.poll.resync_interval, Duration::from_secs(30));
        assert_eq!(n.slurm.poll.max_retries, 3);
        assert_eq!(n.health.sites["s1"].tenant_header, "X-Scope-OrgID");
        assert_eq!(n.borneo.client_secret.env, "BORNEO_SECRET");
        let f = &n.fabric.sites["s1"];
        assert_eq!(f.frontend_switches["leaf01"], "https://leaf01:8765");
        assert_eq!(f.customer_vrfs, vec!["cust-*"]);
        assert_eq!(n.fabric.nvue_revision, "operational");
        let w = &c.workflow.sites["s1"];
        assert_eq!(w.openstack.ironic_url, "http://ironic:6385");
        assert!(w.openstack.placement_enabled);
    }

    #[test]
    fn a_misspelt_site_key_is_refused() {
        let dir =
            std::env::temp_dir().join(format!("fleet-config-bad-{}.toml", std::process::id()));
        std::fs::write(&dir, "[connectors.slurm.sites.s1]\nurll = \"http://x\"\n").unwrap();
        let err = load(Some(&dir), &[]).unwrap_err().to_string();
        std::fs::remove_file(&dir).unwrap();
        assert!(err.contains("urll"), "{err}");
    }
}
