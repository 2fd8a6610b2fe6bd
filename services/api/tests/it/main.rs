//! The operator API's integration tests over real HTTP (port 0), against
//! the machine's real NATS and PostgreSQL with a hub, placer or workflow
//! service from the test kit (`cargo test -p fleet-api`): scopes, error
//! codes, snapshots of the main responses, pagination, allocations,
//! inventory, impairment events and the failure-code taxonomy.

mod allocations;
mod devices;
mod inventory;
mod jobs;
mod standup;

mod support;
