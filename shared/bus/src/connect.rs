//! How a service reaches NATS: the address, its own credentials and TLS,
//! and the inbox prefix its NATS user may subscribe to. Credentials are
//! never taken from the URL (async-nats ignores them there) and never
//! printed.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::secret::{has_userinfo, redact_url, Secret};
use crate::BusError;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// `nats://host:port` (several, comma-separated); no credentials here.
    pub url: String,
    /// The service's NATS user (`helm/fleet/files/nats.conf`); with
    /// `password` or `password_file`.
    pub user: String,
    pub password: Secret,
    /// A file holding the password (a mounted Secret); read at connect.
    pub password_file: String,
    /// A bare authentication token, instead of a user.
    pub token: Secret,
    /// A file holding an nkey seed (`SU...`), instead of a user.
    pub nkey_seed_file: String,
    /// A `.creds` file (user JWT and nkey seed), instead of a user.
    pub creds_file: String,
    pub tls: NatsTls,
    /// Prefix of this client's reply inboxes. Empty: `_INBOX.<user>` when a
    /// user is set (what `nats.conf` lets that user subscribe to), else
    /// `_INBOX`.
    pub inbox_prefix: String,
    /// Root of every fleet subject (`fleet.obs...`, `fleet.status...`).
    pub subject_root: String,
    /// Root of the Radar projection subjects.
    pub radar_root: String,
    /// Prefix of every stream name (`<prefix>STATUS`,
    /// `<prefix>OBSERVATIONS_P0`).
    pub stream_prefix: String,
    /// P in `hash(device key) mod P`. Each partition is two streams (its
    /// reads and its sessions), each with one unfiltered hub consumer, so
    /// nats-server's cost per message does not grow with P
    /// (`docs/benchmarks.md`, "Streams per partition"); at most P hub
    /// replicas consume.
    pub partitions: u32,
    /// How long an observation stream keeps a message nobody consumed.
    #[serde(with = "humantime_serde")]
    pub observations_max_age: Duration,
    /// How many bytes the reads' observation streams may hold together,
    /// and the sessions' streams too (each stream a P-th); past it
    /// publishes are refused (and retried by the publishers).
    pub observations_max_bytes: i64,
    /// Copies of every stream on a NATS cluster (JetStream's
    /// `num_replicas`): 3 survives one server lost; 1 on a single server.
    pub num_replicas: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsTls {
    /// Refuse a server that does not offer TLS.
    pub required: bool,
    /// PEM file of the CA that signed the server's certificate.
    pub ca_file: String,
    /// PEM client certificate and key, for servers that verify clients.
    pub cert_file: String,
    pub key_file: String,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: "nats://127.0.0.1:4222".into(),
            user: String::new(),
            password: Secret::default(),
            password_file: String::new(),
            token: Secret::default(),
            nkey_seed_file: String::new(),
            creds_file: String::new(),
            tls: NatsTls::default(),
            inbox_prefix: String::new(),
            subject_root: "fleet".into(),
            radar_root: "radar".into(),
            stream_prefix: String::new(),
            partitions: 8,
            observations_max_age: Duration::from_secs(24 * 3600),
            observations_max_bytes: 1 << 30,
            num_replicas: 1,
        }
    }
}

/// A configuration key and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration key {key}: {message}")]
pub struct NatsConfigError {
    pub key: &'static str,
    pub message: String,
}

fn bad(key: &'static str, message: impl Into<String>) -> NatsConfigError {
    NatsConfigError {
        key,
        message: message.into(),
    }
}

impl NatsConfig {
    /// Checks the connection settings; never echoes a credential.
    pub fn validate(&self) -> Result<(), NatsConfigError> {
        if self.url.trim().is_empty() {
            return Err(bad("nats.url", "is required"));
        }
        if has_userinfo(&self.url) {
            return Err(bad(
                "nats.url",
                "carries credentials, which NATS clients ignore there; set nats.user with nats.password or nats.password_file (or nats.token, nats.nkey_seed_file, nats.creds_file) instead",
            ));
        }
        self.server_addrs()?;
        if self.subject_root.trim().is_empty() {
            return Err(bad("nats.subject_root", "is required"));
        }
        if self.partitions == 0 {
            return Err(bad("nats.partitions", "must be at least 1"));
        }
        if !(1..=5).contains(&self.num_replicas) {
            // JetStream's own bounds for a stream's replicas.
            return Err(bad("nats.num_replicas", "must be 1 to 5"));
        }
        let password = !self.password.is_empty() || !self.password_file.is_empty();
        if !self.password.is_empty() && !self.password_file.is_empty() {
            return Err(bad(
                "nats.password_file",
                "set nats.password or nats.password_file, not both",
            ));
        }
        if password && self.user.is_empty() {
            return Err(bad("nats.user", "is required with a password"));
        }
        let methods = [
            !self.user.is_empty(),
            !self.token.is_empty(),
            !self.nkey_seed_file.is_empty(),
            !self.creds_file.is_empty(),
        ]
        .iter()
        .filter(|m| **m)
        .count();
        if methods > 1 {
            return Err(bad(
                "nats.user",
                "choose one of nats.user, nats.token, nats.nkey_seed_file, nats.creds_file",
            ));
        }
        if self.tls.cert_file.is_empty() != self.tls.key_file.is_empty() {
            return Err(bad(
                "nats.tls.key_file",
                "nats.tls.cert_file and nats.tls.key_file go together",
            ));
        }
        if self.inbox_prefix.contains(['*', '>', ' ']) || self.inbox_prefix.ends_with('.') {
            return Err(bad("nats.inbox_prefix", "must be a plain subject prefix"));
        }
        Ok(())
    }

    /// Every server of `url` (comma-separated: the servers of a cluster;
    /// the client moves to another when its own goes away).
    pub fn server_addrs(&self) -> Result<Vec<async_nats::ServerAddr>, NatsConfigError> {
        self.url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| {
                u.parse::<async_nats::ServerAddr>().map_err(|e| {
                    bad(
                        "nats.url",
                        format!("{} is not a NATS server address: {e}", redact_url(u)),
                    )
                })
            })
            .collect()
    }

    /// The URL with any credential in it redacted, for logs and errors.
    pub fn display_url(&self) -> String {
        self.url
            .split(',')
            .map(|u| redact_url(u.trim()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The inbox prefix in effect (see `inbox_prefix`).
    pub fn effective_inbox_prefix(&self) -> String {
        if !self.inbox_prefix.is_empty() {
            self.inbox_prefix.clone()
        } else if !self.user.is_empty() {
            format!("_INBOX.{}", crate::subjects::token(&self.user))
        } else {
            "_INBOX".into()
        }
    }

    /// The options every connection of this service uses.
    pub async fn options(&self, name: &str) -> Result<async_nats::ConnectOptions, BusError> {
        self.validate().map_err(BusError::Config)?;
        let mut o = async_nats::ConnectOptions::new();
        if !self.creds_file.is_empty() {
            o = o
                .credentials_file(&self.creds_file)
                .await
                .map_err(|source| BusError::CredentialFile {
                    key: "nats.creds_file",
                    path: self.creds_file.clone(),
                    source,
                })?;
        } else if !self.nkey_seed_file.is_empty() {
            let seed = read_secret("nats.nkey_seed_file", &self.nkey_seed_file)?;
            o = o.nkey(seed);
        } else if !self.token.is_empty() {
            o = o.token(self.token.expose().to_string());
        } else if !self.user.is_empty() {
            let password = if !self.password_file.is_empty() {
                read_secret("nats.password_file", &self.password_file)?
            } else {
                self.password.expose().to_string()
            };
            o = o.user_and_password(self.user.clone(), password);
        }
        let tls = &self.tls;
        if tls.required || !tls.ca_file.is_empty() || !tls.cert_file.is_empty() {
            install_tls_provider();
            o = o.require_tls(tls.required);
            if !tls.ca_file.is_empty() {
                o = o.add_root_certificates(tls.ca_file.clone().into());
            }
            if !tls.cert_file.is_empty() {
                o = o.add_client_certificate(
                    tls.cert_file.clone().into(),
                    tls.key_file.clone().into(),
                );
            }
        }
        Ok(o.name(name)
            .custom_inbox_prefix(self.effective_inbox_prefix())
            .connection_timeout(Duration::from_secs(3)))
    }

    fn connect_error(&self, source: async_nats::ConnectError) -> BusError {
        BusError::Connect {
            url: self.display_url(),
            user: if self.user.is_empty() {
                "-".into()
            } else {
                self.user.clone()
            },
            source,
        }
    }
}

fn read_secret(key: &'static str, path: &str) -> Result<String, BusError> {
    std::fs::read_to_string(Path::new(path))
        .map(|s| s.trim().to_string())
        .map_err(|source| BusError::CredentialFile {
            key,
            path: path.to_string(),
            source,
        })
}

/// rustls is built without a default crypto provider; TLS (to NATS, to an
/// OTLP collector) needs one. Installing twice is harmless.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Connects with an endless reconnect policy and a client name.
pub async fn connect(config: &NatsConfig, name: &str) -> Result<async_nats::Client, BusError> {
    config
        .options(name)
        .await?
        .retry_on_initial_connect()
        .connect(config.server_addrs().map_err(BusError::Config)?)
        .await
        .map_err(|e| config.connect_error(e))
}

/// Connects and fails fast when nothing answers (for start-up checks).
pub async fn connect_now(config: &NatsConfig, name: &str) -> Result<async_nats::Client, BusError> {
    config
        .options(name)
        .await?
        .connect(config.server_addrs().map_err(BusError::Config)?)
        .await
        .map_err(|e| config.connect_error(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut NatsConfig)) -> NatsConfig {
        let mut c = NatsConfig::default();
        f(&mut c);
        c
    }

    #[test]
    fn credentials_in_the_url_are_refused_without_echoing_them() {
        let c = with(|c| c.url = "nats://hub:s3cret@nats:4222".into());
        let e = c.validate().unwrap_err();
        assert_eq!(e.key, "nats.url");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        assert_eq!(c.display_url(), "nats://hub:<redacted>@nats:4222");
    }

    #[test]
    fn a_cluster_is_every_server_of_the_url_and_replicas_are_bounded() {
        let c = with(|c| c.url = "nats://n1:4222, nats://n2:4222,nats://n3:4222".into());
        assert!(c.validate().is_ok());
        assert_eq!(c.server_addrs().unwrap().len(), 3);
        let e = with(|c| c.url = "nats://n1:4222,nats://n2:notaport".into())
            .validate()
            .unwrap_err();
        assert_eq!(e.key, "nats.url", "{e}");
        for (replicas, ok) in [(0, false), (1, true), (3, true), (5, true), (6, false)] {
            let r = with(|c| c.num_replicas = replicas).validate();
            assert_eq!(r.is_ok(), ok, "{replicas}: {r:?}");
            if let Err(e) = r {
                assert_eq!(e.key, "nats.num_replicas");
            }
        }
    }

    #[test]
    fn one_authentication_method_at_a_time() {
        assert!(with(|c| c.password = Secret::new("x")).validate().is_err());
        assert!(with(|c| {
            c.user = "hub".into();
            c.token = Secret::new("t");
        })
        .validate()
        .is_err());
        assert!(with(|c| {
            c.user = "hub".into();
            c.password = Secret::new("x");
        })
        .validate()
        .is_ok());
        assert!(with(|c| c.tls.cert_file = "c.pem".into())
            .validate()
            .is_err());
    }

    #[test]
    fn the_inbox_prefix_follows_the_user() {
        assert_eq!(NatsConfig::default().effective_inbox_prefix(), "_INBOX");
        assert_eq!(
            with(|c| c.user = "connector-slurm".into()).effective_inbox_prefix(),
            "_INBOX.connector-slurm"
        );
        assert_eq!(
            with(|c| c.inbox_prefix = "_I.x".into()).effective_inbox_prefix(),
            "_I.x"
        );
    }

    #[test]
    fn the_configuration_prints_no_password() {
        let c = with(|c| {
            c.user = "hub".into();
            c.password = Secret::new("s3cret");
        });
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
