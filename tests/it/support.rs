//! The integration tests' support: the shared test kit (`tests/kit`), a
//! fresh database and subject root per test, and a hub to run.

pub use fleet_testkit::*;
