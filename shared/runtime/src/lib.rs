//! What every service process shares: configuration, logging, the
//! `/healthz` `/readyz` `/metrics` server, the shutdown signal, and the
//! pacing of periodic scans.

pub mod config;
pub mod http;
pub mod metrics;
pub mod pace;
pub mod process;
pub mod shutdown;
pub mod supervise;

pub use config::{Common, ConfigError, Credential};
pub use shutdown::Shutdown;
pub use supervise::supervise;

pub mod telemetry;

pub use telemetry::{init_tracing, shutdown_tracing};
