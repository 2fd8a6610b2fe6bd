//! The store: migrations, the schema check every service runs at start,
//! connecting, and the read queries more than one service shares (latch
//! drift). The hub's own SQL lives in the hub (`services/hub/src/store`).

pub mod deps;
pub mod drift;
pub mod shell;

pub use deps::Deps;
pub use shell::Shell;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::str::FromStr;
use std::time::Duration;

pub use sqlx;

/// How long `/readyz` waits for PostgreSQL: a probe answers 503 at once
/// while the database is away instead of hanging on a reconnect.
pub const READY_TIMEOUT: Duration = Duration::from_millis(300);

/// PostgreSQL answers `SELECT 1` within [`READY_TIMEOUT`].
pub async fn ready(pool: &PgPool) -> Result<(), String> {
    match tokio::time::timeout(READY_TIMEOUT, sqlx::query("SELECT 1").execute(pool)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => Err("postgres unavailable".into()),
        Err(_) => Err("postgres did not answer in time".into()),
    }
}

/// [`ready`] as the ops server's database check.
pub fn ready_check(pool: PgPool) -> fleet_runtime::http::ReadyCheck {
    std::sync::Arc::new(move || {
        let pool = pool.clone();
        Box::pin(async move { ready(&pool).await })
    })
}

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot reach PostgreSQL at {url}: {source}. Start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start")]
    Connect {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error(
        "database {database} does not exist at {url}: create and migrate it with `fleet migrate`"
    )]
    NoDatabase { database: String, url: String },
    #[error(
        "database schema is at migration {current}, this build needs {needed}: run `fleet migrate`"
    )]
    SchemaBehind { current: i64, needed: i64 },
    #[error("database: {0}")]
    Db(sqlx::Error),
    /// PostgreSQL is away or refusing work for now (connection lost, shut
    /// down, out of connections, serialization failure): retry later; the
    /// input was not at fault.
    #[error("database unavailable: {0}")]
    Unavailable(sqlx::Error),
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored row is not valid: {0}")]
    Corrupt(String),
}

/// The PostgreSQL role a service works as (`migrations/0007_roles.sql`):
/// what it may write is granted to the role, so a service cannot write
/// another's tables even by mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Hub,
    Api,
    Placer,
    Gateway,
    Radar,
    Workflow,
}

impl Role {
    pub const ALL: [Role; 6] = [
        Role::Hub,
        Role::Api,
        Role::Placer,
        Role::Gateway,
        Role::Radar,
        Role::Workflow,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Role::Hub => "fleet_hub",
            Role::Api => "fleet_api",
            Role::Placer => "fleet_placer",
            Role::Gateway => "fleet_gateway",
            Role::Radar => "fleet_radar",
            Role::Workflow => "fleet_workflow",
        }
    }

    /// The NATS client name of the service working as this role.
    pub const fn client_name(self) -> &'static str {
        match self {
            Role::Hub => "fleet-hub",
            Role::Api => "fleet-api",
            Role::Placer => "fleet-placer",
            Role::Gateway => "fleet-gateway",
            Role::Radar => "fleet-radar",
            Role::Workflow => "fleet-workflow",
        }
    }
}

/// `options` whose sessions start as `role` (PostgreSQL's `role` setting,
/// the same as `SET ROLE` on every new connection). The user in the URL
/// must be a member of the role; PostgreSQL refuses the connection
/// otherwise ("permission denied to set role").
pub fn as_role(options: PgConnectOptions, role: Option<Role>) -> PgConnectOptions {
    match role {
        Some(role) => options.options([("role", role.name())]),
        None => options,
    }
}

/// A pool that fails fast when PostgreSQL is away (readiness turns false,
/// requests answer 503) and reconnects on its own when it is back. It
/// connects as the URL's user: tools and migrations; services use
/// [`connect_as`].
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, StoreError> {
    connect_as(url, max_connections, None).await
}

/// [`connect`], every session working as `role` (see [`as_role`]).
pub async fn connect_as(
    url: &str,
    max_connections: u32,
    role: Option<Role>,
) -> Result<PgPool, StoreError> {
    let options = parse_url(url)?;
    pool(url, as_role(options, role), max_connections).await
}

/// The pool of `service`: its sessions work as its role when `set_role`
/// (see [`as_role`]). The hub's sessions also run without JIT
/// compilation: its statements are short, and compiling one cost more
/// than running it (the sweeper's look at due devices, 0.05 ms to run,
/// was compiled for 0.4 - 2.7 s when stale statistics put its estimate
/// above `jit_above_cost`; `docs/benchmarks.md`, "The sweeper reads only
/// what is due").
pub async fn connect_service(
    url: &str,
    max_connections: u32,
    service: Role,
    set_role: bool,
) -> Result<PgPool, StoreError> {
    let options = as_role(parse_url(url)?, set_role.then_some(service));
    let options = match service {
        Role::Hub => options.options([("jit", "off")]),
        _ => options,
    };
    pool(url, options, max_connections).await
}

fn parse_url(url: &str) -> Result<PgConnectOptions, StoreError> {
    PgConnectOptions::from_str(url).map_err(|source| StoreError::Connect {
        url: redact(url),
        source,
    })
}

async fn pool(
    url: &str,
    options: PgConnectOptions,
    max_connections: u32,
) -> Result<PgPool, StoreError> {
    let database = options.get_database().unwrap_or_default().to_string();
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
        .map_err(|source| match &source {
            // 3D000 invalid_catalog_name: PostgreSQL answers, the database
            // is missing.
            sqlx::Error::Database(db) if db.code().as_deref() == Some("3D000") => {
                StoreError::NoDatabase {
                    database,
                    url: redact(url),
                }
            }
            _ => StoreError::Connect {
                url: redact(url),
                source,
            },
        })
}

/// Creates the database named in the URL when it does not exist
/// (`fleet migrate`, `fleet dev`, the tests).
pub async fn ensure_database(url: &str) -> Result<(), StoreError> {
    use sqlx::ConnectOptions;
    let opts = PgConnectOptions::from_str(url).map_err(|source| StoreError::Connect {
        url: redact(url),
        source,
    })?;
    let name = opts.get_database().unwrap_or("postgres").to_string();
    let mut conn = opts
        .clone()
        .database("postgres")
        .connect()
        .await
        .map_err(|source| StoreError::Connect {
            url: redact(url),
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

/// The URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// Refuses to run on a schema older than this build's migrations.
pub async fn check_schema(pool: &PgPool) -> Result<(), StoreError> {
    let needed = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    let current: i64 = if exists {
        sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM _sqlx_migrations WHERE success")
            .fetch_one(pool)
            .await?
    } else {
        0
    };
    if current < needed {
        return Err(StoreError::SchemaBehind { current, needed });
    }
    Ok(())
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if is_transient(&e) {
            StoreError::Unavailable(e)
        } else {
            StoreError::Db(e)
        }
    }
}

impl StoreError {
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::Connect { .. } | StoreError::NoDatabase { .. }
        )
    }
}

/// Errors that say nothing about the input: the server or the connection.
pub fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            // 08 connection exception, 53 insufficient resources, 57
            // operator intervention (shutdown, terminated), 40 rollback
            // (serialization, deadlock), 55000 database not accepting
            // connections.
            ["08", "53", "57", "40"].iter().any(|c| code.starts_with(c)) || code == "55000"
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redacts_passwords() {
        assert_eq!(
            super::redact("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(
            super::redact("postgres://postgres@127.0.0.1/db"),
            "postgres://postgres@127.0.0.1/db"
        );
    }
}
