//! Configuration of the status consumers (`fleet placer`, `fleet gateway`,
//! `fleet radar`, `fleet sim agents`). Every key has a default, so a
//! configuration file that names none of them still loads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct PlacerConfig {
    /// Address of `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// Redelivery of unacked STATUS events.
    pub ack_wait_secs: u64,
    /// Seconds between full rebuilds of the capacity view from PostgreSQL
    /// (picks up other replicas' allocations and pool moves).
    pub resync_secs: u64,
    /// Spread a multi-device allocation across racks.
    pub spread_racks: bool,
    /// Lock attempts per allocation before the view is rebuilt from
    /// PostgreSQL and the request retried once more.
    pub max_attempts: u32,
    /// Largest `gpus` one request may ask for.
    pub max_gpus_per_request: u32,
    /// Requests served at once.
    pub concurrency: usize,
}

impl Default for PlacerConfig {
    fn default() -> Self {
        PlacerConfig {
            listen: "127.0.0.1:9410".into(),
            ack_wait_secs: 30,
            resync_secs: 60,
            spread_racks: false,
            max_attempts: 8,
            max_gpus_per_request: 1024,
            concurrency: 64,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct GatewayConfig {
    /// Address of `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// This replica's id in connectivity observations; empty: `gw-<host>`.
    pub gateway_id: String,
    /// The heartbeat interval the gateway asks agents for.
    pub heartbeat_interval_secs: u32,
    /// How often live sessions are checked against PostgreSQL for an
    /// identity-generation bump (revoke, re-join, delete).
    pub identity_check_ms: u64,
    /// How often the gateway re-publishes its `GpuCountMismatch` snapshot
    /// for each live session (keeps it fresh at the hub).
    pub snapshot_resync_secs: u64,
    /// Deadline of a relayed command when the caller names none, and the
    /// longest one accepted.
    pub command_deadline_ms: u64,
    pub max_command_deadline_ms: u64,
    /// Requests served at once.
    pub concurrency: usize,
    /// How long the gateway waits for the hub's answer to a command (a
    /// join, an adoption); an agent's request gets twice this.
    pub hub_timeout_secs: u64,
    /// Platform secrets handed to platform and tenant-owned agents at
    /// session open (break-glass keys, ...); never to tenant-controlled ones.
    pub platform_secrets: BTreeMap<String, String>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            listen: "127.0.0.1:9411".into(),
            gateway_id: String::new(),
            heartbeat_interval_secs: 10,
            identity_check_ms: 2000,
            snapshot_resync_secs: 60,
            command_deadline_ms: 30_000,
            max_command_deadline_ms: 600_000,
            concurrency: 256,
            hub_timeout_secs: 10,
            platform_secrets: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct RadarConfig {
    /// Address of `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// Redelivery of unacked STATUS events.
    pub ack_wait_secs: u64,
    /// STATUS events handled per batch (one PostgreSQL read per batch).
    pub batch_size: usize,
    /// How often every projection is recomputed from PostgreSQL and the
    /// differences published: picks up what no STATUS event announces
    /// (tenant opt-outs written elsewhere, deleted devices).
    pub resync_secs: u64,
}

impl Default for RadarConfig {
    fn default() -> Self {
        RadarConfig {
            listen: "127.0.0.1:9412".into(),
            ack_wait_secs: 30,
            batch_size: 256,
            resync_secs: 30,
        }
    }
}

/// The workflow service (`fleet workflow`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkflowConfig {
    /// Address of `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// Requests (create, get, list, cancel) answered at once.
    pub concurrency: usize,
    /// Devices worked on at once by this replica.
    pub workers: usize,
    /// A JOBS message not acknowledged for this long (its worker died) is
    /// delivered again; the next worker resumes after the last step the
    /// device completed. A live worker extends it while it works.
    pub ack_wait_secs: u64,
    /// How long a hub command may take.
    pub hub_timeout_secs: u64,
    /// Impairment holds asked for at once go to the hub as one command of
    /// up to this many devices...
    pub hold_batch_max: usize,
    /// ...gathered for at most this long after the first.
    pub hold_batch_linger_ms: u64,
    /// Tries of one step after transient failures (an outage, a lock
    /// conflict) before the device fails with a retryable code.
    pub max_attempts: u32,
    /// Back-off between two tries of a step, doubling up to the maximum.
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    /// How often a waiting step reads the external system again.
    pub poll_interval_ms: u64,
    /// How long a step may wait for the external system (a deploy, a
    /// teardown) before the device fails with `IRONIC_TIMEOUT`.
    pub step_timeout_secs: u64,
    /// Largest number of devices one job may name.
    pub max_devices_per_job: usize,
    /// Timeout of one HTTP request to an external system.
    pub request_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// Ironic API microversion sent with every Ironic request.
    pub ironic_api_version: String,
    /// Placement API microversion of the trait calls (1.6 or later).
    pub placement_api_version: String,
    /// The trait an impairment cordon removes from a device's resource
    /// provider and its release restores (the one
    /// `connectors.openstack.customer_ready_trait` reads).
    pub customer_ready_trait: String,
    /// Per site: how the workflows reach its systems.
    pub sites: BTreeMap<String, WorkflowSiteConfig>,
}

impl Default for WorkflowConfig {
    fn default() -> Self {
        WorkflowConfig {
            listen: "127.0.0.1:9413".into(),
            concurrency: 64,
            workers: 64,
            ack_wait_secs: 30,
            hub_timeout_secs: 10,
            hold_batch_max: 200,
            hold_batch_linger_ms: 5,
            max_attempts: 5,
            retry_initial_ms: 1000,
            retry_max_ms: 30_000,
            poll_interval_ms: 1000,
            step_timeout_secs: 1800,
            max_devices_per_job: 10_000,
            request_timeout_ms: 10_000,
            connect_timeout_ms: 3000,
            ironic_api_version: "1.80".into(),
            placement_api_version: "1.18".into(),
            customer_ready_trait: "CUSTOM_CUSTOMER_READY".into(),
            sites: BTreeMap::new(),
        }
    }
}

/// One site as the workflows see it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkflowSiteConfig {
    /// Keystone, Ironic and Placement of the site (the same keys as
    /// `connectors.openstack.sites.<site>`).
    pub openstack: crate::connectors::OpenstackSiteConfig,
    /// Image Node, Ironic-direct arm: the image written to the node's
    /// `instance_info.image_source`, its checksum, and the public keys of
    /// the config drive ("the per-site configured image, checksum, and
    /// config-drive public keys").
    pub image_source: String,
    pub image_checksum: String,
    pub config_drive_public_keys: Vec<String>,
}
