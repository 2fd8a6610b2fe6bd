//! `fleet dev`'s wiring: every connector pointed at the simulated systems
//! of every site, with the credentials and poll settings they expect.

use std::time::Duration;

use crate::config::FleetConfig;
use fleet_connector::PollConfig;
use fleet_connector_fabric::SiteConfig as FabricSiteConfig;
use fleet_connector_health::SiteConfig as HealthSiteConfig;
use fleet_connector_slurm::SiteConfig as SlurmSiteConfig;
use fleet_openstack::SiteConfig as OpenstackSiteConfig;
use fleet_runtime::config::{Credential, Secret};

use crate::dev::{dev_pool, engine, fabric, free_addr, partner, servers};

/// The image Image Node binds on the simulated nodes (nothing fetches it).
pub(crate) const DEV_IMAGE: &str = "http://images.dev.invalid/ubuntu-22.04-gpu.qcow2";
pub(crate) const DEV_IMAGE_CHECKSUM: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// The Nova arm's SLURM image (a Glance id), flavour, network and keypair
/// at the sites with Nova.
pub(crate) const DEV_SLURM_IMAGE: &str = "5c0ffee0-slurm-gpu-image";
pub(crate) const DEV_SLURM_FLAVOR: &str = "bm.gpu.h100";
pub(crate) const DEV_SLURM_NETWORK: &str = "5eed0000-slurm-net";
pub(crate) const DEV_SLURM_KEY: &str = "slurm-ops";

/// Points the connectors at the simulated systems, every site (those in
/// `standalone` without Placement).
pub(crate) fn wire_connectors(
    config: &mut FleetConfig,
    e: &servers::Endpoints,
    sites: &[String],
    standalone: &[String],
    racks: &[String],
    resync: f64,
    fabric_resync: f64,
) {
    let nb = &mut config.connectors.netbox;
    nb.listen = connector_listen();
    nb.url = e.netbox.clone();
    nb.token = inline(servers::NETBOX_TOKEN);
    nb.auth_scheme = "token".into();
    nb.page_size = 1000;
    nb.poll = fast_poll(resync);
    nb.sites = per_site(sites, |s| s.clone());
    // Devices join their site's pool (created below), so allocations and
    // capacity can be tried on the dev mesh.
    nb.pools = per_site(sites, |s| dev_pool(s));

    let os = &mut config.connectors.openstack;
    os.listen = connector_listen();
    os.page_size = 1000;
    os.customer_ready_trait = engine::CUSTOMER_READY_TRAIT.into();
    os.poll = fast_poll(resync);
    os.sites = per_site(sites, |s| OpenstackSiteConfig {
        auth_url: format!("{}/{s}/identity/v3", e.openstack),
        username: servers::OPENSTACK_USER.into(),
        password: inline(servers::OPENSTACK_PASSWORD),
        project_name: servers::OPENSTACK_PROJECT.into(),
        ironic_url: format!("{}/{s}/ironic", e.openstack),
        placement_url: format!("{}/{s}/placement", e.openstack),
        placement_enabled: !standalone.contains(s),
        maintenance_project_id: engine::MAINTENANCE_PROJECT.into(),
        ..Default::default()
    });

    // The workflow service reaches the same Keystone, Ironic and Placement
    // (impairment cordons and releases write the simulated Placement's
    // traits).
    config.workflow.customer_ready_trait = engine::CUSTOMER_READY_TRAIT.into();
    config.workflow.sites = config
        .connectors
        .openstack
        .sites
        .iter()
        .map(|(s, os)| {
            (
                s.clone(),
                fleet_workflow::SiteConfig {
                    openstack: os.clone(),
                    image_source: DEV_IMAGE.into(),
                    image_checksum: DEV_IMAGE_CHECKSUM.into(),
                    // The Nova arm at a site with Placement: the same
                    // Keystone user stands for the SLURM credential (Nova
                    // from its catalogue).
                    nova: if os.placement_enabled {
                        fleet_workflow::NovaArmConfig {
                            credential: OpenstackSiteConfig {
                                ironic_url: String::new(),
                                placement_url: String::new(),
                                ..os.clone()
                            },
                            enrol_project_id: engine::ENROL_PROJECT.into(),
                            network_id: DEV_SLURM_NETWORK.into(),
                            key_name: DEV_SLURM_KEY.into(),
                            roles: [(
                                "gpu_compute".to_string(),
                                fleet_workflow::RoleImage {
                                    image: DEV_SLURM_IMAGE.into(),
                                    flavor: DEV_SLURM_FLAVOR.into(),
                                },
                            )]
                            .into_iter()
                            .collect(),
                        }
                    } else {
                        Default::default()
                    },
                    ..Default::default()
                },
            )
        })
        .collect();

    let h = &mut config.connectors.health;
    h.listen = connector_listen();
    h.poll = fast_poll(resync);
    h.sites = per_site(sites, |s| HealthSiteConfig {
        url: format!("{}/{s}", e.prometheus),
        ..Default::default()
    });

    let b = &mut config.connectors.borneo;
    b.listen = connector_listen();
    b.url = e.borneo.clone();
    b.token_url = format!("{}/oauth2/token", e.borneo);
    b.client_id = partner::CLIENT_ID.into();
    b.client_secret = inline(partner::CLIENT_SECRET);
    b.page_size = 500;
    b.poll = fast_poll(resync);
    b.sites = per_site(sites, |s| partner::partner_of(s));

    let f = &mut config.connectors.fabric;
    f.listen = connector_listen();
    f.netbox_url = e.netbox.clone();
    f.netbox_token = inline(servers::NETBOX_TOKEN);
    f.netbox_auth_scheme = "token".into();
    f.netbox_page_size = 1000;
    f.nvue_username = fabric::NVUE_USER.into();
    f.nvue_password = inline(fabric::NVUE_PASSWORD);
    f.nvue_revision = "operational".into();
    f.poll = fast_poll(fabric_resync);
    f.sites = per_site(sites, |s| {
        let site_racks: Vec<&String> = racks
            .iter()
            .filter(|r| r.starts_with(&format!("{s}-")))
            .collect();
        let switches = |name: fn(&str) -> String| {
            site_racks
                .iter()
                .map(|r| (name(r), format!("{}/{}", e.nvue, name(r))))
                .collect()
        };
        FabricSiteConfig {
            netbox_site: s.clone(),
            frontend_switches: switches(engine::frontend_switch),
            backend_switches: switches(engine::backend_switch),
            customer_vrfs: vec![format!("{}*", engine::CUSTOMER_VRF_PREFIX)],
            maintenance_vrf: engine::MAINTENANCE_VRF.into(),
            exclude_peers: vec!["spine-*".into()],
            nmx_url: format!("{}/{s}", e.nmx),
            nmx_username: fabric::NMX_USER.into(),
            nmx_password: inline(fabric::NMX_PASSWORD),
            repair_partition: engine::REPAIR_PARTITION.into(),
            ..Default::default()
        }
    });

    // The workflow service flips the same simulated switches and moves the
    // same NMX-M's partitions (the handover's front-end flips are its jobs).
    let wf = &mut config.workflow;
    wf.netbox.url = e.netbox.clone();
    wf.netbox.token = config.connectors.fabric.netbox_token.clone();
    wf.netbox.auth_scheme = "token".into();
    wf.fabric.nvue_username = fabric::NVUE_USER.into();
    wf.fabric.nvue_password = config.connectors.fabric.nvue_password.clone();
    // Flips are waited on every quarter second and retried quickly: the
    // handover waits for them.
    wf.poll_interval = Duration::from_millis(250);
    wf.retry_initial = Duration::from_millis(200);
    wf.retry_max = Duration::from_secs(2);
    for (s, f) in &config.connectors.fabric.sites {
        if let Some(site) = wf.sites.get_mut(s) {
            site.fabric = fleet_workflow::SiteFabricConfig {
                netbox_site: f.netbox_site.clone(),
                frontend_switches: f.frontend_switches.clone(),
                backend_switches: f.backend_switches.clone(),
                isolate_vrf: engine::ISOLATE_VRF.into(),
                maintenance_vrf: engine::MAINTENANCE_VRF.into(),
                tenant_backend_vrf: engine::TENANT_BACKEND_VRF.into(),
                nmx_url: f.nmx_url.clone(),
                nmx_username: f.nmx_username.clone(),
                nmx_password: f.nmx_password.clone(),
                repair_partition: f.repair_partition.clone(),
                ..Default::default()
            };
        }
    }

    let sl = &mut config.connectors.slurm;
    sl.listen = connector_listen();
    sl.poll = fast_poll(resync);
    sl.sites = per_site(sites, |s| SlurmSiteConfig {
        url: format!("{}/{s}", e.slurm),
        api_version: "v0.0.38".into(),
        ..Default::default()
    });

    // Burn-in runs as jobs on the simulated slurmrestd (each node's
    // feature is its name); the sites have an acceptance policy whose
    // gates the matrix holds on: the node's health after single-node
    // acceptance, its rack (NVLink domain) and its pool after multi-node.
    for (s, w) in config.workflow.sites.iter_mut() {
        if let Some(sc) = config.connectors.slurm.sites.get(s) {
            w.slurm = sc.clone();
        }
        w.burn_in.single_node_test.script = DEV_BURN_IN_SCRIPT.into();
        w.burn_in.multi_node_test.script = DEV_BURN_IN_SCRIPT.into();
    }
    use fleet_api::{AcceptancePolicy, GateConfig};
    use fleet_domain::acceptance::GateScope;
    use fleet_domain::standup::Stage;
    let gate = |name: &str, stage, scope| GateConfig {
        name: name.into(),
        stage,
        scope,
    };
    config.api.standup.sites = per_site(sites, |_| AcceptancePolicy {
        gates: vec![
            gate("node_health", Stage::SingleNodeTest, GateScope::Device),
            gate("nvlink_domain", Stage::MultiNodeTest, GateScope::Rack),
            gate("pod", Stage::MultiNodeTest, GateScope::Pool),
        ],
        ..Default::default()
    });
}

/// A map with an entry per site, as `entry` makes it.
fn per_site<V, M: FromIterator<(String, V)>>(sites: &[String], entry: impl Fn(&String) -> V) -> M {
    sites.iter().map(|s| (s.clone(), entry(s))).collect()
}

/// A secret given in the configuration itself.
fn inline(secret: &str) -> Credential {
    Credential {
        value: Secret::new(secret),
        ..Default::default()
    }
}

/// A connector's listen address: a free port of this host.
fn connector_listen() -> String {
    free_addr().unwrap_or_else(|_| "127.0.0.1:0".into())
}

/// The burn-in the dev mesh submits (the simulated slurmrestd decides the
/// outcome from the node's health; a real cluster would run this).
const DEV_BURN_IN_SCRIPT: &str =
    "#!/bin/bash\n# fleet dev burn-in: a real site runs its hardware test here\nexit 0\n";

fn fast_poll(resync: f64) -> PollConfig {
    PollConfig {
        resync_interval: Duration::from_secs_f64(resync.max(0.05)),
        jitter: 0.1,
        request_timeout: Duration::from_secs(20),
        max_retries: 1,
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_millis(500),
        publish_in_flight: 1024,
        ..PollConfig::default()
    }
}
