//! The workflow service's integration tests, against the machine's
//! PostgreSQL and NATS and the real Ironic (`tests/peers/ironic.sh`).

mod backend_flip;
mod burn_in;
mod eligibility;
mod enrolment;
mod fabric_fakes;
mod frontend_flip;
mod impairment;
mod ironic_real;
mod mtc;
mod nova_arm;
mod nvlink;
mod release;
mod storm;
mod support;
