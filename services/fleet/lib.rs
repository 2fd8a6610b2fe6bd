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

pub async fn ensure_database(url: &str) -> anyhow::Result<()> {
    use sqlx::postgres::PgConnectOptions;
    use sqlx::ConnectOptions;
    use std::str::FromStr;
    let opts = PgConnectOptions::from_str(url).context("database.url")?;
    let name = opts.get_database().unwrap_or("postgres").to_string();
    let admin = opts.clone().database("postgres");
    let mut conn = admin
        .connect()
        .await
        .map_err(|source| fleet_store::StoreError::Connect {
            url: fleet_store::redact(url),
            source,
        })?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut conn)
            .await?;
    if !exists {
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        sqlx::query(&format!("CREATE DATABASE {quoted}"))
            .execute(&mut conn)
            .await?;
    }
    Ok(())
}
