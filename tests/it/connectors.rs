//! The connectors against local HTTP servers speaking the real JSON shapes
//! (pagination, token refresh, 5xx, timeouts, malformed bodies), through
//! the real NATS and the real hub to PostgreSQL; and connector-slurm
//! against the real slurmrestd of `shared/peers/start-slurm.sh`.

mod fake;
mod netbox;
mod openstack;
mod slurm;
mod slurm_real;
