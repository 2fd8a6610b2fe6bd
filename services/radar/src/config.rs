//! The `radar` section.

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
    /// STATUS events handled per batch (one PostgreSQL read per batch).
    pub batch_size: usize,
    /// How often every projection is recomputed from PostgreSQL and the
    /// differences published: picks up what no STATUS event announces
    /// (tenant opt-outs written elsewhere, deleted devices).
    #[serde(with = "humantime_serde")]
    pub resync_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9412".into(),
            ack_wait: Duration::from_secs(30),
            batch_size: 256,
            resync_interval: Duration::from_secs(30),
        }
    }
}
