//! What every database service connects to at start, once: its pool
//! (working as its own role, the schema checked), NATS, JetStream and the
//! names of its subjects and streams.

use async_nats::jetstream;
use fleet_bus::{StreamNames, Subjects};
use fleet_runtime::Common;
use sqlx::PgPool;

use std::time::Duration;

use crate::{Role, StoreError};

pub struct Deps {
    pub pool: PgPool,
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub subjects: Subjects,
    pub streams: StreamNames,
}

/// How long a service's start waits out PostgreSQL or NATS being away (a
/// restart, a failover, every connection slot taken for a moment) before it
/// gives up with the last error.
pub const START_RETRY_FOR: Duration = Duration::from_secs(30);

impl Deps {
    /// Connects as `role` (when `database.set_role`), checks the schema is
    /// this build's, and connects to NATS as `fleet-<service>`. PostgreSQL
    /// or NATS unreachable is tried again with back-off for
    /// [`START_RETRY_FOR`]; a missing database or a schema behind this
    /// build fails at once (no wait makes them pass).
    pub async fn connect(common: &Common, role: Role) -> anyhow::Result<Deps> {
        let deadline = tokio::time::Instant::now() + START_RETRY_FOR;
        let mut wait = Duration::from_millis(250);
        loop {
            match Self::connect_once(common, role).await {
                Ok(d) => return Ok(d),
                Err(e) if tokio::time::Instant::now() + wait < deadline && transient(&e) => {
                    tracing::warn!(service = role.client_name(), error = %format!("{e:#}"), retry_in_ms = wait.as_millis() as u64, "dependencies not reachable at start; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(4));
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn connect_once(common: &Common, role: Role) -> anyhow::Result<Deps> {
        let pool = crate::connect_service(
            &common.database.url,
            common.database.max_connections,
            role,
            common.database.set_role,
        )
        .await?;
        crate::check_schema(&pool).await?;
        let nats = fleet_bus::connect_now(&common.nats, role.client_name()).await?;
        let js = jetstream::new(nats.clone());
        Ok(Deps {
            pool,
            nats,
            js,
            subjects: Subjects::new(&common.nats.subject_root, &common.nats.radar_root),
            streams: StreamNames::new(&common.nats.stream_prefix),
        })
    }
}

/// Whether waiting may help: PostgreSQL or NATS unreachable, not a missing
/// database, a schema behind, or a refused role.
fn transient(e: &anyhow::Error) -> bool {
    match e.downcast_ref::<StoreError>() {
        Some(StoreError::Connect { source, .. }) => !matches!(
            source,
            // 28000 invalid_authorization_specification, 28P01 bad
            // password, 42501 permission denied (to set role).
            sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("28000" | "28P01" | "42501"))
        ),
        Some(StoreError::Unavailable(_)) => true,
        Some(_) => false,
        None => matches!(
            e.downcast_ref::<fleet_bus::BusError>(),
            Some(fleet_bus::BusError::Connect { source, .. })
                if !matches!(
                    source.kind(),
                    async_nats::ConnectErrorKind::AuthorizationViolation
                        | async_nats::ConnectErrorKind::Authentication
                )
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_waiting_may_fix_is_retried() {
        let unreachable = StoreError::Connect {
            url: "postgres://x".into(),
            source: sqlx::Error::PoolTimedOut,
        };
        assert!(transient(&unreachable.into()));
        let missing = StoreError::NoDatabase {
            database: "fleet".into(),
            url: "postgres://x".into(),
        };
        assert!(!transient(&missing.into()));
        let behind = StoreError::SchemaBehind {
            current: 3,
            needed: 9,
        };
        assert!(!transient(&behind.into()));
        assert!(!transient(&anyhow::anyhow!("a configuration error")));
    }
}
