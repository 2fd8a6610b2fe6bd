//! The connectors against local HTTP servers speaking the real JSON shapes
//! (pagination, token refresh, 5xx, timeouts, malformed bodies), through
//! the real NATS and the real hub to PostgreSQL; and connector-slurm
//! against the real slurmrestd of `tests/peers/slurm.sh`; the
//! Connectors II services (health against a fake Mimir and the real
//! Prometheus of `tests/peers/prometheus.sh`, Borneo custody, the
//! fabric and latch drift) and the latch write helper.

mod borneo;
mod fabric;
mod fake;
mod latch;
