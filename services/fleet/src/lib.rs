//! The `fleet` binary's library side: what several subcommands (and the
//! integration tests) share.

pub mod api_cmd;
pub mod bench;
pub mod cli;
pub mod config;
pub mod connector_cmd;
pub mod dev;
pub mod inventory_cmd;

use crate::config::FleetConfig;
use anyhow::Context;

/// Creates the database named in the URL when it does not exist, then
/// migrates it.
pub async fn migrate(config: &FleetConfig) -> anyhow::Result<()> {
    ensure_database(&config.database.url).await?;
    let pool = fleet_store::connect(&config.database.url, 2).await?;
    fleet_store::migrate(&pool)
        .await
        .context("running migrations")?;
    tracing::info!(url = %fleet_store::redact(&config.database.url), "database migrated");
    Ok(())
}

/// Creates the database named in the URL when it does not exist.
pub async fn ensure_database(url: &str) -> anyhow::Result<()> {
    Ok(fleet_store::ensure_database(url).await?)
}

/// `fleet probe host:port/path`: a plain HTTP/1.0 GET, 2xx or an error.
pub async fn probe(target: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let target = target.trim_start_matches("http://");
    let (addr, path) = target
        .split_once('/')
        .map(|(a, p)| (a, format!("/{p}")))
        .unwrap_or((target, "/".into()));
    let answer = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut head = vec![0u8; 64];
        let n = s.read(&mut head).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&head[..n]).to_string())
    })
    .await
    .map_err(|_| anyhow::anyhow!("{addr}{path} did not answer within 2 s"))?
    .with_context(|| format!("{addr}{path}"))?;
    let status = answer.split_whitespace().nth(1).unwrap_or("");
    anyhow::ensure!(status.starts_with('2'), "{addr}{path} answered {status}");
    Ok(())
}
