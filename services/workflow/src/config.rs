//! The `workflow` section.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_runtime::{ConfigError, Credential};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// Requests (create, get, list, cancel) answered at once.
    pub concurrency: usize,
    /// Devices worked on at once by this replica.
    pub workers: usize,
    /// A JOBS message not acknowledged for this long (its worker died) is
    /// delivered again; the next worker resumes after the last step the
    /// device completed. A live worker extends it while it works.
    #[serde(with = "humantime_serde")]
    pub ack_wait: Duration,
    /// How long a hub command may take.
    #[serde(with = "humantime_serde")]
    pub hub_timeout: Duration,
    /// Impairment holds asked for at once go to the hub as one command of
    /// up to this many devices...
    pub hold_batch_max: usize,
    /// ...gathered for at most this long after the first.
    #[serde(with = "humantime_serde")]
    pub hold_batch_linger: Duration,
    /// Tries of one step after transient failures (an outage, a lock
    /// conflict) before the device fails with a retryable code.
    pub max_attempts: u32,
    /// Back-off between two tries of a step, doubling up to the maximum.
    #[serde(with = "humantime_serde")]
    pub retry_initial: Duration,
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
    /// How often a waiting step reads the external system again.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// How long a step may wait for the external system (a deploy, a
    /// teardown) before the device fails with `IRONIC_TIMEOUT`.
    #[serde(with = "humantime_serde")]
    pub step_timeout: Duration,
    /// Largest number of devices one job may name.
    pub max_devices_per_job: usize,
    /// Timeout of one HTTP request to an external system.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Ironic API microversion sent with every Ironic request.
    pub ironic_api_version: String,
    /// Placement API microversion of the trait calls (1.6 or later).
    pub placement_api_version: String,
    /// Nova API microversion of the Nova arm (2.74 or later: the create
    /// names its Ironic node as `hypervisor_hostname`).
    pub nova_api_version: String,
    /// The trait an impairment cordon removes from a device's resource
    /// provider and its release restores (the one
    /// `connectors.openstack.customer_ready_trait` reads).
    pub customer_ready_trait: String,
    /// The NetBox a Release re-reads each device from, immediately before a
    /// customer handoff.
    pub netbox: NetboxConfig,
    /// The storm guard: how much of a site or pool a job or an impairment
    /// cordon may take out of service before an operator must confirm it.
    pub storm_guard: StormGuardConfig,
    /// What the fabric workflows reach at every site: NetBox (the cable
    /// map) and the switches' NVUE credentials.
    pub fabric: FabricConfig,
    /// Per site: how the workflows reach its systems.
    pub sites: BTreeMap<String, SiteConfig>,
}

/// `workflow.netbox`: the NetBox a customer hand-back re-reads and whose
/// cables map a device to its switch ports.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetboxConfig {
    /// NetBox base URL; empty: a fully managed Release fails with
    /// `SITE_NOT_CONFIGURED` (it must re-read NetBox).
    pub url: String,
    pub token: fleet_runtime::Credential,
    /// `auto`, `token` or `bearer` (as `connectors.netbox.auth_scheme`).
    pub auth_scheme: String,
}

impl Default for NetboxConfig {
    fn default() -> Self {
        NetboxConfig {
            url: String::new(),
            token: Default::default(),
            auth_scheme: "auto".into(),
        }
    }
}

/// `workflow.fabric`: the switches' NVUE credentials (NetBox, whose
/// cables map a device to its switch ports, is `workflow.netbox`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FabricConfig {
    /// HTTP basic credentials of the switches' NVUE REST API (a user that
    /// may create and apply revisions).
    pub nvue_username: String,
    pub nvue_password: Credential,
}

/// `workflow.storm_guard`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StormGuardConfig {
    /// `false` admits every job and event without counting.
    pub enabled: bool,
    /// More than this share of a scope's in-service devices out within the
    /// window trips the guard...
    pub max_share: f64,
    /// ...but a scope may always take this many.
    pub min_devices: usize,
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

impl Default for StormGuardConfig {
    fn default() -> Self {
        StormGuardConfig {
            enabled: true,
            max_share: 0.10,
            min_devices: 5,
            window: Duration::from_secs(3600),
        }
    }
}

impl StormGuardConfig {
    /// The policy, or `None` when the guard is off.
    pub fn policy(&self) -> Option<fleet_domain::storm::Policy> {
        self.enabled.then_some(fleet_domain::storm::Policy {
            max_share: self.max_share,
            min_devices: self.min_devices,
            window: self.window,
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9413".into(),
            concurrency: 64,
            workers: 64,
            ack_wait: Duration::from_secs(30),
            hub_timeout: Duration::from_secs(10),
            hold_batch_max: 200,
            hold_batch_linger: Duration::from_millis(5),
            max_attempts: 5,
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            step_timeout: Duration::from_secs(1800),
            max_devices_per_job: 10_000,
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            ironic_api_version: "1.80".into(),
            placement_api_version: "1.18".into(),
            nova_api_version: "2.74".into(),
            customer_ready_trait: "CUSTOM_CUSTOMER_READY".into(),
            netbox: NetboxConfig::default(),
            storm_guard: StormGuardConfig::default(),
            fabric: FabricConfig::default(),
            sites: BTreeMap::new(),
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.ack_wait < Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                "workflow.ack_wait",
                "must be at least 1s",
            ));
        }
        if self.retry_max < self.retry_initial {
            return Err(ConfigError::invalid(
                "workflow.retry_max",
                "must not be shorter than workflow.retry_initial",
            ));
        }
        let g = &self.storm_guard;
        if !(g.max_share > 0.0 && g.max_share <= 1.0) {
            return Err(ConfigError::invalid(
                "workflow.storm_guard.max_share",
                "must be above 0 and at most 1",
            ));
        }
        for (site, sc) in &self.sites {
            let n = &sc.nova;
            if !n.is_configured() {
                continue;
            }
            let key = |k: &str| format!("workflow.sites.{site}.{k}");
            for (k, v) in [
                ("nova.enrol_project_id", &n.enrol_project_id),
                ("nova.network_id", &n.network_id),
                ("nova.key_name", &n.key_name),
                (
                    "openstack.maintenance_project_id",
                    &sc.openstack.maintenance_project_id,
                ),
            ] {
                if v.trim().is_empty() {
                    return Err(ConfigError::invalid(
                        &key(k),
                        "is required with workflow.sites.<site>.nova.credential (the Nova arm)",
                    ));
                }
            }
            for (class, r) in &n.roles {
                if r.image.trim().is_empty() || r.flavor.trim().is_empty() {
                    return Err(ConfigError::invalid(
                        &key(&format!("nova.roles.{class}")),
                        "needs both image and flavor",
                    ));
                }
            }
        }
        for (site, sc) in &self.sites {
            let b = &sc.burn_in;
            let key = |k: &str| format!("workflow.sites.{site}.burn_in.{k}");
            if let Err(why) = fleet_domain::burn_in::node_constraint(&b.node_feature, "node") {
                return Err(ConfigError::invalid(&key("node_feature"), &why));
            }
            for (stage, t) in [
                ("single_node_test", &b.single_node_test),
                ("multi_node_test", &b.multi_node_test),
            ] {
                if !t.script.is_empty() && !t.script.starts_with("#!") {
                    return Err(ConfigError::invalid(
                        &key(&format!("{stage}.script")),
                        "must start with #! (SLURM runs it as a batch script)",
                    ));
                }
                if t.time_limit < Duration::from_secs(60) {
                    return Err(ConfigError::invalid(
                        &key(&format!("{stage}.time_limit")),
                        "must be at least 1m (SLURM counts it in minutes)",
                    ));
                }
            }
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::invalid(
                "workflow.max_attempts",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// One site as the workflows see it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SiteConfig {
    /// Keystone, Ironic and Placement of the site (the same keys as
    /// `connectors.openstack.sites.<site>`).
    pub openstack: fleet_openstack::SiteConfig,
    /// Image Node, Ironic-direct arm: the image written to the node's
    /// `instance_info.image_source`, its checksum, and the public keys of
    /// the config drive ("the per-site configured image, checksum, and
    /// config-drive public keys").
    pub image_source: String,
    pub image_checksum: String,
    pub config_drive_public_keys: Vec<String>,
    /// How Enrolment treats the site's nodes.
    pub enrolment: EnrolmentConfig,
    /// The site's slurmrestd (the same keys as
    /// `connectors.slurm.sites.<site>`): Move to Test Cluster reads the
    /// node and resumes it through it.
    pub slurm: fleet_slurm::SiteConfig,
    /// Move to Test Cluster, Ironic-direct arm: the image the test cluster
    /// runs (its slurmd registers the node), and its checksum.
    pub slurm_image_source: String,
    pub slurm_image_checksum: String,
    /// The site's switches and NMX-M, for the VRF flips and the NVLink
    /// repair-partition move.
    pub fabric: SiteFabricConfig,
    /// Image Node and Unimage Node at a site with Nova and Placement
    /// (`placement_enabled`): the Nova arm.
    pub nova: NovaArmConfig,
    /// The burn-in stages (`single_node_test`, `multi_node_test`): the
    /// hardware test each submits as a SLURM job through `slurm`.
    pub burn_in: BurnInConfig,
}

/// `workflow.sites.<site>.burn_in`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BurnInConfig {
    /// The node feature that pins a test to the device's SLURM node, with
    /// `{node}` for the node name (slurmrestd v0.0.38 takes no node list on
    /// a submission, so each test node carries a feature naming it, as
    /// `Feature=gpu04` in `slurm.conf`).
    pub node_feature: String,
    /// How long a submitted test may wait in the queue, on top of its time
    /// limit, before the device fails with `BURN_IN_TIMEOUT` (its job is
    /// cancelled).
    #[serde(with = "humantime_serde")]
    pub queue_timeout: Duration,
    /// The working directory and `PATH` of the test on the node.
    pub working_directory: String,
    pub path: String,
    pub single_node_test: StageTest,
    pub multi_node_test: StageTest,
}

/// One burn-in stage's test.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StageTest {
    /// The batch script (its first line a `#!`); empty: jobs of the stage
    /// at this site fail with `SITE_NOT_CONFIGURED`. It runs with
    /// `FLEET_DEVICE_ID`, `FLEET_DEVICE_NAME`, `FLEET_JOB_ID` and
    /// `FLEET_STAGE` set; exit 0 passes the stage.
    pub script: String,
    /// SLURM's time limit of the test; it ends `TIMEOUT` (a failure) after.
    #[serde(with = "humantime_serde")]
    pub time_limit: Duration,
    /// The SLURM partition; empty: the cluster's default.
    pub partition: String,
}

impl Default for BurnInConfig {
    fn default() -> Self {
        BurnInConfig {
            node_feature: "{node}".into(),
            queue_timeout: Duration::from_secs(3600),
            working_directory: "/tmp".into(),
            path: "/usr/local/bin:/usr/bin:/bin".into(),
            single_node_test: StageTest::default(),
            multi_node_test: StageTest::default(),
        }
    }
}

impl Default for StageTest {
    fn default() -> Self {
        StageTest {
            script: String::new(),
            time_limit: Duration::from_secs(4 * 3600),
            partition: String::new(),
        }
    }
}

/// `workflow.sites.<site>.nova`: the Nova arm (seed 002: "moves the Ironic
/// lease from the enrol project to the SLURM project, then creates the
/// server through the dedicated SLURM credential using the configured SLURM
/// network and keypair"). The SLURM project is the site's
/// `openstack.maintenance_project_id`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NovaArmConfig {
    /// The dedicated SLURM credential: a Keystone user scoped to the SLURM
    /// project (the keys of `openstack`; `nova_url`, or Nova from its
    /// catalogue). Empty: the site runs no Nova arm, and Image and Unimage
    /// jobs on its devices are refused at creation.
    pub credential: fleet_openstack::SiteConfig,
    /// The project an enrolled node that is not imaged is leased to, and
    /// that Unimage returns the lease to.
    pub enrol_project_id: String,
    /// The SLURM network (a Neutron network id) and keypair of the server.
    pub network_id: String,
    pub key_name: String,
    /// Per device class (`gpu_compute`, `cpu_baremetal`): the SLURM image
    /// and flavour of the role ("the configured per-role SLURM image and
    /// flavour"). A class without an entry is refused with
    /// `IMAGE_ROLE_UNSUPPORTED`; `cpu_hypervisor` always is.
    pub roles: BTreeMap<String, RoleImage>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoleImage {
    /// The Glance image id.
    pub image: String,
    /// The Nova flavour id.
    pub flavor: String,
}

impl NovaArmConfig {
    /// Whether the site is configured for the Nova arm at all.
    pub fn is_configured(&self) -> bool {
        !self.credential.auth_url.trim().is_empty() || !self.credential.nova_url.trim().is_empty()
    }
}

/// `workflow.sites.<site>.fabric`: the switch and NMX-M keys of
/// `connectors.fabric.sites.<site>`, and what the flips move ports into.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SiteFabricConfig {
    /// The NetBox site slug of the site's devices and switches.
    pub netbox_site: String,
    /// Front-end switch (its NetBox device name) -> its NVUE API base URL.
    pub frontend_switches: BTreeMap<String, String>,
    /// RoCE back-end switch -> its NVUE API base URL.
    pub backend_switches: BTreeMap<String, String>,
    /// Switches (names or `prefix*`) the flips plan and read but never
    /// write: their per-switch results say `simulated`, and a flip with one
    /// of them records no verified latch.
    pub simulated_switches: Vec<String>,
    /// The VRF the front-end isolate moves ports into.
    pub isolate_vrf: String,
    /// The VRF the back-end isolate moves ports into (the maintenance VRF
    /// `BackendPortsInMaintenanceVrf` names).
    pub maintenance_vrf: String,
    /// The VRF the back-end return moves ports back into.
    pub tenant_backend_vrf: String,
    /// NVIDIA NMX-M; empty: no NVLink move at this site.
    pub nmx_url: String,
    /// NMX-M HTTP basic credentials (a read-write user), or a bearer token.
    pub nmx_username: String,
    pub nmx_password: Credential,
    pub nmx_token: Credential,
    /// The name of the NVLink repair partition. Required with `nmx_url`.
    pub repair_partition: String,
}

impl Default for SiteFabricConfig {
    fn default() -> Self {
        SiteFabricConfig {
            netbox_site: String::new(),
            frontend_switches: BTreeMap::new(),
            backend_switches: BTreeMap::new(),
            simulated_switches: Vec::new(),
            isolate_vrf: "isolate".into(),
            maintenance_vrf: String::new(),
            tenant_backend_vrf: String::new(),
            nmx_url: String::new(),
            nmx_username: String::new(),
            nmx_password: Credential::default(),
            nmx_token: Credential::default(),
            repair_partition: String::new(),
        }
    }
}

/// `workflow.sites.<site>.enrolment`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnrolmentConfig {
    /// Power-cycle a node before inspecting it (through Ironic's power
    /// interface); refused with `IRONIC_DRIVER_MISMATCH` for a node whose
    /// driver is not `required_driver`.
    pub power_cycle_before_inspect: bool,
    pub required_driver: String,
}

impl Default for EnrolmentConfig {
    fn default() -> Self {
        EnrolmentConfig {
            power_cycle_before_inspect: false,
            required_driver: "ipmi".into(),
        }
    }
}
