//! `fleet api` and `fleet token ...`.

use anyhow::{bail, Context};
use clap::Subcommand;
use fleet_api::Scope;
use fleet_runtime::Shutdown;

use crate::config::FleetConfig;

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Create a token; it is printed once and stored only as its SHA-256.
    Create {
        /// Comma-separated: device:read, device:write, conditions:write,
        /// enrollment-proof:write, operations:write, jobs:write, jobs:confirm, admin.
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<String>,
        /// What it is for (shown by `list`).
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List tokens (ids, scopes, descriptions; never the tokens).
    List,
    /// Revoke a token by id.
    Revoke {
        /// The id, as `list` shows it.
        id: String,
    },
}

/// Runs the API until SIGINT/SIGTERM.
pub async fn api(config: FleetConfig) -> anyhow::Result<()> {
    let (_trigger, shutdown) = Shutdown::from_signals();
    fleet_api::run(config.common(), config.api, shutdown).await
}

pub async fn token(config: FleetConfig, what: TokenCommand) -> anyhow::Result<()> {
    let pool = fleet_store::connect(&config.database.url, 2).await?;
    fleet_store::check_schema(&pool).await?;
    match what {
        TokenCommand::Create {
            scopes,
            description,
        } => {
            let mut parsed = Vec::new();
            for s in scopes.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
                match Scope::parse(s) {
                    Some(p) => parsed.push(p),
                    None => bail!(
                        "unknown scope {s:?}; known: {}",
                        Scope::ALL
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
            }
            if parsed.is_empty() {
                bail!("--scopes names no scope");
            }
            let (id, token) = fleet_api::create_token(&pool, &parsed, &description)
                .await
                .context("storing the token")?;
            eprintln!("created token {id}; it is shown once:");
            println!("{token}");
        }
        TokenCommand::List => {
            let rows: Vec<(
                String,
                Vec<String>,
                String,
                chrono::DateTime<chrono::Utc>,
                bool,
            )> = sqlx::query_as(
                "SELECT id, scopes, description, created_at, revoked_at IS NOT NULL \
                     FROM api_tokens ORDER BY created_at",
            )
            .fetch_all(&pool)
            .await?;
            for (id, scopes, description, created_at, revoked) in rows {
                println!(
                    "{id}\t{}\t{}\t{description}{}",
                    scopes.join(","),
                    created_at.to_rfc3339(),
                    if revoked { "\t(revoked)" } else { "" }
                );
            }
        }
        TokenCommand::Revoke { id } => {
            let n = sqlx::query(
                "UPDATE api_tokens SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL",
            )
            .bind(&id)
            .execute(&pool)
            .await?
            .rows_affected();
            if n == 0 {
                bail!("no live token {id}");
            }
            eprintln!("revoked {id}");
        }
    }
    Ok(())
}
