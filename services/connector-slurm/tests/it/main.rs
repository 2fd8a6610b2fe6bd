//! connector-slurm's integration tests (`cargo test -p
//! fleet-connector-slurm`): against a fake slurmrestd (wiremock) speaking
//! v0.0.38 and v0.0.40 JSON, and against the real slurmrestd of
//! `tests/peers/slurm.sh`, through the real NATS and hub to PostgreSQL.

mod slurm;
mod slurm_real;

mod support {
    pub use fleet_testkit::connector::*;
    pub use fleet_testkit::*;
}
