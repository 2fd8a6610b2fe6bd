//! The latch write helper's integration tests (`cargo test -p
//! fleet-latch`), against the real hub, NATS and PostgreSQL.

mod latch;

mod support {
    pub use fleet_testkit::connector::condition_row;
    pub use fleet_testkit::*;
}
