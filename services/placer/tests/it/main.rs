//! The placer's integration tests, against the machine's real NATS and
//! PostgreSQL with a hub running (`cargo test -p fleet-placer`).

mod placer;

mod support {
    pub use fleet_testkit::*;
}
