//! NVLink partition membership from NVIDIA NMX-M's REST API.
//!
//! Contract (three reads per poll, HTTP basic or bearer authentication):
//! - `GET <nmx>/nmx/v1/partitions`: a JSON list of partitions, each with
//!   `PartitionID` (number) and `Name`;
//! - `GET <nmx>/nmx/v1/gpus`: a JSON list of GPUs, each with `ID` and
//!   `PartitionID` (absent or null: in no partition);
//! - `GET <nmx>/nmx/v1/compute-nodes`: a JSON list of compute nodes, each
//!   with its host name (`Name`, `Hostname` or `HostName`) and `GpuIDList`
//!   (the `ID`s of its GPUs).
//!
//! NVIDIA's public NMX-M documentation confirms the endpoints (`/nmx/v1/
//! partitions`, `/gpus`, `/compute-nodes`), that a GPU belongs to at most
//! one partition, and the `PartitionID`, `GpuIDList` and `Name` fields; it
//! does not give a full response schema, so the host-name field and the
//! identifier types are read leniently (strings or numbers) and everything
//! this module assumes is here and in the README.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
pub struct Partition {
    #[serde(rename = "PartitionID", default)]
    pub partition_id: Option<Value>,
    #[serde(rename = "Name", default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Gpu {
    #[serde(rename = "ID", default)]
    pub id: Option<Value>,
    #[serde(rename = "PartitionID", default)]
    pub partition_id: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ComputeNode {
    #[serde(rename = "Name", alias = "Hostname", alias = "HostName", default)]
    pub name: Option<String>,
    #[serde(rename = "GpuIDList", default)]
    pub gpu_ids: Vec<Value>,
}

/// An identifier as text, whether NMX-M sends a string or a number.
pub fn id_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Where one host's GPUs are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub gpus: usize,
    pub in_repair: usize,
    /// GPUs the node lists that NMX-M's GPU list does not.
    pub unlisted: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The repair partition's `PartitionID`; `None` when no partition has
    /// the configured name (then no GPU is in it).
    pub repair_partition_id: Option<String>,
    pub hosts: BTreeMap<String, Membership>,
    /// Compute nodes without a host name, skipped.
    pub unnamed: usize,
}

/// Joins the three lists.
pub fn membership(
    partitions: &[Partition],
    gpus: &[Gpu],
    nodes: &[ComputeNode],
    repair_partition: &str,
) -> Read {
    let repair_partition_id = partitions
        .iter()
        .find(|p| p.name.as_deref().map(str::trim) == Some(repair_partition))
        .and_then(|p| p.partition_id.as_ref().and_then(id_text));
    let partition_of: BTreeMap<String, Option<String>> = gpus
        .iter()
        .filter_map(|g| {
            let id = g.id.as_ref().and_then(id_text)?;
            Some((id, g.partition_id.as_ref().and_then(id_text)))
        })
        .collect();
    let mut hosts = BTreeMap::new();
    let mut unnamed = 0;
    for n in nodes {
        let Some(name) = n.name.as_deref().map(str::trim).filter(|s| !s.is_empty()) else {
            unnamed += 1;
            continue;
        };
        let mut m = Membership {
            gpus: 0,
            in_repair: 0,
            unlisted: vec![],
        };
        for id in n.gpu_ids.iter().filter_map(id_text) {
            m.gpus += 1;
            match partition_of.get(&id) {
                None => m.unlisted.push(id),
                Some(p) => {
                    if p.is_some() && *p == repair_partition_id {
                        m.in_repair += 1;
                    }
                }
            }
        }
        hosts.insert(name.to_string(), m);
    }
    Read {
        repair_partition_id,
        hosts,
        unnamed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARTITIONS: &str = include_str!("../testdata/nmx-partitions.json");
    const GPUS: &str = include_str!("../testdata/nmx-gpus.json");
    const NODES: &str = include_str!("../testdata/nmx-compute-nodes.json");

    fn samples() -> (Vec<Partition>, Vec<Gpu>, Vec<ComputeNode>) {
        (
            serde_json::from_str(PARTITIONS).unwrap(),
            serde_json::from_str(GPUS).unwrap(),
            serde_json::from_str(NODES).unwrap(),
        )
    }

    fn m(gpus: usize, in_repair: usize, unlisted: &[&str]) -> Membership {
        Membership {
            gpus,
            in_repair,
            unlisted: unlisted.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn the_samples() {
        let (p, g, n) = samples();
        let r = membership(&p, &g, &n, "repair");
        assert_eq!(r.repair_partition_id.as_deref(), Some("12"));
        assert_eq!(r.unnamed, 0);
        let got: Vec<(&str, &Membership)> = r.hosts.iter().map(|(h, m)| (h.as_str(), m)).collect();
        assert_eq!(
            got,
            vec![
                ("gpu-a1-01", &m(2, 2, &[])),
                ("gpu-a1-02", &m(2, 0, &[])),
                ("gpu-a1-03", &m(2, 1, &[])),
                ("gpu-a1-04", &m(1, 0, &["gpu-0007"])),
            ]
        );
    }

    #[test]
    fn no_repair_partition_means_nothing_is_in_it() {
        let (p, g, n) = samples();
        let r = membership(&p, &g, &n, "no-such-partition");
        assert_eq!(r.repair_partition_id, None);
        assert!(r.hosts.values().all(|m| m.in_repair == 0));
        // A GPU in no partition never counts as in the repair partition.
        let gpus: Vec<Gpu> = serde_json::from_value(serde_json::json!([
            {"ID": 1}, {"ID": 2, "PartitionID": null}
        ]))
        .unwrap();
        let nodes: Vec<ComputeNode> = serde_json::from_value(serde_json::json!([
            {"Name": "h", "GpuIDList": [1, 2]}, {"GpuIDList": [3]}
        ]))
        .unwrap();
        let r = membership(&[], &gpus, &nodes, "repair");
        assert_eq!(r.hosts["h"], m(2, 0, &[]));
        assert_eq!(r.unnamed, 1);
    }

    #[test]
    fn bodies_that_are_not_lists() {
        assert!(serde_json::from_str::<Vec<Gpu>>(r#"{"ID": 1}"#).is_err());
        assert!(serde_json::from_str::<Vec<ComputeNode>>(r#"[{"GpuIDList": "x"}]"#).is_err());
    }
}
