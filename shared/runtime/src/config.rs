//! Configuration. Each service crate owns its section (`fleet_hub::Config`,
//! `fleet_api::Config`, ...) with its defaults and its validation; this
//! module holds what they all share: [`Common`] (where PostgreSQL and NATS
//! are, logging, shutdown, freshness), the pieces sections are made of
//! (durations, [`Credential`]), and the one loader: built-in defaults, then
//! an optional file (`--config fleet.toml`), then the environment
//! (`FLEET__HUB__BATCH_SIZE=64`, `FLEET__HUB__LINGER=20ms`). The `fleet`
//! binary composes the sections (`fleet::config::FleetConfig`).
//!
//! Durations are written as durations: `"30s"`, `"500ms"`, `"7days"`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use fleet_bus::{NatsConfig, NatsTls, Secret};

/// The sections every service reads: where PostgreSQL and NATS are, how it
/// logs and stops, and when an observation or a session goes stale.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Common {
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    pub log: LogConfig,
    /// How every service stops.
    pub shutdown: ShutdownConfig,
    /// The hub derives with it, the API marks rows stale with it, the
    /// gateway and the sweeper read liveness from it: one section, so they
    /// never disagree.
    pub freshness: FreshnessConfig,
}

impl Common {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.database.url.trim().is_empty() {
            return Err(ConfigError::invalid("database.url", "is required"));
        }
        self.nats
            .validate()
            .map_err(|e| ConfigError::invalid(e.key, e.message))?;
        self.freshness.validate()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    pub url: String,
    pub max_connections: u32,
    /// Each service works as its own PostgreSQL role (`fleet_hub`,
    /// `fleet_api`, ...; `migrations/0007_roles.sql`), which the URL's user
    /// must be a member of. `false` works as the URL's user itself.
    pub set_role: bool,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: "postgres://postgres@127.0.0.1:5432/fleet".into(),
            max_connections: 16,
            set_role: true,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: String,
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: "text".into(),
            filter: "info".into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// How long a SIGTERM gives a service's tasks to finish what they hold
    /// (a batch, an answer, the outbox flush) before the rest is aborted
    /// (and redelivered).
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            grace: Duration::from_secs(20),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FreshnessConfig {
    /// Freshness TTL when a source has none of its own.
    #[serde(with = "humantime_serde")]
    pub default_ttl: Duration,
    /// Per-source TTL (`FLEET__FRESHNESS__TTL__SLURM=90s`). A source's `-`
    /// may be written `_`, since an environment variable cannot hold `-`
    /// (`FLEET__FRESHNESS__TTL__HEALTH_STATUS` is `health-status`).
    #[serde(with = "source_durations")]
    pub ttl: BTreeMap<String, Duration>,
    /// A device whose node agent sent no heartbeat for this long is
    /// `unreachable`...
    #[serde(with = "humantime_serde")]
    pub unreachable_after: Duration,
    /// ... and for this long, `lost`.
    #[serde(with = "humantime_serde")]
    pub lost_after: Duration,
}

impl Default for FreshnessConfig {
    fn default() -> Self {
        FreshnessConfig {
            default_ttl: Duration::from_secs(180),
            ttl: BTreeMap::new(),
            unreachable_after: Duration::from_secs(60),
            lost_after: Duration::from_secs(600),
        }
    }
}

impl FreshnessConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.default_ttl < Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                "freshness.default_ttl",
                "must be at least 1s",
            ));
        }
        if let Some((source, _)) = self.ttl.iter().find(|(_, t)| **t < Duration::from_secs(1)) {
            return Err(ConfigError::invalid(
                format!("freshness.ttl.{source}"),
                "must be at least 1s",
            ));
        }
        if self.lost_after < self.unreachable_after {
            return Err(ConfigError::invalid(
                "freshness.lost_after",
                "must not be shorter than freshness.unreachable_after",
            ));
        }
        Ok(())
    }
}

/// `BTreeMap<source, Duration>` written as durations, with a source's `_`
/// read as `-` (one spelling in a file, the environment and `fleet config`).
mod source_durations {
    use super::*;

    pub fn serialize<S: serde::Serializer>(
        m: &BTreeMap<String, Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let shown: BTreeMap<&str, String> = m
            .iter()
            .map(|(k, v)| (k.as_str(), humantime::format_duration(*v).to_string()))
            .collect();
        shown.serialize(s)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, Duration>, D::Error> {
        let raw = BTreeMap::<String, String>::deserialize(d)?;
        raw.into_iter()
            .map(|(k, v)| {
                let t = humantime::parse_duration(v.trim()).map_err(|e| {
                    serde::de::Error::custom(format!(
                        "{k}: {e} (a duration such as \"90s\" or \"5m\")"
                    ))
                })?;
                Ok((k.replace('_', "-"), t))
            })
            .collect()
    }
}

/// Where a credential comes from: the value itself (best set through the
/// environment), a file (read on every use, so a rotated token needs no
/// restart), or the name of an environment variable. Never printed:
/// `Debug` and `Serialize` redact the value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
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

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("configuration key {key}: {message}")]
    Invalid { key: String, message: String },
}

impl ConfigError {
    pub fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// What [`load`] needs to know of the configuration it builds besides its
/// type.
#[derive(Debug, Default, Clone, Copy)]
pub struct Layout<'a> {
    /// Keys whose environment value is a comma-separated list
    /// (`FLEET__SECTION__KEY=a,b,c`).
    pub lists: &'a [&'a str],
    /// Keys that moved, with where they went: a configuration still
    /// setting one is refused at start instead of being ignored.
    pub moved: &'a [(&'a str, &'a str)],
}

/// Builds `T` from its defaults, then `file`, then the environment
/// (`FLEET__SECTION__KEY`; `env` instead of the process's when given, so a
/// test can load exactly what compose or Helm hands a service). A key the
/// defaults do not have is refused by name, never ignored; a key that
/// became a duration (`hub.linger_ms`) says what it is called now.
pub fn load<T>(
    file: Option<&Path>,
    env: Option<HashMap<String, String>>,
    layout: Layout<'_>,
) -> Result<T, ConfigError>
where
    T: Default + Serialize + DeserializeOwned,
{
    let defaults = T::default();
    let mut b = config::Config::builder().add_source(config::Config::try_from(&defaults)?);
    if let Some(f) = file {
        b = b.add_source(config::File::from(f).required(true));
    }
    let mut environment = config::Environment::with_prefix("FLEET")
        .prefix_separator("__")
        .separator("__")
        .try_parsing(true);
    // Without named keys, a list separator would make every value a list.
    if !layout.lists.is_empty() {
        environment = environment.list_separator(",");
        for key in layout.lists {
            environment = environment.with_list_parse_key(key);
        }
    }
    let built = b.add_source(environment.source(env)).build()?;
    for (old, new) in layout.moved {
        if built.get::<config::Value>(old).is_ok() {
            return Err(ConfigError::invalid(*old, format!("has moved to {new}")));
        }
    }
    let known = serde_json::to_value(&defaults)
        .map_err(|e| ConfigError::invalid("", format!("defaults do not serialize: {e}")))?;
    let given: serde_json::Value = built.clone().try_deserialize()?;
    check_keys("", &given, &known)?;
    Ok(built.try_deserialize()?)
}

/// Refuses a key of `given` that `known` (the defaults) does not have. An
/// empty object in the defaults is a map (sites, per-source TTLs): what is
/// under it is the entries', checked by their own types.
fn check_keys(
    prefix: &str,
    given: &serde_json::Value,
    known: &serde_json::Value,
) -> Result<(), ConfigError> {
    let (Some(given), Some(known)) = (given.as_object(), known.as_object()) else {
        return Ok(());
    };
    if known.is_empty() {
        return Ok(());
    }
    for (k, v) in given {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match known.get(k) {
            Some(kv) => check_keys(&key, v, kv)?,
            None => {
                let stem = k.strip_suffix("_secs").or_else(|| k.strip_suffix("_ms"));
                let message = match stem.filter(|s| known.contains_key(*s)) {
                    Some(s) => format!(
                        "is now `{}`, a duration such as \"30s\" or \"500ms\"",
                        if prefix.is_empty() {
                            s.to_string()
                        } else {
                            format!("{prefix}.{s}")
                        }
                    ),
                    None => "is not a configuration key".to_string(),
                };
                return Err(ConfigError::invalid(key, message));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn common(pairs: &[(&str, &str)]) -> Result<Common, ConfigError> {
        load::<Common>(None, env(pairs), Layout::default())
    }

    #[test]
    fn durations_are_written_as_durations() {
        let c = common(&[
            ("FLEET__SHUTDOWN__GRACE", "1m 30s"),
            ("FLEET__FRESHNESS__UNREACHABLE_AFTER", "500ms"),
        ])
        .unwrap();
        assert_eq!(c.shutdown.grace, Duration::from_secs(90));
        assert_eq!(c.freshness.unreachable_after, Duration::from_millis(500));
        let err = common(&[("FLEET__SHUTDOWN__GRACE", "soon")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("grace"), "{err}");
    }

    #[test]
    fn a_key_that_became_a_duration_says_its_new_name() {
        let err = common(&[("FLEET__SHUTDOWN__GRACE_SECS", "20")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("shutdown.grace_secs") && err.contains("`shutdown.grace`"),
            "{err}"
        );
        let err = common(&[("FLEET__DATABASE__URLL", "x")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("database.urll") && err.contains("not a configuration key"),
            "{err}"
        );
    }

    #[test]
    fn a_source_with_a_hyphen_can_be_set_from_the_environment() {
        let c = common(&[
            ("FLEET__FRESHNESS__TTL__HEALTH_STATUS", "90s"),
            ("FLEET__FRESHNESS__TTL__SLURM", "30s"),
        ])
        .unwrap();
        let ttl = &c.freshness.ttl;
        assert_eq!(ttl.get("health-status"), Some(&Duration::from_secs(90)));
        assert_eq!(ttl.get("slurm"), Some(&Duration::from_secs(30)));
        assert!(!ttl.contains_key("health_status"));
        let shown = serde_json::to_value(&c.freshness).unwrap();
        assert_eq!(shown["ttl"]["health-status"], "1m 30s");
    }

    #[test]
    fn validation_names_the_key() {
        let mut c = Common::default();
        c.freshness.lost_after = Duration::from_secs(1);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("freshness.lost_after"), "{err}");
        c = Common::default();
        c.database.url = " ".into();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("database.url"));
    }

    #[test]
    fn moved_keys_are_refused_with_where_they_went() {
        let err = load::<Common>(
            None,
            env(&[("FLEET__DATABASE__URL", "postgres://x")]),
            Layout {
                lists: &[],
                moved: &[("database.url", "somewhere.else")],
            },
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("somewhere.else"), "{err}");
    }

    #[test]
    fn secrets_never_print() {
        let c = Credential {
            value: Secret::new("hunter2"),
            ..Default::default()
        };
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(!serde_json::to_string(&c).unwrap().contains("hunter2"));
        assert_eq!(
            c.resolve("k").unwrap().map(|s| s.expose().to_string()),
            Some("hunter2".into())
        );
    }

    #[test]
    fn credential_sources() {
        let path = std::env::temp_dir().join(format!("fleet-cred-{}", std::process::id()));
        std::fs::write(&path, "tok-from-file\n").unwrap();
        let c = Credential {
            file: path.display().to_string(),
            ..Default::default()
        };
        assert_eq!(c.resolve("k").unwrap().unwrap().expose(), "tok-from-file");
        std::fs::remove_file(&path).unwrap();
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
}
