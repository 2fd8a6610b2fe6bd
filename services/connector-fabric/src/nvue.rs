//! A switch port's VRF from the NVIDIA NVUE REST API (Cumulus Linux 5.x).
//!
//! Contract: `GET <switch>/nvue_v1/interface?rev=<revision>` with HTTP
//! basic authentication answers one JSON object keyed by interface name
//! (`swp1`, `swp1s0`, `bond3`, `vlan10`, ...), each the NVUE object model
//! of that interface (`nv show interface -o json`). `rev=operational` is
//! what the switch runs; `rev=applied` the applied configuration.
//!
//! The VRF a port's traffic lands in, read from that object:
//! 1. the port's own `ip.vrf` (a routed port: `nv set interface swp1 ip
//!    vrf RED`);
//! 2. otherwise, when a bond lists the port under `bond.member`, the bond
//!    stands for the port in what follows;
//! 3. its `ip.vrf`, if it has one;
//! 4. a bridge access port (`bridge.domain.<d>.access = <vid>`) is in the
//!    VRF of the SVI `vlan<vid>` (`ip.vrf`, `default` when absent); a trunk
//!    (`bridge.domain.<d>.vlan = {<vid>: {}}`) is in one VRF only when all
//!    its VLANs' SVIs share it;
//! 5. otherwise `default` (NVUE leaves `ip.vrf` out for the default VRF).
//!
//! What the public documentation does not settle: whether the operational
//! revision repeats `ip.vrf` and the bridge membership for every release
//! (the documented examples show the configuration revisions), so the
//! revision read is configurable (`connectors.fabric.nvue_revision`).

use std::collections::BTreeSet;

use serde_json::{Map, Value};

pub const DEFAULT_VRF: &str = "default";

/// Why a port's VRF could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unresolved {
    /// The switch lists no interface of that name.
    PortNotFound,
    /// The port's configuration does not name one VRF.
    Ambiguous(String),
}

impl std::fmt::Display for Unresolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unresolved::PortNotFound => f.write_str("the switch lists no such interface"),
            Unresolved::Ambiguous(m) => f.write_str(m),
        }
    }
}

fn ip_vrf(iface: &Value) -> Option<&str> {
    iface
        .get("ip")
        .and_then(|ip| ip.get("vrf"))
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

fn vid(v: &Value) -> Option<u32> {
    v.as_u64()
        .map(|n| n as u32)
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

/// The VLANs a bridge port carries: `(access, trunk)`.
fn bridge_vlans(iface: &Value) -> (Vec<u32>, Vec<u32>) {
    let mut access = vec![];
    let mut trunk = vec![];
    if let Some(domains) = iface
        .get("bridge")
        .and_then(|b| b.get("domain"))
        .and_then(Value::as_object)
    {
        for d in domains.values() {
            if let Some(a) = d.get("access").and_then(vid) {
                access.push(a);
            }
            if let Some(vlans) = d.get("vlan").and_then(Value::as_object) {
                trunk.extend(vlans.keys().filter_map(|k| k.trim().parse::<u32>().ok()));
            }
        }
    }
    (access, trunk)
}

fn svi_vrf(interfaces: &Map<String, Value>, vid: u32) -> Result<String, Unresolved> {
    match interfaces.get(&format!("vlan{vid}")) {
        Some(svi) => Ok(ip_vrf(svi).unwrap_or(DEFAULT_VRF).to_string()),
        None => Err(Unresolved::Ambiguous(format!(
            "VLAN {vid} has no SVI vlan{vid} on the switch"
        ))),
    }
}

/// The VRF of `port` among a switch's interfaces.
pub fn port_vrf(interfaces: &Map<String, Value>, port: &str) -> Result<String, Unresolved> {
    let own = interfaces.get(port).ok_or(Unresolved::PortNotFound)?;
    if let Some(v) = ip_vrf(own) {
        return Ok(v.to_string());
    }
    let bond = interfaces.values().find(|i| {
        i.get("bond")
            .and_then(|b| b.get("member"))
            .and_then(Value::as_object)
            .is_some_and(|m| m.contains_key(port))
    });
    let iface = bond.unwrap_or(own);
    if let Some(v) = ip_vrf(iface) {
        return Ok(v.to_string());
    }
    let (access, trunk) = bridge_vlans(iface);
    if let Some(a) = access.first() {
        return svi_vrf(interfaces, *a);
    }
    if !trunk.is_empty() {
        let vrfs: BTreeSet<String> = trunk
            .iter()
            .map(|v| svi_vrf(interfaces, *v))
            .collect::<Result<_, _>>()?;
        if vrfs.len() == 1 {
            return Ok(vrfs.into_iter().next().unwrap_or_default());
        }
        return Err(Unresolved::Ambiguous(format!(
            "a trunk whose VLANs are in several VRFs ({})",
            vrfs.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(DEFAULT_VRF.to_string())
}

/// The body of `GET /nvue_v1/interface`: an object of interfaces.
pub fn interfaces(body: Value) -> Result<Map<String, Value>, String> {
    match body {
        Value::Object(m) if m.values().all(Value::is_object) => Ok(m),
        Value::Object(_) => Err("an interface entry is not an object".into()),
        _ => Err("the body is not an object keyed by interface name".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEAF01: &str = include_str!("../testdata/nvue-interface-leaf01.json");

    #[test]
    fn each_way_a_port_joins_a_vrf() {
        let i = interfaces(serde_json::from_str(LEAF01).unwrap()).unwrap();
        let cases: [(&str, Result<&str, Unresolved>); 8] = [
            ("swp1", Ok("cust-0042")),
            ("swp2", Ok("default")),
            // A bond member in access VLAN 10, whose SVI is in cust-0042.
            ("swp3", Ok("cust-0042")),
            // A breakout port in access VLAN 20.
            ("swp4s0", Ok("isolate")),
            ("swp4", Ok("default")),
            // A trunk over VLANs 10 and 30: two VRFs.
            (
                "swp5",
                Err(Unresolved::Ambiguous(
                    "a trunk whose VLANs are in several VRFs (cust-0042, isolate)".into(),
                )),
            ),
            ("eth0", Ok("mgmt")),
            ("swp99", Err(Unresolved::PortNotFound)),
        ];
        for (port, want) in cases {
            assert_eq!(port_vrf(&i, port), want.map(str::to_string), "{port}");
        }
    }

    #[test]
    fn svis_that_are_missing_or_shared() {
        let i = interfaces(serde_json::json!({
            "swp1": {"bridge": {"domain": {"br_default": {"access": "40"}}}},
            "swp2": {"bridge": {"domain": {"br_default": {"vlan": {"50": {}, "51": {}}}}}},
            "vlan50": {"ip": {"vrf": "maint"}},
            "vlan51": {"ip": {"vrf": "maint"}},
            "swp3": {"bridge": {"domain": {"br_default": {"access": 52}}}},
            "vlan52": {"type": "svi"}
        }))
        .unwrap();
        assert_eq!(
            port_vrf(&i, "swp1"),
            Err(Unresolved::Ambiguous(
                "VLAN 40 has no SVI vlan40 on the switch".into()
            ))
        );
        assert_eq!(port_vrf(&i, "swp2"), Ok("maint".into()));
        assert_eq!(port_vrf(&i, "swp3"), Ok("default".into()));
    }

    #[test]
    fn bodies_that_are_not_interface_maps() {
        assert!(interfaces(serde_json::json!([])).is_err());
        assert!(interfaces(serde_json::json!({"swp1": "up"})).is_err());
        assert!(interfaces(serde_json::json!({})).unwrap().is_empty());
    }
}
