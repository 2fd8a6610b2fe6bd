//! The placer's client (`fleet placer`): booking, releasing and reading
//! allocations and pool capacity over NATS request/reply
//! (`<root>.placer.cmd.<verb>`), with the request and answer types. The API
//! and any other caller use it; no caller links the placer itself.

pub mod client;
pub mod error;
pub mod model;

pub use client::PlacerClient;
pub use error::PlacerError;
pub use model::{AllocateRequest, Allocation, Atom, Capacity};
