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
