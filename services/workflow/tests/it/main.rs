//! The workflow service's integration tests, against the machine's
//! PostgreSQL and NATS and the real Ironic (`tests/peers/ironic.sh`).

mod eligibility;
mod enrolment;
mod impairment;
mod ironic_real;
mod release;
mod storm;
mod support;
