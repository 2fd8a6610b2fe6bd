//! Fakes of the fabric's systems speaking their real JSON shapes
//! (`fleet_fabric`'s contracts), each a stateful `wiremock::Respond`: a
//! switch's NVUE (interfaces, revisions and their apply), NetBox's cables,
//! and NMX-M (partitions, GPUs, compute nodes, partition updates and their
//! operations). Every write is counted, and an apply or an operation can be
//! held until the test lets it finish.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use fleet_proto::v1;
use serde_json::{json, Map, Value};
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::support::*;

fn decoded(segment: &str) -> String {
    segment.replace("%2F", "/").replace("%2f", "/")
}

/// A server answering every request with `responder`.
async fn serve(responder: impl Respond + 'static) -> Arc<MockServer> {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(responder)
        .mount(&server)
        .await;
    Arc::new(server)
}

fn not_found() -> ResponseTemplate {
    ResponseTemplate::new(404).set_body_json(json!({"status": 404, "title": "Not Found"}))
}

// ---- NVUE ----

#[derive(Debug, Default)]
pub struct NvueState {
    /// Port -> the VRF it is in (a routed port).
    pub ports: BTreeMap<String, String>,
    /// Revision -> (its staged port VRFs, its state).
    pub revisions: BTreeMap<String, (Vec<(String, String)>, String)>,
    pub created: u32,
    pub stages: u32,
    pub applies: u32,
    pub first_write_at: Option<DateTime<Utc>>,
    /// An apply stays `applying` while this is set.
    pub hold_apply: bool,
    /// An apply ends in `apply_fail`.
    pub fail_apply: bool,
}

impl NvueState {
    pub fn writes(&self) -> u32 {
        self.created + self.stages + self.applies
    }

    fn wrote(&mut self) {
        self.first_write_at.get_or_insert_with(Utc::now);
    }
}

/// One switch's NVUE.
#[derive(Clone)]
pub struct FakeNvue {
    pub name: String,
    pub state: Arc<Mutex<NvueState>>,
    pub url: String,
    _server: Arc<MockServer>,
}

struct NvueResponder(Arc<Mutex<NvueState>>);

impl Respond for NvueResponder {
    fn respond(&self, r: &Request) -> ResponseTemplate {
        let mut s = self.0.lock().unwrap();
        let path = r.url.path().to_string();
        let rev_q = r
            .url
            .query_pairs()
            .find(|(k, _)| k == "rev")
            .map(|(_, v)| v.to_string());
        let method = r.method.as_str();
        if r.headers.get("authorization").is_none() {
            return ResponseTemplate::new(401);
        }
        if path == "/nvue_v1/interface" && method == "GET" {
            let mut out = Map::new();
            out.insert("eth0".into(), json!({"type": "eth", "ip": {"vrf": "mgmt"}}));
            for (p, vrf) in &s.ports {
                out.insert(p.clone(), json!({"type": "swp", "ip": {"vrf": vrf}}));
            }
            return ResponseTemplate::new(200).set_body_json(Value::Object(out));
        }
        if path == "/nvue_v1/interface" && method == "PATCH" {
            let Some(rev) = rev_q else {
                return ResponseTemplate::new(400);
            };
            let body: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            let Some(changes) = body.as_object() else {
                return ResponseTemplate::new(400);
            };
            let staged: Vec<(String, String)> = changes
                .iter()
                .filter_map(|(p, v)| Some((p.clone(), v["ip"]["vrf"].as_str()?.to_string())))
                .collect();
            s.wrote();
            s.stages += 1;
            let Some(entry) = s.revisions.get_mut(&rev) else {
                return not_found();
            };
            entry.0.extend(staged);
            return ResponseTemplate::new(200).set_body_json(json!({}));
        }
        if path == "/nvue_v1/revision" && method == "POST" {
            s.wrote();
            s.created += 1;
            let id = format!("changeset/fleet/{}", s.created);
            s.revisions.insert(id.clone(), (vec![], "pending".into()));
            return ResponseTemplate::new(200).set_body_json(
                json!({ id: {"state": "pending", "transition": {"issue": {}, "progress": ""}}}),
            );
        }
        if let Some(rev) = path.strip_prefix("/nvue_v1/revision/") {
            let rev = decoded(rev);
            let (hold, fail) = (s.hold_apply, s.fail_apply);
            if method == "PATCH" {
                s.wrote();
                s.applies += 1;
                let Some(entry) = s.revisions.get_mut(&rev) else {
                    return not_found();
                };
                entry.1 = if fail {
                    "apply_fail".into()
                } else {
                    "applying".into()
                };
                return ResponseTemplate::new(200).set_body_json(json!({"state": entry.1}));
            }
            if method == "GET" {
                let Some(entry) = s.revisions.get(&rev).cloned() else {
                    return not_found();
                };
                let mut state = entry.1.clone();
                if state == "applying" && !hold {
                    for (p, vrf) in &entry.0 {
                        s.ports.insert(p.clone(), vrf.clone());
                    }
                    state = "applied".into();
                    if let Some(e) = s.revisions.get_mut(&rev) {
                        e.1 = state.clone();
                    }
                }
                return ResponseTemplate::new(200)
                    .set_body_json(json!({"state": state, "transition": {"issue": {}}}));
            }
        }
        not_found()
    }
}

impl FakeNvue {
    pub async fn start(name: &str, ports: &[(&str, &str)]) -> FakeNvue {
        let state = Arc::new(Mutex::new(NvueState {
            ports: ports
                .iter()
                .map(|(p, v)| (p.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }));
        let server = serve(NvueResponder(state.clone())).await;
        FakeNvue {
            name: name.into(),
            url: server.uri(),
            state,
            _server: server,
        }
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, NvueState> {
        self.state.lock().unwrap()
    }

    pub fn vrf(&self, port: &str) -> String {
        self.state().ports.get(port).cloned().unwrap_or_default()
    }
}

// ---- NetBox ----

/// NetBox's cables: device -> (its interface, switch, switch port).
#[derive(Clone)]
pub struct FakeNetbox {
    pub url: String,
    _server: Arc<MockServer>,
}

struct NetboxResponder(BTreeMap<String, Vec<(String, String, String)>>);

impl Respond for NetboxResponder {
    fn respond(&self, r: &Request) -> ResponseTemplate {
        if r.url.path() != "/api/dcim/interfaces/" {
            return not_found();
        }
        let devices: Vec<String> = r
            .url
            .query_pairs()
            .filter(|(k, _)| k == "device")
            .map(|(_, v)| v.to_string())
            .collect();
        let mut results = vec![];
        for d in devices {
            for (i, (iface, switch, port)) in self.0.get(&d).into_iter().flatten().enumerate() {
                let end =
                    json!([{"id": 900 + i, "name": port, "device": {"id": 9, "name": switch}}]);
                results.push(json!({
                    "id": 100 + i, "name": iface, "device": {"id": 1, "name": d},
                    "cable": {"id": 50 + i},
                    "link_peers": end, "link_peers_type": "dcim.interface",
                    "connected_endpoints": end, "connected_endpoints_type": "dcim.interface"
                }));
            }
        }
        ResponseTemplate::new(200).set_body_json(
            json!({"count": results.len(), "next": null, "previous": null, "results": results}),
        )
    }
}

impl FakeNetbox {
    pub async fn start(cables: &[(&str, &str, &str, &str)]) -> FakeNetbox {
        let mut map: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
        for (device, iface, switch, port) in cables {
            map.entry(device.to_string()).or_default().push((
                iface.to_string(),
                switch.to_string(),
                port.to_string(),
            ));
        }
        let server = serve(NetboxResponder(map)).await;
        FakeNetbox {
            url: server.uri(),
            _server: server,
        }
    }
}

// ---- NMX-M ----

#[derive(Debug, Default)]
pub struct NmxState {
    /// `(PartitionID, Name)`.
    pub partitions: Vec<(u32, String)>,
    /// GPU -> its partition.
    pub gpus: BTreeMap<String, Option<u32>>,
    /// Host -> its GPUs.
    pub nodes: BTreeMap<String, Vec<String>>,
    /// Operation -> (partition, members, status).
    pub operations: BTreeMap<String, (u32, Vec<String>, String)>,
    pub puts: u32,
    pub first_put_at: Option<DateTime<Utc>>,
    /// Operations stay `running` while this is set.
    pub hold: bool,
}

#[derive(Clone)]
pub struct FakeNmx {
    pub state: Arc<Mutex<NmxState>>,
    pub url: String,
    _server: Arc<MockServer>,
}

struct NmxResponder(Arc<Mutex<NmxState>>);

impl Respond for NmxResponder {
    fn respond(&self, r: &Request) -> ResponseTemplate {
        let mut s = self.0.lock().unwrap();
        let path = r.url.path().to_string();
        match (r.method.as_str(), path.as_str()) {
            ("GET", "/nmx/v1/partitions") => {
                let v: Vec<Value> = s
                    .partitions
                    .iter()
                    .map(|(id, name)| json!({"PartitionID": id, "Name": name, "Type": "GPUUIDBased"}))
                    .collect();
                ResponseTemplate::new(200).set_body_json(v)
            }
            ("GET", "/nmx/v1/gpus") => {
                let v: Vec<Value> = s
                    .gpus
                    .iter()
                    .map(|(g, p)| json!({"ID": g, "PartitionID": p}))
                    .collect();
                ResponseTemplate::new(200).set_body_json(v)
            }
            ("GET", "/nmx/v1/compute-nodes") => {
                let v: Vec<Value> = s
                    .nodes
                    .iter()
                    .map(|(h, g)| json!({"Name": h, "GpuIDList": g}))
                    .collect();
                ResponseTemplate::new(200).set_body_json(v)
            }
            ("PUT", p) if p.starts_with("/nmx/v1/partitions/") => {
                let id: u32 = match p.trim_start_matches("/nmx/v1/partitions/").parse() {
                    Ok(id) => id,
                    Err(_) => return not_found(),
                };
                let body: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                let Some(ids) = body["members"]["ids"].as_array() else {
                    return ResponseTemplate::new(400);
                };
                let members: Vec<String> = ids
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect();
                s.puts += 1;
                s.first_put_at.get_or_insert_with(Utc::now);
                let op = format!("op-{}", s.puts);
                s.operations
                    .insert(op.clone(), (id, members, "running".into()));
                ResponseTemplate::new(202)
                    .insert_header("Location", format!("/nmx/v1/operations/{op}").as_str())
                    .set_body_json(json!({"operationId": op}))
            }
            ("GET", p) if p.starts_with("/nmx/v1/operations/") => {
                let op = p.trim_start_matches("/nmx/v1/operations/").to_string();
                let hold = s.hold;
                let Some((id, members, status)) = s.operations.get(&op).cloned() else {
                    return not_found();
                };
                if status == "running" && !hold {
                    for p in s.gpus.values_mut() {
                        if *p == Some(id) {
                            *p = None;
                        }
                    }
                    for g in &members {
                        s.gpus.insert(g.clone(), Some(id));
                    }
                    if let Some(o) = s.operations.get_mut(&op) {
                        o.2 = "completed".into();
                    }
                    return ResponseTemplate::new(200)
                        .set_body_json(json!({"status": "completed"}));
                }
                ResponseTemplate::new(200).set_body_json(json!({"status": status}))
            }
            _ => not_found(),
        }
    }
}

impl FakeNmx {
    /// Partitions 1 `default` and 7 `repair`; every host's GPUs in
    /// `default`.
    pub async fn start(hosts: &[(&str, &[&str])]) -> FakeNmx {
        let mut st = NmxState {
            partitions: vec![(1, "default".into()), (7, "repair".into())],
            ..Default::default()
        };
        for (h, gpus) in hosts {
            st.nodes
                .insert(h.to_string(), gpus.iter().map(|g| g.to_string()).collect());
            for g in gpus.iter() {
                st.gpus.insert(g.to_string(), Some(1));
            }
        }
        let state = Arc::new(Mutex::new(st));
        let server = serve(NmxResponder(state.clone())).await;
        FakeNmx {
            url: server.uri(),
            state,
            _server: server,
        }
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, NmxState> {
        self.state.lock().unwrap()
    }

    /// How many of `host`'s GPUs are in partition `id`.
    pub fn in_partition(&self, host: &str, id: u32) -> usize {
        let s = self.state();
        s.nodes[host]
            .iter()
            .filter(|g| s.gpus.get(*g) == Some(&Some(id)))
            .count()
    }
}

// ---- the workflow service against them ----

/// How long a fabric job may take.
const WITHIN: Duration = Duration::from_secs(60);

/// A device, the fakes of its fabric (`F`, which the rig derefs to), the
/// hub, and a workflow service for them.
pub struct Fabric<F> {
    pub env: TestEnv,
    pub device: String,
    fakes: F,
    stops: Services,
}

impl<F> std::ops::Deref for Fabric<F> {
    type Target = F;

    fn deref(&self) -> &F {
        &self.fakes
    }
}

impl<F> Fabric<F> {
    /// A workflow service on `env` with `f`'s settings, for `device` and
    /// `fakes`; stopped before the hub `env` runs (`hub`).
    pub async fn new(
        env: TestEnv,
        hub: ServiceTask,
        device: String,
        fakes: F,
        f: impl FnOnce(&mut fleet_workflow::Config),
    ) -> Self {
        let (_w, trigger, task) = start_workflow(&env, f).await;
        Fabric {
            env,
            device,
            fakes,
            stops: vec![(trigger, task), hub].into(),
        }
    }

    /// A fabric job over the device (`customer_vrf`: a return's).
    pub async fn flip(
        &self,
        workflow: &str,
        simulate: bool,
        customer_vrf: Option<&str>,
    ) -> v1::Job {
        let device = std::slice::from_ref(&self.device);
        flip(&self.env, workflow, device, simulate, customer_vrf).await
    }

    /// The same, once it ends.
    pub async fn run(&self, workflow: &str, simulate: bool, customer_vrf: Option<&str>) -> v1::Job {
        let job = self.flip(workflow, simulate, customer_vrf).await;
        self.ended(&job).await
    }

    /// `job` once it ends.
    pub async fn ended(&self, job: &v1::Job) -> v1::Job {
        job_terminal(&self.env, &job.id, WITHIN).await
    }

    /// The device's `t` latch row: `(status, reason, observed_at)`.
    pub async fn latch(&self, t: &str) -> Option<(String, String, DateTime<Utc>)> {
        latch(&self.env, &self.device, t).await
    }

    /// Asserts the device's `t` latch reads `status` for `reason`; returns
    /// when it was observed.
    pub async fn latch_is(&self, t: &str, status: &str, reason: &str) -> DateTime<Utc> {
        let (s, r, at) = self.latch(t).await.unwrap_or_else(|| panic!("no {t} row"));
        assert_eq!((s.as_str(), r.as_str()), (status, reason));
        at
    }

    pub async fn stop(self) {
        self.stops.stop().await;
        self.env.cleanup().await;
    }
}

/// The latch row of `device`: `(status, reason, observed_at)`.
pub async fn latch(
    env: &TestEnv,
    device: &str,
    t: &str,
) -> Option<(String, String, DateTime<Utc>)> {
    sqlx::query_as(
        "SELECT status, reason, observed_at FROM device_conditions WHERE device_id = $1 AND type = $2",
    )
    .bind(device)
    .bind(t)
    .fetch_optional(&env.pool)
    .await
    .unwrap()
}

pub fn fabric_config(
    c: &mut fleet_workflow::Config,
    netbox: &FakeNetbox,
    site: fleet_workflow::SiteFabricConfig,
) {
    c.netbox.url = netbox.url.clone();
    c.netbox.auth_scheme = "token".into();
    c.netbox.token.value = fleet_runtime::config::Secret::new("netbox-token");
    c.fabric.nvue_username = "fleet-rw".into();
    c.fabric.nvue_password.value = fleet_runtime::config::Secret::new("nvue-password");
    site_fabric(c, site);
}

/// Site `s1` with the fabric settings `site`.
pub fn site_fabric(c: &mut fleet_workflow::Config, site: fleet_workflow::SiteFabricConfig) {
    c.sites.insert(
        "s1".into(),
        fleet_workflow::SiteConfig {
            fabric: site,
            ..Default::default()
        },
    );
}

pub fn switches(s: &[&FakeNvue]) -> BTreeMap<String, String> {
    s.iter().map(|n| (n.name.clone(), n.url.clone())).collect()
}

/// A fabric job over `devices`.
pub async fn flip(
    env: &TestEnv,
    workflow: &str,
    devices: &[String],
    simulate: bool,
    customer_vrf: Option<&str>,
) -> v1::Job {
    let params = customer_vrf
        .map(|vrf| {
            devices
                .iter()
                .map(|d| {
                    (
                        d.clone(),
                        v1::DeviceParams {
                            customer_vrf: vrf.into(),
                        },
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    create_with(env, workflow, devices, |r| {
        r.simulate = simulate;
        r.params = params;
    })
    .await
    .unwrap_or_else(|e| panic!("{workflow} job created: {e}"))
}

/// Waits until `check` holds of the fake's state.
pub async fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not in time"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
