//! connector-openstack's integration tests (`cargo test -p
//! fleet-connector-openstack`): against a fake Keystone v3, Ironic and
//! Placement on one port (wiremock), through the real NATS and hub.

mod openstack;

mod support {
    pub use fleet_testkit::connector::*;
    pub use fleet_testkit::*;
}
