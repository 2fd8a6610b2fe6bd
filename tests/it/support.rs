//! The integration tests' support: the shared test kit (`tests/kit`), a
//! fresh database and subject root per test, the services and the API to
//! run.

pub use fleet_testkit::api::*;
pub use fleet_testkit::gateway::start_gateway;
pub use fleet_testkit::*;

/// The whole configuration of this test's environment, as the `fleet`
/// binary composes it: its shared sections and its hub's.
pub fn fleet_config(env: &TestEnv) -> fleet::config::FleetConfig {
    let c = &env.common;
    fleet::config::FleetConfig {
        database: c.database.clone(),
        nats: c.nats.clone(),
        log: c.log.clone(),
        shutdown: c.shutdown.clone(),
        freshness: c.freshness.clone(),
        hub: env.hub.clone(),
        ..Default::default()
    }
}
