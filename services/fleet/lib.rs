//! The `fleet` binary's library side: what several subcommands (and the
//! integration tests) share.

pub mod api_cmd;
pub mod bench;
pub mod cli;

use anyhow::Context;
use fleet_runtime::FleetConfig;

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
