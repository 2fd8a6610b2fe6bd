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
//!
//! The write side ([`Nvue`]), NVUE's revision cycle:
//! 1. `POST <switch>/nvue_v1/revision` answers `{"<rev>": {"state":
//!    "pending", ...}}`: a new revision (its id holds `/`, so it is
//!    percent-encoded wherever it goes in a URL);
//! 2. `PATCH <switch>/nvue_v1/interface?rev=<rev>` with `{"<port>": {"ip":
//!    {"vrf": "<vrf>"}}, ...}` stages every port of the switch at once (a
//!    targeted patch of the interface collection; idempotent);
//! 3. `PATCH <switch>/nvue_v1/revision/<rev>` with `{"state": "apply",
//!    "auto-prompt": {"ays": "ays_yes"}}` applies it;
//! 4. `GET <switch>/nvue_v1/revision/<rev>` until its `state` is `applied`
//!    (or a failure: `apply_fail`, `ays_fail`, `invalid`); 404 when the
//!    switch does not know it.
//!
//! The contract writes routed ports (`ip.vrf`); a port that reads back as
//! a bridge access port is moved the same way, and a switch that refuses
//! that makes the apply fail (the flip fails closed).

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

use std::collections::BTreeSet;

use fleet_connector::paginate::join;
use fleet_connector::{HttpClient, SourceError};
use fleet_runtime::Credential;
use reqwest::{RequestBuilder, Url};
use serde_json::{Map, Value};

/// A switch fabric's NVUE REST API: HTTP basic, one base URL per switch.
#[derive(Clone)]
pub struct Nvue {
    pub http: HttpClient,
    pub username: String,
    pub password: Credential,
    /// The configuration key of `password`, named in errors.
    pub password_key: String,
}

/// `<switch>/nvue_v1/interface?rev=<rev>`.
pub fn interfaces_url(base: &Url, rev: &str) -> Url {
    let mut u = join(base, "nvue_v1/interface");
    u.query_pairs_mut().append_pair("rev", rev);
    u
}

/// `<switch>/nvue_v1/revision/<rev>`, the revision percent-encoded.
pub fn revision_url(base: &Url, rev: &str) -> Url {
    let mut u = join(base, "nvue_v1/revision");
    if let Ok(mut segments) = u.path_segments_mut() {
        segments.pop_if_empty().push(rev);
    }
    u
}

/// The revision a `POST /nvue_v1/revision` created: the one key of its
/// answer.
pub fn created_revision(body: &Value) -> Result<String, String> {
    match body.as_object().map(|m| m.keys().collect::<Vec<_>>()) {
        Some(keys) if keys.len() == 1 && !keys[0].trim().is_empty() => Ok(keys[0].clone()),
        _ => Err("the answer is not an object keyed by one revision id".into()),
    }
}

impl Nvue {
    /// Sends what `build` makes with the switch's credentials.
    async fn send(
        &self,
        url: &Url,
        build: impl Fn(&reqwest::Client) -> RequestBuilder,
    ) -> Result<reqwest::Response, SourceError> {
        let password = crate::secret(&self.password, &self.password_key)?;
        self.http
            .send(url.as_str(), |c| {
                build(c)
                    .header("Accept", "application/json")
                    .basic_auth(&self.username, password.as_deref())
            })
            .await
    }

    /// The switch's interfaces at `url` ([`interfaces_url`]).
    pub async fn read(&self, url: &Url) -> Result<Map<String, Value>, SourceError> {
        let resp = self.send(url, |c| c.get(url.clone())).await?;
        let body: Value = self.http.decode(url.as_str(), resp).await?;
        interfaces(body).map_err(|m| SourceError::malformed(url.as_str(), m))
    }

    /// The switch's interfaces in revision `rev` (`operational`,
    /// `applied`, or a revision id).
    pub async fn interfaces(
        &self,
        base: &Url,
        rev: &str,
    ) -> Result<Map<String, Value>, SourceError> {
        self.read(&interfaces_url(base, rev)).await
    }

    /// A new revision on the switch.
    pub async fn create_revision(&self, base: &Url) -> Result<String, SourceError> {
        let url = join(base, "nvue_v1/revision");
        let resp = self.send(&url, |c| c.post(url.clone())).await?;
        let body: Value = self.http.decode(url.as_str(), resp).await?;
        created_revision(&body).map_err(|m| SourceError::malformed(url.as_str(), m))
    }

    /// Stages `ports`' VRFs (`(port, vrf)`) in revision `rev`.
    pub async fn stage_vrfs(
        &self,
        base: &Url,
        rev: &str,
        ports: &[(String, String)],
    ) -> Result<(), SourceError> {
        let url = interfaces_url(base, rev);
        let body: Map<String, Value> = ports
            .iter()
            .map(|(p, vrf)| (p.clone(), serde_json::json!({"ip": {"vrf": vrf}})))
            .collect();
        let body = Value::Object(body);
        self.send(&url, |c| c.patch(url.clone()).json(&body))
            .await
            .map(|_| ())
    }

    /// Asks the switch to apply revision `rev`, answering its prompts yes.
    pub async fn apply(&self, base: &Url, rev: &str) -> Result<(), SourceError> {
        let url = revision_url(base, rev);
        let body = serde_json::json!({"state": "apply", "auto-prompt": {"ays": "ays_yes"}});
        self.send(&url, |c| c.patch(url.clone()).json(&body))
            .await
            .map(|_| ())
    }

    /// Revision `rev`'s `state`; `None` when the switch does not know it.
    pub async fn revision_state(
        &self,
        base: &Url,
        rev: &str,
    ) -> Result<Option<String>, SourceError> {
        let url = revision_url(base, rev);
        let resp = match self.send(&url, |c| c.get(url.clone())).await {
            Ok(r) => r,
            Err(SourceError::Status { status: 404, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let body: Value = self.http.decode(url.as_str(), resp).await?;
        body.get("state")
            .and_then(Value::as_str)
            .map(|s| Some(s.to_string()))
            .ok_or_else(|| SourceError::malformed(url.as_str(), "the revision has no state"))
    }
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
    fn revision_urls_and_answers() {
        let base = Url::parse("https://leaf01:8765/").unwrap();
        assert_eq!(
            revision_url(&base, "changeset/cumulus/2026-11-29_16.00.00_ABCD").as_str(),
            "https://leaf01:8765/nvue_v1/revision/changeset%2Fcumulus%2F2026-11-29_16.00.00_ABCD"
        );
        assert_eq!(
            interfaces_url(&base, "changeset/cumulus/x").as_str(),
            "https://leaf01:8765/nvue_v1/interface?rev=changeset%2Fcumulus%2Fx"
        );
        let body = serde_json::json!({"changeset/cumulus/x": {"state": "pending", "transition": {"issue": {}, "progress": ""}}});
        assert_eq!(created_revision(&body).unwrap(), "changeset/cumulus/x");
        assert!(created_revision(&serde_json::json!({})).is_err());
        assert!(created_revision(&serde_json::json!([])).is_err());
    }

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
