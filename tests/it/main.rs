//! Integration tests against the real NATS JetStream and PostgreSQL.

mod crash;
mod hub_behaviour;
mod hub_e2e;
mod support;
