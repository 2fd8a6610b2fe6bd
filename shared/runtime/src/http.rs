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

/// Ready when NATS is connected.
pub fn nats_ready(nats: &async_nats::Client) -> Result<(), String> {
    if nats.connection_state() != async_nats::connection::State::Connected {
        return Err("nats disconnected".into());
    }
    Ok(())
}

/// The ops server every service runs: `/healthz`, `/readyz` (NATS
/// connected and the service's own `database` check passing, for example
/// `fleet_store::ready_check`) and `/metrics` on `listen`; `key` names the
/// configuration key in the error when it cannot bind.
pub async fn serve_ops(
    listen: &str,
    key: &str,
    registry: Arc<Mutex<Registry>>,
    nats: async_nats::Client,
    database: ReadyCheck,
    shutdown: Shutdown,
) -> anyhow::Result<std::net::SocketAddr> {
    let ops = Ops {
        registry,
        ready: Arc::new(move || {
            let (nats, database) = (nats.clone(), database.clone());
            Box::pin(async move {
                nats_ready(&nats)?;
                database().await
            })
        }),
    };
    serve(listen, router(ops), shutdown)
        .await
        .map_err(|e| anyhow::anyhow!("binding {key} {listen}: {e}"))
}

/// A loopback address free right now, for a listener bound a little later
/// (`fleet dev`'s services, the tests' ops servers). A port from the
/// kernel's ephemeral range (`bind(0)`, 32768-60999 on Linux) can be taken
/// in between as the local port of any outgoing connection (every
/// PostgreSQL and NATS client on the machine opens some), and the listener
/// then fails to bind; below that range only another listener can take it.
/// The pick starts at a point that differs per process and call, so two
/// processes picking at once rarely meet. Falls back to `bind(0)`.
pub fn free_listen_addr() -> std::io::Result<std::net::SocketAddr> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let seed = nanos
        ^ (u64::from(std::process::id()) << 20)
        ^ CALLS
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9);
    // Ports this process handed out already: nothing listens on one until
    // its service starts, so a second pick could land on it (fleet dev's
    // NetBox and OpenStack connectors were once given the same port, and
    // the second could not listen).
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..64u64 {
        let port = 20_000 + (seed.wrapping_add(i.wrapping_mul(7_919)) % 12_000) as u16;
        if handed_out.contains(&port) {
            continue;
        }
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            handed_out.insert(port);
            return l.local_addr();
        }
    }
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    handed_out.insert(addr.port());
    Ok(addr)
}

#[cfg(test)]
mod free_addr_tests {
    #[test]
    fn picks_are_free_loopback_ports_below_the_ephemeral_range() {
        for _ in 0..20 {
            let a = super::free_listen_addr().unwrap();
            assert!(a.ip().is_loopback());
            assert!((20_000..32_000).contains(&a.port()), "{a}");
            std::net::TcpListener::bind(a).expect("still free");
        }
    }

    #[test]
    fn one_process_never_gets_the_same_port_twice() {
        // 500 picks from 12,000 ports: without the record of what was
        // handed out, two of them meet with a probability near 1.
        let ports: Vec<u16> = (0..500)
            .map(|_| super::free_listen_addr().unwrap().port())
            .collect();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len());
    }
}
