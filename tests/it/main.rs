//! Integration tests against the real NATS JetStream and PostgreSQL.

mod bench;
mod cli;
mod cluster;
mod config_doc;
mod crash;
mod dev;
mod harness;
mod layout;
mod predicates;
mod recurring;
mod security;
mod support;
mod telemetry;
mod workflow_crash;
