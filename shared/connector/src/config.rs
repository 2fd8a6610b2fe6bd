//! The schedule, timeouts and retries of one connector's poll loop
//! (`connectors.<name>.poll`), the part of every connector's section that
//! the runtime reads.

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PollConfig {
    /// Between two reads of the source (the hub's freshness TTL for the
    /// source should be about 3x this).
    #[serde(with = "humantime_serde")]
    pub resync_interval: Duration,
    /// Fraction of the interval added or removed at random, so connectors
    /// of many sites do not poll in step (0.0 to 0.5).
    pub jitter: f64,
    /// Timeout of one HTTP request, connection included.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Retries of one request after a connection error, timeout, 429 or
    /// 5xx, with exponential back-off; then the poll fails (an outage).
    pub max_retries: u32,
    #[serde(with = "humantime_serde")]
    pub backoff_initial: Duration,
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
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
            resync_interval: Duration::from_secs(60),
            jitter: 0.1,
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            max_retries: 3,
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
            max_pages: 10_000,
            publish_in_flight: 256,
            resync_spread: 0.5,
        }
    }
}
