//! What every service process shares: configuration, logging, the
//! `/healthz` `/readyz` `/metrics` server, and the shutdown signal.

pub mod config;
pub mod connectors;
pub mod consumers;
pub mod http;
pub mod shutdown;

pub use config::FleetConfig;
pub use shutdown::Shutdown;

pub mod telemetry;

pub use telemetry::{init_tracing, shutdown_tracing};
