//! The hub's integration tests, against the machine's real NATS and
//! PostgreSQL (`cargo test -p fleet-hub`): end to end through the bus, its
//! behaviour on every command and observation, and restarts of its peers.

mod behaviour;
mod delegate;
mod e2e;
mod held;
mod holds;
mod join;
mod outbox;
mod queues;
mod restart;
mod store;
mod support;
