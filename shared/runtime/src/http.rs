//! `/healthz`, `/readyz` and `/metrics`, open without a token.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;

use crate::Shutdown;

pub type ReadyCheck =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

#[derive(Clone)]
pub struct Ops {
    pub registry: Arc<Mutex<Registry>>,
    pub ready: ReadyCheck,
}

pub fn router(ops: Ops) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(ops)
}

async fn readyz(State(ops): State<Ops>) -> impl IntoResponse {
    match (ops.ready)().await {
        Ok(()) => (StatusCode::OK, "ready".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}")),
    }
}

async fn metrics(State(ops): State<Ops>) -> impl IntoResponse {
    let mut body = String::new();
    let encoded = {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let registry = ops.registry.lock().unwrap_or_else(|p| p.into_inner());
        encode_registry(&mut body, &registry)
            .and_then(|()| encode_registry(&mut body, crate::process::registry()))
            .and_then(|()| encode_eof(&mut body))
    };
    match encoded {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            String::new(),
        ),
    }
}

/// Binds `listen` and serves until shutdown; returns the bound address.
pub async fn serve(
    listen: &str,
    router: Router,
    mut shutdown: Shutdown,
) -> std::io::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.wait().await })
            .await;
    });
    Ok(addr)
}

/// How long `/readyz` waits for PostgreSQL: a probe answers 503 at once
/// while the database is away instead of hanging on a reconnect.
pub const READY_DB_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(300);

/// PostgreSQL answers `SELECT 1` within [`READY_DB_TIMEOUT`].
pub async fn postgres_ready(pool: &sqlx::PgPool) -> Result<(), String> {
    match tokio::time::timeout(READY_DB_TIMEOUT, sqlx::query("SELECT 1").execute(pool)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => Err("postgres unavailable".into()),
        Err(_) => Err("postgres did not answer in time".into()),
    }
}

/// Ready when NATS is connected and PostgreSQL answers.
pub async fn nats_and_postgres_ready(
    nats: &async_nats::Client,
    pool: &sqlx::PgPool,
) -> Result<(), String> {
    if nats.connection_state() != async_nats::connection::State::Connected {
        return Err("nats disconnected".into());
    }
    postgres_ready(pool).await
}

/// The ops server every service runs: `/healthz`, `/readyz` (NATS
/// connected and PostgreSQL answering) and `/metrics` on `listen`; `key`
/// names the configuration key in the error when it cannot bind.
pub async fn serve_ops(
    listen: &str,
    key: &str,
    registry: Arc<Mutex<Registry>>,
    nats: async_nats::Client,
    pool: sqlx::PgPool,
    shutdown: Shutdown,
) -> anyhow::Result<std::net::SocketAddr> {
    let ops = Ops {
        registry,
        ready: Arc::new(move || {
            let (nats, pool) = (nats.clone(), pool.clone());
            Box::pin(async move { nats_and_postgres_ready(&nats, &pool).await })
        }),
    };
    serve(listen, router(ops), shutdown)
        .await
        .map_err(|e| anyhow::anyhow!("binding {key} {listen}: {e}"))
}
