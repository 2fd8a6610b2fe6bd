//! Integration tests against the real NATS JetStream and PostgreSQL.

mod allocations;
mod api;
mod bench;
mod cli;
mod config_doc;
mod connectors;
mod crash;
mod dev;
mod gateway;
mod harness;
mod inventory;
mod jobs;
mod layout;
mod predicates;
mod security;
mod support;
mod telemetry;
mod workflow_crash;
