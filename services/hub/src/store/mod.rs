//! The hub's SQL: locking, reading and diff-writing device state, the
//! unresolved observations, and the transactional outbox. Only the hub
//! writes these tables, so only the hub holds these queries.

pub mod devices;
pub mod outbox;
