//! The `connectors` section of the configuration: one sub-section per
//! connector service, each with its own poll settings and its sites.
//! Sites are maps keyed by the fleet site id, so a single value can be set
//! from the environment
//! (`FLEET__CONNECTORS__SLURM__SITES__S1__TOKEN__FILE=/run/secrets/jwt`;
//! the environment lowercases keys, so site ids set that way are lowercase).
//! Credentials are never printed: `Debug` and `Serialize` redact them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use fleet_bus::Secret;

/// Where a credential comes from: the value itself (best set through the
/// environment), a file (read on every use, so a rotated token needs no
/// restart), or the name of an environment variable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Credential {
    pub value: Secret,
    pub file: String,
    pub env: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("configuration key {key}.file: cannot read {path}: {source}")]
    File {
        key: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("configuration key {key}.env: environment variable {var} is not set")]
    Env { key: String, var: String },
}

impl Credential {
    pub fn is_configured(&self) -> bool {
        !self.value.is_empty() || !self.file.is_empty() || !self.env.is_empty()
    }

    /// The secret, or `None` when none is configured. `key` names the
    /// configuration key in errors (never the value).
    pub fn resolve(&self, key: &str) -> Result<Option<Secret>, CredentialError> {
        if !self.value.is_empty() {
            return Ok(Some(self.value.clone()));
        }
        if !self.file.is_empty() {
            let s =
                std::fs::read_to_string(&self.file).map_err(|source| CredentialError::File {
                    key: key.to_string(),
                    path: self.file.clone(),
                    source,
                })?;
            return Ok(Some(Secret::new(s.trim())));
        }
        if !self.env.is_empty() {
            let v = std::env::var(&self.env).map_err(|_| CredentialError::Env {
                key: key.to_string(),
                var: self.env.clone(),
            })?;
            return Ok(Some(Secret::new(v.trim())));
        }
        Ok(None)
    }
}

/// The schedule, timeouts and retries of one connector's poll loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PollConfig {
    /// Seconds between two reads of the source, fractions allowed (the
    /// hub's freshness TTL for the source should be about 3x this).
    pub resync_interval_secs: f64,
    /// Fraction of the interval added or removed at random, so connectors
    /// of many sites do not poll in step (0.0 to 0.5).
    pub jitter: f64,
    /// Timeout of one HTTP request, connection included.
    pub request_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// Retries of one request after a connection error, timeout, 429 or
    /// 5xx, with exponential back-off; then the poll fails (an outage).
    pub max_retries: u32,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    /// A paginated read that has not ended after this many pages fails.
    pub max_pages: u32,
    /// Observations published before their PubAcks are awaited.
    pub publish_in_flight: usize,
    /// Fraction of the interval (0 to 0.9) over which a read's resyncs,
    /// snapshots unchanged since the previous read but for `observed_at`,
    /// are spread; new, changed and vanished devices are published at
    /// once. 0 publishes everything at once.
    pub resync_spread: f64,
}

impl Default for PollConfig {
    fn default() -> Self {
        PollConfig {
            resync_interval_secs: 60.0,
            jitter: 0.1,
            request_timeout_ms: 10_000,
            connect_timeout_ms: 3_000,
            max_retries: 3,
            backoff_initial_ms: 200,
            backoff_max_ms: 5_000,
            max_pages: 10_000,
            publish_in_flight: 256,
            resync_spread: 0.5,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConnectorsConfig {
    pub netbox: NetboxConnectorConfig,
    pub openstack: OpenstackConnectorConfig,
    pub slurm: SlurmConnectorConfig,
    pub health: HealthConnectorConfig,
    pub borneo: BorneoConnectorConfig,
    pub fabric: FabricConnectorConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetboxConnectorConfig {
    /// Address of `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// NetBox base URL, e.g. `https://netbox.example.com` (the connector
    /// reads `<url>/api/dcim/devices/`).
    pub url: String,
    /// API token, v1 (40 hex characters) or v2 (`nbt_<key>.<secret>`).
    pub token: Credential,
    /// `auto` (v2 tokens starting `nbt_` as `Bearer`, others as `Token`),
    /// `token` or `bearer`.
    pub auth_scheme: String,
    /// Fleet site id -> NetBox site slug (`?site=<slug>`).
    pub sites: BTreeMap<String, String>,
    /// Fleet site id -> the pool the devices it creates there join (none:
    /// no pool until an operator assigns one).
    pub pools: BTreeMap<String, String>,
    /// `limit` of one page.
    pub page_size: u32,
    /// Create devices the hub does not know through `create_device`, and
    /// each configured site the hub does not know through `create_site`.
    pub create_devices: bool,
    /// Fleet site ids created inventory-only (seed 002: "The NetBox agent
    /// sets the site flag from deployment config"). A site that exists
    /// keeps its flag: it is immutable after create.
    pub inventory_only_sites: Vec<String>,
    pub poll: PollConfig,
}

impl Default for NetboxConnectorConfig {
    fn default() -> Self {
        NetboxConnectorConfig {
            listen: "127.0.0.1:9420".into(),
            url: String::new(),
            token: Credential::default(),
            auth_scheme: "auto".into(),
            sites: BTreeMap::new(),
            pools: BTreeMap::new(),
            page_size: 100,
            create_devices: true,
            inventory_only_sites: Vec::new(),
            poll: PollConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpenstackConnectorConfig {
    pub listen: String,
    /// How snapshots name a device: `name` (the Ironic node name) or
    /// `infrastructure_ref` (the Ironic node UUID).
    pub key_by: String,
    /// `X-OpenStack-Ironic-API-Version`; 1.43 or later (`detail=true`), and
    /// 1.50 or later so `lessee`, `owner` and `traits` are returned.
    pub ironic_api_version: String,
    /// `OpenStack-API-Version: placement <v>`; 1.18 or later (`required=`).
    pub placement_api_version: String,
    /// The trait that marks a node customer-ready.
    pub customer_ready_trait: String,
    /// `limit` of one Ironic page.
    pub page_size: u32,
    /// Fleet site id -> that site's OpenStack.
    pub sites: BTreeMap<String, OpenstackSiteConfig>,
    pub poll: PollConfig,
}

impl Default for OpenstackConnectorConfig {
    fn default() -> Self {
        OpenstackConnectorConfig {
            listen: "127.0.0.1:9421".into(),
            key_by: "name".into(),
            ironic_api_version: "1.80".into(),
            placement_api_version: "1.18".into(),
            customer_ready_trait: "CUSTOM_CUSTOMER_READY".into(),
            page_size: 500,
            sites: BTreeMap::new(),
            poll: PollConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpenstackSiteConfig {
    /// Keystone, e.g. `https://keystone.example.com:5000/v3`; empty means
    /// no authentication (standalone Ironic with `auth_strategy = noauth`).
    pub auth_url: String,
    pub username: String,
    pub password: Credential,
    pub user_domain_name: String,
    pub project_name: String,
    pub project_domain_name: String,
    /// Catalogue interface and region used when an endpoint is not set.
    pub interface: String,
    pub region: String,
    /// Ironic endpoint (`https://ironic.example.com:6385`); empty: from the
    /// Keystone catalogue (type `baremetal`).
    pub ironic_url: String,
    /// Placement endpoint; empty: from the catalogue (type `placement`).
    pub placement_url: String,
    /// `false` at standalone-Ironic sites: customer-ready comes from the
    /// Ironic node's `traits` instead of Placement.
    pub placement_enabled: bool,
    /// The maintenance/SLURM project: a node whose `lessee` is this project
    /// is in the maintenance pool.
    pub maintenance_project_id: String,
}

impl Default for OpenstackSiteConfig {
    fn default() -> Self {
        OpenstackSiteConfig {
            auth_url: String::new(),
            username: String::new(),
            password: Credential::default(),
            user_domain_name: "Default".into(),
            project_name: String::new(),
            project_domain_name: "Default".into(),
            interface: "public".into(),
            region: String::new(),
            ironic_url: String::new(),
            placement_url: String::new(),
            placement_enabled: true,
            maintenance_project_id: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlurmConnectorConfig {
    pub listen: String,
    /// Fleet site id -> that site's slurmrestd.
    pub sites: BTreeMap<String, SlurmSiteConfig>,
    pub poll: PollConfig,
}

impl Default for SlurmConnectorConfig {
    fn default() -> Self {
        SlurmConnectorConfig {
            listen: "127.0.0.1:9422".into(),
            sites: BTreeMap::new(),
            poll: PollConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlurmSiteConfig {
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthConnectorConfig {
    pub listen: String,
    /// The label naming the host (the fleet device name) on every health
    /// series.
    pub host_label: String,
    /// Fleet site id -> that site's Prometheus query API.
    pub sites: BTreeMap<String, HealthSiteConfig>,
    pub poll: PollConfig,
}

impl Default for HealthConnectorConfig {
    fn default() -> Self {
        HealthConnectorConfig {
            listen: "127.0.0.1:9423".into(),
            host_label: "host".into(),
            sites: BTreeMap::new(),
            poll: PollConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthSiteConfig {
    /// The base of the query API: Prometheus (`http://prometheus:9090`) or
    /// Mimir (`https://mimir.example.com/prometheus`); the connector reads
    /// `<url>/api/v1/query`.
    pub url: String,
    /// The Mimir tenant, sent in `tenant_header`; empty sends no header.
    pub tenant: String,
    pub tenant_header: String,
    /// Label matchers added to every query so it selects this site's hosts
    /// only, e.g. `site="lon1"`; empty: every series.
    pub selector: String,
    /// `Authorization: Bearer <token>`, when the query API wants one.
    pub token: Credential,
}

impl Default for HealthSiteConfig {
    fn default() -> Self {
        HealthSiteConfig {
            url: String::new(),
            tenant: String::new(),
            tenant_header: "X-Scope-OrgID".into(),
            selector: String::new(),
            token: Credential::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BorneoConnectorConfig {
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

impl Default for BorneoConnectorConfig {
    fn default() -> Self {
        BorneoConnectorConfig {
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FabricConnectorConfig {
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
    pub sites: BTreeMap<String, FabricSiteConfig>,
    pub poll: PollConfig,
}

impl Default for FabricConnectorConfig {
    fn default() -> Self {
        FabricConnectorConfig {
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
#[serde(default)]
pub struct FabricSiteConfig {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let c = Credential {
            value: Secret::new("hunter2"),
            ..Default::default()
        };
        assert!(!format!("{c:?}").contains("hunter2"));
        let json = serde_json_like(&c);
        assert!(!json.contains("hunter2"), "{json}");
        assert_eq!(
            c.resolve("k").unwrap().map(|s| s.expose().to_string()),
            Some("hunter2".into())
        );
        assert_eq!(format!("{:?}", Secret::default()), "Secret(\"\")");
    }

    #[test]
    fn credential_sources() {
        let dir = std::env::temp_dir().join(format!("fleet-cred-{}", std::process::id()));
        std::fs::write(&dir, "tok-from-file\n").unwrap();
        let c = Credential {
            file: dir.display().to_string(),
            ..Default::default()
        };
        assert_eq!(c.resolve("k").unwrap().unwrap().expose(), "tok-from-file");
        std::fs::remove_file(&dir).unwrap();
        let err = c.resolve("connectors.slurm.sites.s1.token").unwrap_err();
        assert!(
            err.to_string()
                .contains("connectors.slurm.sites.s1.token.file"),
            "{err}"
        );
        let missing = Credential {
            env: "FLEET_TEST_SURELY_UNSET_VAR".into(),
            ..Default::default()
        };
        assert!(missing.resolve("k").is_err());
        assert!(Credential::default().resolve("k").unwrap().is_none());
    }

    #[test]
    fn a_file_fills_sites_over_the_defaults() {
        // The layering of `FleetConfig::load` without the environment, which
        // another test changes.
        let toml = r#"
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
            resync_interval_secs = 30
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
        "#;
        let c: crate::FleetConfig = config::Config::builder()
            .add_source(config::Config::try_from(&crate::FleetConfig::default()).unwrap())
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .build()
            .unwrap()
            .try_deserialize()
            .unwrap();
        let c = c.connectors;
        assert_eq!(c.netbox.sites["s1"], "dc1");
        assert_eq!(c.netbox.page_size, 100);
        let os = &c.openstack.sites["s1"];
        assert!(!os.placement_enabled);
        assert_eq!(os.user_domain_name, "Default");
        assert_eq!(c.slurm.sites["s1"].token.file, "/run/secrets/jwt");
        assert_eq!(c.slurm.poll.resync_interval_secs, 30.0);
        assert_eq!(c.slurm.poll.max_retries, 3);
        assert_eq!(c.openstack.key_by, "name");
        let h = &c.health.sites["s1"];
        assert_eq!(h.tenant_header, "X-Scope-OrgID");
        assert_eq!(c.health.host_label, "host");
        assert_eq!(c.borneo.client_secret.env, "BORNEO_SECRET");
        assert_eq!(c.borneo.sites["s1"], "partner-1");
        assert_eq!(c.borneo.page_size, 500);
        let f = &c.fabric.sites["s1"];
        assert_eq!(f.frontend_switches["leaf01"], "https://leaf01:8765");
        assert_eq!(f.customer_vrfs, vec!["cust-*"]);
        assert_eq!(c.fabric.nvue_revision, "operational");
    }

    /// Serialises through the `config` crate's own value model, the path
    /// `FleetConfig::load` takes for the defaults.
    fn serde_json_like(c: &Credential) -> String {
        let v = config::Config::try_from(c).unwrap();
        format!("{:?}", v.cache)
    }
}
