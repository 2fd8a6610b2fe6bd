//! The `placer` section.

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// Redelivery of unacked STATUS events.
    #[serde(with = "humantime_serde")]
    pub ack_wait: Duration,
    /// Between full rebuilds of the capacity view from PostgreSQL (picks up
    /// other replicas' allocations and pool moves).
    #[serde(with = "humantime_serde")]
    pub resync_interval: Duration,
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

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9410".into(),
            ack_wait: Duration::from_secs(30),
            resync_interval: Duration::from_secs(60),
            spread_racks: false,
            max_attempts: 8,
            max_gpus_per_request: 1024,
            concurrency: 64,
        }
    }
}
