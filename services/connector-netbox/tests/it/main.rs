//! connector-netbox's integration tests (`cargo test -p
//! fleet-connector-netbox`): against a fake NetBox 4 (wiremock) speaking
//! `/api/dcim/devices/`, through the real NATS and hub to PostgreSQL.

mod netbox;

mod support {
    pub use fleet_testkit::connector::*;
    pub use fleet_testkit::*;
}
