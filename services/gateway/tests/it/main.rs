//! The gateway's integration tests, with simulated node agents
//! (`fleet-agent-sim`) against the real hub, NATS and PostgreSQL
//! (`cargo test -p fleet-gateway`): joins, acceptance, sessions and
//! connectivity, identity generations, relayed commands.

mod agents;

mod support {
    pub use fleet_testkit::api::{send, start_api, Scope};
    pub use fleet_testkit::gateway::start_gateway;
    pub use fleet_testkit::*;
}
