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
    /// How the device names this connector reads are rewritten before
    /// they key an observation (`name` keys only), so a source that spells
    /// a host differently from NetBox still resolves.
    pub name_keys: NameKeys,
}

/// `connectors.<name>.poll.name_keys`: a per-source normalisation of `name`
/// keys. Both off: names are sent as the source spells them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NameKeys {
    /// `GPU06` -> `gpu06`.
    pub lowercase: bool,
    /// `gpu05.dc1.example.com` -> `gpu05` (a name that is an IP address is
    /// left as it is).
    pub strip_domain: bool,
}

impl NameKeys {
    /// `name` as this source's devices are named in the fleet.
    pub fn apply(&self, name: &str) -> String {
        let mut n = name.trim();
        if self.strip_domain && n.parse::<std::net::IpAddr>().is_err() {
            if let Some((host, _)) = n.split_once('.') {
                if !host.is_empty() {
                    n = host;
                }
            }
        }
        if self.lowercase {
            n.to_lowercase()
        } else {
            n.to_string()
        }
    }

    pub fn is_identity(&self) -> bool {
        !self.lowercase && !self.strip_domain
    }
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
            name_keys: NameKeys::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 19: "Ironic's GPU06 and gpu05.dc1.example.com do not match
    /// NetBox's gpu06 / gpu05".
    #[test]
    fn name_keys_fold_case_and_domains_as_configured() {
        let both = NameKeys {
            lowercase: true,
            strip_domain: true,
        };
        for (from, to) in [
            ("GPU06", "gpu06"),
            ("gpu05.dc1.example.com", "gpu05"),
            ("GPU07.DC1.EXAMPLE.COM", "gpu07"),
            (" gpu08 ", "gpu08"),
            ("10.0.0.5", "10.0.0.5"),
            ("fe80::1", "fe80::1"),
            (".hidden", ".hidden"),
        ] {
            assert_eq!(both.apply(from), to, "{from}");
        }
        let off = NameKeys::default();
        assert!(off.is_identity());
        assert_eq!(off.apply("GPU06.dc1"), "GPU06.dc1");
        let case = NameKeys {
            lowercase: true,
            strip_domain: false,
        };
        assert_eq!(case.apply("GPU05.DC1"), "gpu05.dc1");
    }
}
