//! connector-health's integration tests (`cargo test -p
//! fleet-connector-health`): against a fake Mimir (wiremock: the
//! Prometheus query API under `/prometheus`, the tenant in
//! `X-Scope-OrgID`) and against the real Prometheus of
//! `tests/peers/prometheus.sh`, through the real NATS and hub.

mod health;
mod health_real;

mod support {
    pub use fleet_testkit::connector::*;
    pub use fleet_testkit::*;
}
