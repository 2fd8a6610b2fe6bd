//! fleet-fabric: the switch fabric as connector-fabric reads it and the
//! workflow service writes it, one client per system.
//!
//! - [`netbox`]: the device-to-switch-port map from NetBox's cables, read
//!   switch-side (every device port of a plane's switches, the connector)
//!   or device-side (one device's ports, a flip's plan).
//! - [`nvue`]: a port's VRF from the switch's NVUE REST API, and the
//!   revision cycle that changes it (create, stage, apply, poll).
//! - [`nmx`]: NVLink partition membership from NMX-M, and the partition
//!   update that changes it (PUT the member list, poll the operation).
//!
//! Every contract, and what the public documentation leaves open, is in
//! each module's doc and `docs/connectors.md` ("Fabric contracts").

pub mod netbox;
pub mod nmx;
pub mod nvue;

use fleet_connector::SourceError;
use fleet_runtime::Credential;

/// A credential resolved for one request (`None`: not configured); the
/// error names the configuration key.
pub(crate) fn secret(c: &Credential, key: &str) -> Result<Option<String>, SourceError> {
    c.resolve(key)
        .map(|s| s.map(|s| s.expose().to_string()))
        .map_err(|e| SourceError::Config(e.to_string()))
}
