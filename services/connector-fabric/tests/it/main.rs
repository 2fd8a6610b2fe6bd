//! connector-fabric's integration tests (`cargo test -p
//! fleet-connector-fabric`): against a fake NetBox (cabled interfaces),
//! fake NVUE switches and a fake NMX-M on one port (wiremock), through the
//! real NATS and hub: the three live-fabric observations, latch drift
//! counted and listed (never repaired), outages of each system; and the
//! drift SQL against the domain's table.

mod fabric;

mod support {
    pub use fleet_testkit::connector::*;
    pub use fleet_testkit::*;
}
