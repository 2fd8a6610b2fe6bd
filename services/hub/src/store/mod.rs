//! The hub's SQL: locking, reading and diff-writing device state and the
//! unresolved observations (the outbox is `fleet_outbox::HUB`). Only the
//! hub writes these tables, so only the hub holds these queries.

pub mod devices;
pub mod inventory;
