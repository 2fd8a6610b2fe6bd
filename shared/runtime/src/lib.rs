//! What every service process shares: configuration, logging, the
//! `/healthz` `/readyz` `/metrics` server, and the shutdown signal.

pub mod config;
pub mod connectors;
pub mod consumers;
pub mod http;
pub mod shutdown;

pub use config::FleetConfig;
pub use shutdown::Shutdown;

/// `tracing` to stderr, as text or JSON lines; `RUST_LOG` overrides the
/// configured filter.
pub fn init_tracing(format: &str, filter: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
