//! From the port map, the switches' VRFs and NMX-M's partitions to the
//! three live-fabric observation conditions. Pure: no IO.
//!
//! A snapshot's source owns its types, so each device gets up to three
//! snapshots: `frontend-fabric` (`FrontendPortsObservedInCustomerVrf`),
//! `backend-fabric` (`BackendPortsObservedInMaintenanceVrf`) and
//! `nvlink-fabric` (`NvLinkGpusObservedInRepairPartition`). These are
//! observations only: the durable latches are written by workflows.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use fleet_connector::snapshot::{condition, key, snapshot};
use fleet_domain::{ConditionStatus, ConditionType, KeyKind, Source};
use fleet_proto::v1;

use crate::netbox::PortLink;
use crate::nmx::Read;

pub const NETBOX_UNREACHABLE: &str = "NetboxUnreachable";
pub const NMX_UNREACHABLE: &str = "NmxUnreachable";
pub const SWITCH_UNREACHABLE: &str = "SwitchUnreachable";
pub const PORT_VRF_UNRESOLVED: &str = "PortVrfUnresolved";
pub const MIXED_VRF_MEMBERSHIP: &str = "MixedVrfMembership";
pub const NO_PORTS_MAPPED: &str = "NoPortsMapped";
pub const GPU_NOT_LISTED: &str = "GpuNotListed";
pub const NO_GPUS_LISTED: &str = "NoGpusListed";
pub const PARTIALLY_IN_REPAIR_PARTITION: &str = "PartiallyInRepairPartition";
pub const IN_REPAIR_PARTITION: &str = "RepairPartitionObserved";
pub const NOT_IN_REPAIR_PARTITION: &str = "RepairPartitionNotObserved";
pub const NO_LONGER_LISTED: &str = "NoLongerListed";

/// The two switch planes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    Frontend,
    Backend,
}

impl Plane {
    pub fn source(self) -> Source {
        match self {
            Plane::Frontend => Source::FrontendFabric,
            Plane::Backend => Source::BackendFabric,
        }
    }

    pub fn condition(self) -> ConditionType {
        match self {
            Plane::Frontend => ConditionType::FrontendPortsObservedInCustomerVrf,
            Plane::Backend => ConditionType::BackendPortsObservedInMaintenanceVrf,
        }
    }

    /// `(True, False)` reasons.
    fn reasons(self) -> (&'static str, &'static str) {
        match self {
            Plane::Frontend => ("CustomerVrfObserved", "CustomerVrfNotObserved"),
            Plane::Backend => ("MaintenanceVrfObserved", "MaintenanceVrfNotObserved"),
        }
    }

    /// What "in" means, for messages.
    fn target(self) -> &'static str {
        match self {
            Plane::Frontend => "a customer VRF",
            Plane::Backend => "the maintenance VRF",
        }
    }
}

/// A set of names: exact names and `prefix*` patterns (the VRFs that count
/// as "in", the peers that are not devices).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameMatcher {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl NameMatcher {
    pub fn new(patterns: &[String]) -> Result<Self, String> {
        let mut m = NameMatcher::default();
        for p in patterns.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
            match p.strip_suffix('*') {
                Some(prefix) if prefix.contains('*') || prefix.is_empty() => {
                    return Err(format!(
                        "{p:?}: only a non-empty prefix ending in one * is allowed"
                    ))
                }
                Some(prefix) => m.prefixes.push(prefix.to_string()),
                None if p.contains('*') => {
                    return Err(format!("{p:?}: * is allowed only at the end"))
                }
                None => m.exact.push(p.to_string()),
            }
        }
        Ok(m)
    }

    /// The same, refusing an empty set.
    pub fn non_empty(patterns: &[String]) -> Result<Self, String> {
        let m = Self::new(patterns)?;
        if m.exact.is_empty() && m.prefixes.is_empty() {
            return Err("no name or prefix given".into());
        }
        Ok(m)
    }

    pub fn matches(&self, vrf: &str) -> bool {
        self.exact.iter().any(|e| e == vrf) || self.prefixes.iter().any(|p| vrf.starts_with(p))
    }
}

/// What one switch port read as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortRead {
    Vrf(String),
    /// The port's switch could not be read; the error.
    SwitchUnreachable(String),
    /// The switch was read but the port's VRF is not one name.
    Unresolved(String),
}

/// One device's verdict on one plane.
pub fn plane_snapshot(
    plane: Plane,
    site: &str,
    device: &str,
    ports: &[(&PortLink, PortRead)],
    matcher: &NameMatcher,
    at: DateTime<Utc>,
) -> v1::ConditionSnapshot {
    let describe = |(l, r): &(&PortLink, PortRead)| -> String {
        let what = match r {
            PortRead::Vrf(v) => format!("in {v}"),
            PortRead::SwitchUnreachable(e) => format!("switch unreachable: {e}"),
            PortRead::Unresolved(e) => format!("unresolved: {e}"),
        };
        format!("{}:{} ({}) {what}", l.switch, l.port, l.device_port)
    };
    let list = || ports.iter().map(describe).collect::<Vec<_>>().join("; ");
    let unreachable = ports
        .iter()
        .any(|(_, r)| matches!(r, PortRead::SwitchUnreachable(_)));
    let unresolved = ports
        .iter()
        .any(|(_, r)| matches!(r, PortRead::Unresolved(_)));
    let inside = ports
        .iter()
        .filter(|(_, r)| matches!(r, PortRead::Vrf(v) if matcher.matches(v)))
        .count();
    let (yes, no) = plane.reasons();
    let (status, reason, message) = if ports.is_empty() {
        (
            ConditionStatus::Unknown,
            NO_PORTS_MAPPED,
            "NetBox maps no switch port to this device".to_string(),
        )
    } else if unreachable {
        (ConditionStatus::Unknown, SWITCH_UNREACHABLE, list())
    } else if unresolved {
        (ConditionStatus::Unknown, PORT_VRF_UNRESOLVED, list())
    } else if inside == ports.len() {
        (
            ConditionStatus::True,
            yes,
            format!("every port in {}: {}", plane.target(), list()),
        )
    } else if inside == 0 {
        (
            ConditionStatus::False,
            no,
            format!("no port in {}: {}", plane.target(), list()),
        )
    } else {
        (
            ConditionStatus::Unknown,
            MIXED_VRF_MEMBERSHIP,
            format!(
                "{inside} of {} ports in {}: {}",
                ports.len(),
                plane.target(),
                list()
            ),
        )
    };
    snapshot(
        plane.source(),
        key(site, KeyKind::Name, device),
        at,
        vec![condition(plane.condition(), status, reason, message)],
        None,
    )
}

/// Every device the port map names, with its ports read through `read`.
pub fn map_plane(
    plane: Plane,
    site: &str,
    links: &[PortLink],
    read: impl Fn(&PortLink) -> PortRead,
    matcher: &NameMatcher,
    at: DateTime<Utc>,
) -> Vec<v1::ConditionSnapshot> {
    let mut by_device: BTreeMap<&str, Vec<(&PortLink, PortRead)>> = BTreeMap::new();
    for l in links {
        by_device.entry(&l.device).or_default().push((l, read(l)));
    }
    by_device
        .iter()
        .map(|(device, ports)| plane_snapshot(plane, site, device, ports, matcher, at))
        .collect()
}

/// A device the port map no longer names: `Unknown` `NoPortsMapped`, once.
pub fn plane_vanished(plane: Plane, k: &v1::DeviceKey, at: DateTime<Utc>) -> v1::ConditionSnapshot {
    plane_snapshot(plane, &k.site, &k.key, &[], &NameMatcher::default(), at)
}

/// One host's NVLink verdict per compute node NMX-M lists.
pub fn map_nvlink(
    site: &str,
    read: &Read,
    repair_partition: &str,
    at: DateTime<Utc>,
) -> Vec<v1::ConditionSnapshot> {
    let partition = match &read.repair_partition_id {
        Some(id) => format!("partition {repair_partition:?} (PartitionID {id})"),
        None => format!("partition {repair_partition:?} (NMX-M lists no partition of that name)"),
    };
    read.hosts
        .iter()
        .map(|(host, m)| {
            let (status, reason, message) = if !m.unlisted.is_empty() {
                (
                    ConditionStatus::Unknown,
                    GPU_NOT_LISTED,
                    format!(
                        "NMX-M's GPU list lacks {} of the node's {} GPUs: {}",
                        m.unlisted.len(),
                        m.gpus,
                        m.unlisted.join(", ")
                    ),
                )
            } else if m.gpus == 0 {
                (
                    ConditionStatus::Unknown,
                    NO_GPUS_LISTED,
                    "NMX-M lists the compute node without GPUs".to_string(),
                )
            } else if m.in_repair == m.gpus {
                (
                    ConditionStatus::True,
                    IN_REPAIR_PARTITION,
                    format!("all {} GPUs in {partition}", m.gpus),
                )
            } else if m.in_repair == 0 {
                (
                    ConditionStatus::False,
                    NOT_IN_REPAIR_PARTITION,
                    format!("none of {} GPUs in {partition}", m.gpus),
                )
            } else {
                (
                    ConditionStatus::Unknown,
                    PARTIALLY_IN_REPAIR_PARTITION,
                    format!("{} of {} GPUs in {partition}", m.in_repair, m.gpus),
                )
            };
            snapshot(
                Source::NvlinkFabric,
                key(site, KeyKind::Name, host),
                at,
                vec![condition(
                    ConditionType::NvLinkGpusObservedInRepairPartition,
                    status,
                    reason,
                    message,
                )],
                None,
            )
        })
        .collect()
}

/// A host NMX-M no longer lists: `Unknown` `NoLongerListed`, once.
pub fn nvlink_vanished(k: &v1::DeviceKey, at: DateTime<Utc>) -> v1::ConditionSnapshot {
    snapshot(
        Source::NvlinkFabric,
        k.clone(),
        at,
        vec![condition(
            ConditionType::NvLinkGpusObservedInRepairPartition,
            ConditionStatus::Unknown,
            NO_LONGER_LISTED,
            "NMX-M no longer lists the compute node",
        )],
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netbox::{port_links, InterfacePage};
    use crate::nmx::{membership, ComputeNode, Gpu, Partition};
    use crate::nvue::{interfaces, port_vrf};
    use std::collections::BTreeSet;

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-29T16:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn one(s: &v1::ConditionSnapshot) -> (String, String, String, String) {
        assert_eq!(s.conditions.len(), 1);
        let c = &s.conditions[0];
        (
            s.device.as_ref().unwrap().key.clone(),
            c.status.clone(),
            c.reason.clone(),
            c.message.clone(),
        )
    }

    fn link(switch: &str, port: &str, device: &str) -> PortLink {
        PortLink {
            switch: switch.into(),
            port: port.into(),
            device: device.into(),
            device_port: "eth0".into(),
        }
    }

    #[test]
    fn vrf_patterns() {
        let m =
            NameMatcher::non_empty(&["cust-*".into(), "tenant-blue".into(), " ".into()]).unwrap();
        assert!(m.matches("cust-0042"));
        assert!(m.matches("tenant-blue"));
        assert!(!m.matches("tenant-blue2"));
        assert!(!m.matches("isolate"));
        assert!(!m.matches("default"));
        for bad in [
            vec![],
            vec!["*".to_string()],
            vec!["a*b".to_string()],
            vec!["**".to_string()],
        ] {
            assert!(NameMatcher::non_empty(&bad).is_err(), "{bad:?}");
        }
        assert!(!NameMatcher::new(&[]).unwrap().matches("anything"));
    }

    /// The NetBox sample's port map against the NVUE sample of leaf01
    /// (leaf02 unreachable, then readable).
    #[test]
    fn frontend_from_the_samples() {
        let page: InterfacePage = serde_json::from_str(include_str!(
            "../../../shared/fabric/testdata/netbox-interfaces-cabled.json"
        ))
        .unwrap();
        let switches: BTreeSet<String> = ["leaf01", "leaf02"].map(String::from).into();
        let spines = NameMatcher::new(&["spine*".into()]).unwrap();
        let links = port_links(&page.results, &switches, |d| spines.matches(d));
        let leaf01 = interfaces(
            serde_json::from_str(include_str!(
                "../../../shared/fabric/testdata/nvue-interface-leaf01.json"
            ))
            .unwrap(),
        )
        .unwrap();
        let matcher = NameMatcher::non_empty(&["cust-*".into()]).unwrap();
        let read_with = |leaf02: Option<&str>| {
            let leaf01 = leaf01.clone();
            let leaf02 = leaf02.map(str::to_string);
            move |l: &PortLink| match l.switch.as_str() {
                "leaf01" => match port_vrf(&leaf01, &l.port) {
                    Ok(v) => PortRead::Vrf(v),
                    Err(e) => PortRead::Unresolved(e.to_string()),
                },
                _ => match &leaf02 {
                    Some(v) => PortRead::Vrf(v.clone()),
                    None => {
                        PortRead::SwitchUnreachable("cannot connect to https://leaf02:8765".into())
                    }
                },
            }
        };
        // The plane with leaf02 unreachable (`None`) or in that VRF.
        let frontend = |leaf02: Option<&str>| {
            map_plane(
                Plane::Frontend,
                "s1",
                &links,
                read_with(leaf02),
                &matcher,
                at(),
            )
        };
        let out = frontend(None);
        assert_eq!(
            out.iter().map(one).collect::<Vec<_>>(),
            vec![
                (
                    "gpu-a1-01".into(),
                    "Unknown".into(),
                    SWITCH_UNREACHABLE.into(),
                    "leaf01:swp1 (eth0) in cust-0042; leaf02:swp1 (eth1) switch unreachable: cannot connect to https://leaf02:8765".into()
                ),
                (
                    "gpu-a1-02".into(),
                    "False".into(),
                    "CustomerVrfNotObserved".into(),
                    "no port in a customer VRF: leaf01:swp2 (eth0) in default".into()
                ),
            ]
        );
        assert!(out
            .iter()
            .all(|s| s.source == "frontend-fabric" && s.mirror.is_none()));
        assert_eq!(
            out[0].conditions[0].r#type,
            "FrontendPortsObservedInCustomerVrf"
        );
        let out = frontend(Some("cust-0042"));
        assert_eq!(one(&out[0]).2, "CustomerVrfObserved");
        assert_eq!(one(&out[0]).1, "True");
        let out = frontend(Some("isolate"));
        let (_, status, reason, message) = one(&out[0]);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("Unknown", MIXED_VRF_MEMBERSHIP)
        );
        assert!(
            message.starts_with("1 of 2 ports in a customer VRF"),
            "{message}"
        );
    }

    #[test]
    fn backend_verdicts() {
        let matcher = NameMatcher::non_empty(&["maint".into()]).unwrap();
        let links = [
            link("be01", "swp1", "h1"),
            link("be02", "swp1", "h1"),
            link("be01", "swp2", "h2"),
            link("be01", "swp3", "h3"),
        ];
        let read = |l: &PortLink| match (l.switch.as_str(), l.port.as_str()) {
            (_, "swp1") => PortRead::Vrf("maint".into()),
            (_, "swp2") => PortRead::Vrf("roce-prod".into()),
            _ => PortRead::Unresolved("the switch lists no such interface".into()),
        };
        let out = map_plane(Plane::Backend, "s1", &links, read, &matcher, at());
        let got: Vec<(String, String, String)> = out
            .iter()
            .map(|s| {
                let (d, st, r, _) = one(s);
                (d, st, r)
            })
            .collect();
        let row = |d: &str, s: &str, r: &str| (d.to_string(), s.to_string(), r.to_string());
        assert_eq!(
            got,
            vec![
                row("h1", "True", "MaintenanceVrfObserved"),
                row("h2", "False", "MaintenanceVrfNotObserved"),
                row("h3", "Unknown", PORT_VRF_UNRESOLVED),
            ]
        );
        assert!(out.iter().all(|s| s.source == "backend-fabric"
            && s.conditions[0].r#type == "BackendPortsObservedInMaintenanceVrf"));
        let gone = plane_vanished(Plane::Backend, out[0].device.as_ref().unwrap(), at());
        assert_eq!(one(&gone).2, NO_PORTS_MAPPED);
        assert_eq!(one(&gone).1, "Unknown");
    }

    #[test]
    fn nvlink_from_the_samples() {
        let p: Vec<Partition> = serde_json::from_str(include_str!(
            "../../../shared/fabric/testdata/nmx-partitions.json"
        ))
        .unwrap();
        let g: Vec<Gpu> = serde_json::from_str(include_str!(
            "../../../shared/fabric/testdata/nmx-gpus.json"
        ))
        .unwrap();
        let n: Vec<ComputeNode> = serde_json::from_str(include_str!(
            "../../../shared/fabric/testdata/nmx-compute-nodes.json"
        ))
        .unwrap();
        let out = map_nvlink("s1", &membership(&p, &g, &n, "repair"), "repair", at());
        assert_eq!(
            out.iter().map(one).collect::<Vec<_>>(),
            vec![
                (
                    "gpu-a1-01".into(),
                    "True".into(),
                    IN_REPAIR_PARTITION.into(),
                    r#"all 2 GPUs in partition "repair" (PartitionID 12)"#.into()
                ),
                (
                    "gpu-a1-02".into(),
                    "False".into(),
                    NOT_IN_REPAIR_PARTITION.into(),
                    r#"none of 2 GPUs in partition "repair" (PartitionID 12)"#.into()
                ),
                (
                    "gpu-a1-03".into(),
                    "Unknown".into(),
                    PARTIALLY_IN_REPAIR_PARTITION.into(),
                    r#"1 of 2 GPUs in partition "repair" (PartitionID 12)"#.into()
                ),
                (
                    "gpu-a1-04".into(),
                    "Unknown".into(),
                    GPU_NOT_LISTED.into(),
                    "NMX-M's GPU list lacks 1 of the node's 1 GPUs: gpu-0007".into()
                ),
            ]
        );
        assert!(out.iter().all(|s| s.source == "nvlink-fabric"
            && s.conditions[0].r#type == "NvLinkGpusObservedInRepairPartition"));
        let gone = nvlink_vanished(out[0].device.as_ref().unwrap(), at());
        assert_eq!(one(&gone).2, NO_LONGER_LISTED);
    }
}
