//! NATS and PostgreSQL for a dev run: the configured ones when they answer,
//! else a `nats-server -js` and a throwaway PostgreSQL cluster started from
//! the machine's binaries in a temporary directory, stopped on exit.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::process::{Child, Command};

/// What this run started itself; `stop` ends it and removes its files.
#[derive(Default)]
pub struct Infra {
    pub nats: Option<Child>,
    pub postgres: Option<(PathBuf, PathBuf)>,
    pub dir: Option<PathBuf>,
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// `host:port` of a URL like `nats://h:p` or `postgres://u@h:p/db`.
fn host_port(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let rest = rest.split(['/', '?']).next().unwrap_or(rest);
    let rest = rest.rsplit_once('@').map(|(_, r)| r).unwrap_or(rest);
    let first = rest.split(',').next().unwrap_or(rest);
    if first.contains(':') {
        first.to_string()
    } else {
        format!("{first}:{default_port}")
    }
}

pub async fn answers(url: &str, default_port: u16) -> bool {
    let addr = host_port(url, default_port);
    matches!(
        tokio::time::timeout(
            Duration::from_millis(800),
            tokio::net::TcpStream::connect(&addr)
        )
        .await,
        Ok(Ok(_))
    )
}

fn find_binary(name: &str, candidates: &[PathBuf]) -> Option<PathBuf> {
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .or_else(|| {
            std::env::var_os("PATH").and_then(|path| {
                std::env::split_paths(&path)
                    .map(|d| d.join(name))
                    .find(|p| p.is_file())
            })
        })
}

fn postgres_bin(name: &str) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin").join(name))
                .collect()
        })
        .unwrap_or_default();
    // The newest major version first.
    candidates.sort();
    candidates.reverse();
    find_binary(name, &candidates)
}

/// PostgreSQL refuses to run as root: as root, run its tools as the
/// `postgres` user (which the Debian package creates) through `runuser`.
async fn as_postgres_user(bin: &Path) -> Command {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .await
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

impl Infra {
    fn dir(&mut self) -> anyhow::Result<PathBuf> {
        if let Some(d) = &self.dir {
            return Ok(d.clone());
        }
        let d = std::env::temp_dir().join(format!(
            "fleet-dev-{}",
            ulid::Ulid::new().to_string().to_lowercase()
        ));
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        self.dir = Some(d.clone());
        Ok(d)
    }

    /// Starts `nats-server -js` on a free port; returns its URL.
    pub async fn start_nats(&mut self) -> anyhow::Result<String> {
        let Some(bin) = find_binary("nats-server", &[PathBuf::from("/usr/sbin/nats-server")])
        else {
            bail!("NATS does not answer and there is no nats-server binary to start one: install it with `apt-get install nats-server` (Debian package nats-server)");
        };
        let port = free_port()?;
        let store = self.dir()?.join("nats");
        std::fs::create_dir_all(&store)?;
        let child = Command::new(&bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: a Ctrl-C meant for `fleet dev` must
            // not stop it before the services have let go of it.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        self.nats = Some(child);
        let url = format!("nats://127.0.0.1:{port}");
        wait_until_answers(&url, 4222, "nats-server").await?;
        Ok(url)
    }

    /// initdb in a temporary directory, `pg_ctl start` on a free port with
    /// trust authentication; returns the admin URL (database `postgres`).
    pub async fn start_postgres(&mut self) -> anyhow::Result<String> {
        let (Some(initdb), Some(pg_ctl)) = (postgres_bin("initdb"), postgres_bin("pg_ctl")) else {
            bail!("PostgreSQL does not answer and there is no initdb/pg_ctl to start one: install it with `apt-get install postgresql` (Debian package postgresql)");
        };
        let port = free_port()?;
        let dir = self.dir()?;
        let data = dir.join("pgdata");
        // Harmless when not root; as root the postgres user must own the files.
        let _ = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(&dir)
            .output()
            .await;
        let out = as_postgres_user(&initdb)
            .await
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "-D",
            ])
            .arg(&data)
            .output()
            .await
            .with_context(|| format!("running {}", initdb.display()))?;
        if !out.status.success() {
            bail!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let log = self.dir()?.join("postgres.log");
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            data.display()
        );
        let out = as_postgres_user(&pg_ctl)
            .await
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .args(["-o", &opts, "-w", "start"])
            .process_group(0)
            .output()
            .await
            .with_context(|| format!("running {}", pg_ctl.display()))?;
        if !out.status.success() {
            bail!(
                "pg_ctl start failed (log {}): {}",
                log.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        self.postgres = Some((pg_ctl, data));
        Ok(format!("postgres://postgres@127.0.0.1:{port}/postgres"))
    }

    /// Stops what was started and removes the temporary directory.
    pub async fn stop(&mut self) {
        if let Some((pg_ctl, data)) = self.postgres.take() {
            let r = as_postgres_user(&pg_ctl)
                .await
                .arg("-D")
                .arg(&data)
                .args(["-m", "immediate", "-w", "-t", "10", "stop"])
                .output()
                .await;
            if let Err(e) = r {
                tracing::warn!(error = %e, "pg_ctl stop");
            }
        }
        if let Some(mut child) = self.nats.take() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
        if let Some(dir) = self.dir.take() {
            remove_dir(&dir);
        }
    }

    /// Whether a process this run started is still running.
    pub fn anything_running(&mut self) -> bool {
        let nats = self
            .nats
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
        nats || self.postgres.is_some()
    }
}

fn remove_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "removing the temporary directory");
    }
}

async fn wait_until_answers(url: &str, port: u16, what: &str) -> anyhow::Result<()> {
    for _ in 0..100 {
        if answers(url, port).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{what} started but does not answer at {url}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_and_port_of_urls() {
        assert_eq!(
            super::host_port("nats://127.0.0.1:4222", 4222),
            "127.0.0.1:4222"
        );
        assert_eq!(super::host_port("nats://localhost", 4222), "localhost:4222");
        assert_eq!(
            super::host_port("postgres://postgres:pw@db:6543/fleet?x=1", 5432),
            "db:6543"
        );
        assert_eq!(
            super::host_port("postgres://postgres@h/fleet", 5432),
            "h:5432"
        );
    }
}
