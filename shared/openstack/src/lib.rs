//! fleet-openstack: the OpenStack client that connector-openstack reads
//! with and the workflow service writes with: one site's Keystone v3
//! password token (cached, refreshed before expiry and on a 401), its
//! endpoints (configured or from the catalogue), Ironic's node calls,
//! Placement's trait calls and Nova's server calls.

mod config;
pub mod ironic;
pub mod keystone;
pub mod nova;
pub mod placement;
mod session;

pub use config::SiteConfig;
pub use session::{Session, HEADER_API_VERSION, HEADER_IRONIC_VERSION};
