//! One site's OpenStack as its configuration names it: the same keys under
//! `connectors.openstack.sites.<site>` (which reads it) and
//! `workflow.sites.<site>.openstack` (which writes to it).

use fleet_runtime::Credential;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SiteConfig {
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
    /// Nova endpoint (`https://nova.example.com:8774/v2.1`); empty: from
    /// the catalogue (type `compute`). Only the workflow service calls Nova.
    pub nova_url: String,
    /// `false` at standalone-Ironic sites: customer-ready comes from the
    /// Ironic node's `traits` instead of Placement.
    pub placement_enabled: bool,
    /// The maintenance/SLURM project: a node whose `lessee` is this project
    /// is in the maintenance pool.
    pub maintenance_project_id: String,
}

impl Default for SiteConfig {
    fn default() -> Self {
        SiteConfig {
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
            nova_url: String::new(),
            placement_enabled: true,
            maintenance_project_id: String::new(),
        }
    }
}
