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
//!
//! The write side ([`Nmx::put_members`], [`Nmx::operation`]):
//! - `PUT <nmx>/nmx/v1/partitions/<PartitionID>` with `{"members": {"ids":
//!   [<GPU ID>, ...]}}`, the partition's **whole** member list (NMX-M
//!   compares it with the current one and adds or removes GPUs); answered
//!   202 with `{"operationId": "<op>"}` and `Location:
//!   /nmx/v1/operations/<op>` (documented);
//! - `GET <nmx>/nmx/v1/operations/<op>`: the operation, whose `status`
//!   (also read as `Status` or `state`) is pending or running until it is
//!   `completed` or `failed`; 404 when NMX-M does not know it.
//!
//! The public documentation names the `members` object and the GPU-ID
//! member type but not the field inside it, nor the operation's fields:
//! `ids` and `status` are the contract this client implements. GPU ids are
//! sent as the text of the `ID`s `/gpus` lists.

use std::collections::BTreeMap;

use fleet_connector::paginate::join;
use fleet_connector::{HttpClient, SourceError};
use fleet_runtime::Credential;
use reqwest::{RequestBuilder, Url};
use serde::de::DeserializeOwned;
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
    let repair_partition_id = partition_named(partitions, repair_partition);
    let partition_of = partition_of(gpus);
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

/// A site's NMX-M: HTTP basic (`username`, `password`) or a bearer token.
#[derive(Clone)]
pub struct Nmx {
    pub http: HttpClient,
    pub base: Url,
    pub username: String,
    pub password: Credential,
    pub token: Credential,
    /// The configuration section (`connectors.fabric.sites.<s>`), named in
    /// errors about its credentials.
    pub key: String,
}

/// The operation an accepted partition update started: `operationId`, else
/// the last segment of its `Location`.
pub fn operation_id(body: &Value, location: Option<&str>) -> Option<String> {
    body.get("operationId")
        .or_else(|| body.get("OperationID"))
        .and_then(id_text)
        .or_else(|| {
            location
                .and_then(|l| l.trim_end_matches('/').rsplit('/').next())
                .filter(|s| !s.trim().is_empty())
                .map(str::to_string)
        })
}

/// An operation's status (`status`, `Status` or `state`).
pub fn operation_status(body: &Value) -> Option<String> {
    ["status", "Status", "state", "State"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_str))
        .map(str::to_string)
}

impl Nmx {
    async fn send(
        &self,
        url: &Url,
        build: impl Fn(&reqwest::Client) -> RequestBuilder,
    ) -> Result<reqwest::Response, SourceError> {
        let token = crate::secret(&self.token, &format!("{}.nmx_token", self.key))?;
        let password = crate::secret(&self.password, &format!("{}.nmx_password", self.key))?;
        self.http
            .send(url.as_str(), |c| {
                let r = build(c).header("Accept", "application/json");
                match &token {
                    Some(t) => r.bearer_auth(t),
                    None if !self.username.is_empty() => {
                        r.basic_auth(&self.username, password.as_deref())
                    }
                    None => r,
                }
            })
            .await
    }

    /// `GET <nmx>/<path>`, decoded.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, SourceError> {
        let url = join(&self.base, path);
        let resp = self.send(&url, |c| c.get(url.clone())).await?;
        self.http.decode(url.as_str(), resp).await
    }

    /// The three lists membership is read from: partitions, GPUs, compute
    /// nodes.
    pub async fn lists(&self) -> Result<(Vec<Partition>, Vec<Gpu>, Vec<ComputeNode>), SourceError> {
        let partitions = self.get("nmx/v1/partitions").await?;
        let gpus = self.get("nmx/v1/gpus").await?;
        let nodes = self.get("nmx/v1/compute-nodes").await?;
        Ok((partitions, gpus, nodes))
    }

    /// Replaces partition `id`'s members with `members`; the operation id.
    pub async fn put_members(&self, id: &str, members: &[String]) -> Result<String, SourceError> {
        let mut url = join(&self.base, "nmx/v1/partitions");
        if let Ok(mut s) = url.path_segments_mut() {
            s.pop_if_empty().push(id);
        }
        let body = serde_json::json!({"members": {"ids": members}});
        let resp = self.send(&url, |c| c.put(url.clone()).json(&body)).await?;
        let location = resp
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body: Value = self
            .http
            .decode(url.as_str(), resp)
            .await
            .unwrap_or(Value::Null);
        operation_id(&body, location.as_deref()).ok_or_else(|| {
            SourceError::malformed(
                url.as_str(),
                "the update names no operation (operationId or Location)",
            )
        })
    }

    /// Operation `id`'s status; `None` when NMX-M does not know it.
    pub async fn operation(&self, id: &str) -> Result<Option<String>, SourceError> {
        let mut url = join(&self.base, "nmx/v1/operations");
        if let Ok(mut s) = url.path_segments_mut() {
            s.pop_if_empty().push(id);
        }
        let resp = match self.send(&url, |c| c.get(url.clone())).await {
            Ok(r) => r,
            Err(SourceError::Status { status: 404, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let body: Value = self.http.decode(url.as_str(), resp).await?;
        operation_status(&body)
            .map(Some)
            .ok_or_else(|| SourceError::malformed(url.as_str(), "the operation has no status"))
    }
}

/// GPU id -> the partition it is in, from `/gpus`.
pub fn partition_of(gpus: &[Gpu]) -> BTreeMap<String, Option<String>> {
    gpus.iter()
        .filter_map(|g| {
            let id = g.id.as_ref().and_then(id_text)?;
            Some((id, g.partition_id.as_ref().and_then(id_text)))
        })
        .collect()
}

/// The GPU ids of compute node `host` (`None`: NMX-M lists no such node).
pub fn host_gpus(nodes: &[ComputeNode], host: &str) -> Option<Vec<String>> {
    nodes
        .iter()
        .find(|n| n.name.as_deref().map(str::trim) == Some(host))
        .map(|n| n.gpu_ids.iter().filter_map(id_text).collect())
}

/// The `PartitionID` of the partition named `name`.
pub fn partition_named(partitions: &[Partition], name: &str) -> Option<String> {
    partitions
        .iter()
        .find(|p| p.name.as_deref().map(str::trim) == Some(name))
        .and_then(|p| p.partition_id.as_ref().and_then(id_text))
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
    fn the_write_contract() {
        let (p, g, n) = samples();
        assert_eq!(partition_named(&p, "repair").as_deref(), Some("12"));
        assert_eq!(host_gpus(&n, "gpu-a1-04").map(|v| v.len()), Some(1));
        assert_eq!(host_gpus(&n, "nope"), None);
        assert!(partition_of(&g).values().any(Option::is_none) || !g.is_empty());
        assert_eq!(
            operation_id(&serde_json::json!({"operationId": "551137c2"}), None).as_deref(),
            Some("551137c2")
        );
        assert_eq!(
            operation_id(&Value::Null, Some("/nmx/v1/operations/abc")).as_deref(),
            Some("abc")
        );
        assert_eq!(operation_id(&Value::Null, None), None);
        assert_eq!(
            operation_status(&serde_json::json!({"Status": "Completed"})).as_deref(),
            Some("Completed")
        );
    }

    #[test]
    fn bodies_that_are_not_lists() {
        assert!(serde_json::from_str::<Vec<Gpu>>(r#"{"ID": 1}"#).is_err());
        assert!(serde_json::from_str::<Vec<ComputeNode>>(r#"[{"GpuIDList": "x"}]"#).is_err());
    }
}
