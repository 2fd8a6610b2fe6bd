//! connector-borneo's integration tests (`cargo test -p
//! fleet-connector-borneo`): against a fake partner custody API and OAuth2
//! token endpoint (wiremock), through the real NATS and hub.

mod borneo;

mod support {
    pub use fleet_testkit::connector::*;
    pub use fleet_testkit::*;
}
