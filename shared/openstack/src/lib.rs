//! fleet-openstack: the OpenStack client that connector-openstack reads
//! with and the workflow service writes with: one site's Keystone v3
//! password token (cached, refreshed before expiry and on a 401), its
//! endpoints (configured or from the catalogue), and Ironic's node calls.

pub mod ironic;
pub mod keystone;
mod session;

pub use session::{Session, HEADER_API_VERSION, HEADER_IRONIC_VERSION};
