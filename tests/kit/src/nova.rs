//! A Nova of the test's own (wiremock) whose compute driver is the real
//! Ironic: `POST /servers`, `GET /servers/{id}`, `GET /servers/detail?name=`
//! and `DELETE /servers/{id}` as Nova answers them (202, 404 `itemNotFound`,
//! 204), and a driver task that does what Nova's Ironic driver does on the
//! real Ironic: binds the node (`instance_uuid`, `instance_info`) and
//! deploys it for a server in `BUILD` (`ACTIVE` once the node is active,
//! `ERROR` on `deploy failed`), and for a server being deleted tears the
//! node down (`deleted`), waits for `available`, clears the binding and
//! drops the server. It records every create it accepted, so a test can
//! tell a recovered server from a second one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::connector::{header, json_body};
use crate::ironic::RealIronic;

/// One server as the fake keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeServer {
    pub id: String,
    pub name: String,
    pub status: String,
    pub task_state: Option<String>,
    /// The Ironic node (`hypervisor_hostname`); empty for one placed by
    /// the test that no driver deploys.
    pub node: String,
    /// What the create asked for (`imageRef`, `flavorRef`, network,
    /// `key_name`).
    pub image: String,
    pub flavor: String,
    pub network: String,
    pub key_name: String,
    pub fault: Option<String>,
    /// The driver has bound and deployed the node.
    spawned: bool,
    /// The driver has asked Ironic to tear the node down.
    torn: bool,
}

#[derive(Default)]
struct Inner {
    servers: BTreeMap<String, FakeServer>,
    /// Every server id a create was accepted for.
    created: Vec<String>,
    deletes: usize,
    /// The next create's build fails (`ERROR`, "No valid host was found.").
    fail_next_build: bool,
    /// The next `n` requests answer 503.
    unavailable: u32,
    /// Creates answer 403 with this message (a policy or quota refusal).
    refuse_creates: Option<String>,
}

#[derive(Clone)]
pub struct FakeNova {
    /// The compute endpoint (`.../compute/v2.1`).
    pub url: String,
    inner: Arc<Mutex<Inner>>,
    _server: Arc<MockServer>,
    _driver: Arc<Driver>,
}

struct Driver(tokio::task::JoinHandle<()>);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn error(status: u16, kind: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({kind: {"code": status, "message": message}}))
}

fn server_json(s: &FakeServer) -> Value {
    json!({
        "id": s.id, "name": s.name, "status": s.status,
        "OS-EXT-STS:task_state": s.task_state,
        "OS-EXT-SRV-ATTR:hypervisor_hostname": if s.node.is_empty() { None } else { Some(&s.node) },
        "fault": s.fault.as_ref().map(|m| json!({"code": 500, "message": m})),
    })
}

struct Api(Arc<Mutex<Inner>>);

impl Respond for Api {
    fn respond(&self, r: &Request) -> ResponseTemplate {
        // The Nova arm needs compute 2.74 (hypervisor_hostname).
        let minor = header(r, "openstack-api-version")
            .strip_prefix("compute 2.")
            .and_then(|m| m.parse::<u32>().ok());
        if minor.is_none_or(|m| m < 74) {
            return error(
                400,
                "badRequest",
                "this test's Nova needs compute 2.74 or later",
            );
        }
        let tail = r.url.path().trim_start_matches("/compute/v2.1/servers");
        let mut s = self.0.lock().unwrap();
        if s.unavailable > 0 {
            s.unavailable -= 1;
            return error(503, "computeFault", "simulated outage: nova-api is down");
        }
        if r.method.as_str() == "POST" {
            if let Some(m) = &s.refuse_creates {
                return error(403, "forbidden", m);
            }
        }
        match (r.method.as_str(), tail.trim_start_matches('/')) {
            ("POST", "") => s.create(r),
            ("GET", "detail") => {
                let name = r
                    .url
                    .query_pairs()
                    .find(|(k, _)| k == "name")
                    .map(|(_, v)| fleet_openstack::nova::name_of_filter(&v));
                let servers: Vec<Value> = s
                    .servers
                    .values()
                    .filter(|x| name.as_ref().is_none_or(|n| &x.name == n))
                    .map(server_json)
                    .collect();
                ResponseTemplate::new(200).set_body_json(json!({ "servers": servers }))
            }
            ("GET", id) => match s.servers.get(id) {
                Some(x) => {
                    ResponseTemplate::new(200).set_body_json(json!({"server": server_json(x)}))
                }
                None => error(
                    404,
                    "itemNotFound",
                    &format!("Instance {id} could not be found."),
                ),
            },
            ("DELETE", id) => match s.servers.get_mut(id) {
                Some(x) => {
                    x.task_state = Some("deleting".into());
                    s.deletes += 1;
                    ResponseTemplate::new(204)
                }
                None => error(
                    404,
                    "itemNotFound",
                    &format!("Instance {id} could not be found."),
                ),
            },
            _ => error(405, "badRequest", "not modelled"),
        }
    }
}

impl Inner {
    fn create(&mut self, r: &Request) -> ResponseTemplate {
        let body = match json_body(r) {
            Ok(b) => b,
            Err(refused) => return refused,
        };
        let b = &body["server"];
        let field = |k: &str| b[k].as_str().unwrap_or_default().to_string();
        let network = b["networks"][0]["uuid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for (k, v) in [
            ("name", field("name")),
            ("imageRef", field("imageRef")),
            ("flavorRef", field("flavorRef")),
            ("networks", network.clone()),
        ] {
            if v.is_empty() {
                return error(
                    400,
                    "badRequest",
                    &format!("Invalid input: '{k}' is a required property"),
                );
            }
        }
        let id = crate::ironic::random_uuid();
        let fail = std::mem::take(&mut self.fail_next_build);
        let server = FakeServer {
            id: id.clone(),
            name: field("name"),
            status: if fail { "ERROR".into() } else { "BUILD".into() },
            task_state: None,
            node: field("hypervisor_hostname"),
            image: field("imageRef"),
            flavor: field("flavorRef"),
            network,
            key_name: field("key_name"),
            fault: fail
                .then(|| "No valid host was found. There are not enough hosts available.".into()),
            spawned: false,
            torn: false,
        };
        self.servers.insert(id.clone(), server);
        self.created.push(id.clone());
        ResponseTemplate::new(202).set_body_json(json!({"server": {"id": id, "links": []}}))
    }
}

impl FakeNova {
    /// Serves Nova and starts its driver on the real Ironic.
    pub async fn start() -> FakeNova {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/compute/v2.1/servers"))
            .respond_with(Api(inner.clone()))
            .mount(&server)
            .await;
        for verb in ["GET", "DELETE"] {
            Mock::given(method(verb))
                .and(path_regex("^/compute/v2.1/servers/[^/]+$"))
                .respond_with(Api(inner.clone()))
                .mount(&server)
                .await;
        }
        let ironic = RealIronic::connect().await;
        let driver = tokio::spawn(drive(inner.clone(), ironic));
        FakeNova {
            url: format!("{}/compute/v2.1", server.uri()),
            inner,
            _server: Arc::new(server),
            _driver: Arc::new(Driver(driver)),
        }
    }

    /// The servers the fake holds now.
    pub fn servers(&self) -> Vec<FakeServer> {
        self.inner
            .lock()
            .unwrap()
            .servers
            .values()
            .cloned()
            .collect()
    }

    /// The ids of every server a create was accepted for.
    pub fn created(&self) -> Vec<String> {
        self.inner.lock().unwrap().created.clone()
    }

    pub fn deletes(&self) -> usize {
        self.inner.lock().unwrap().deletes
    }

    /// The next create's build fails in Nova (the server goes to ERROR
    /// without reaching Ironic).
    pub fn fail_next_build(&self) {
        self.inner.lock().unwrap().fail_next_build = true;
    }

    /// The next `n` requests answer 503 (an outage).
    pub fn unavailable(&self, n: u32) {
        self.inner.lock().unwrap().unavailable = n;
    }

    /// Every create answers 403 with `message` from now on.
    pub fn refuse_creates(&self, message: &str) {
        self.inner.lock().unwrap().refuse_creates = Some(message.into());
    }

    /// A server the test places (named `name`, on Ironic node `node` or on
    /// none, in `status`), as another actor's or an earlier run's would
    /// be; one in `BUILD` on a node is deployed by the driver. Returns its
    /// id.
    pub fn place(&self, name: &str, node: &str, status: &str) -> String {
        let id = crate::ironic::random_uuid();
        self.inner.lock().unwrap().servers.insert(
            id.clone(),
            FakeServer {
                id: id.clone(),
                name: name.into(),
                status: status.into(),
                task_state: None,
                node: node.into(),
                image: String::new(),
                flavor: String::new(),
                network: String::new(),
                key_name: String::new(),
                fault: None,
                spawned: false,
                torn: false,
            },
        );
        id
    }
}

/// One pass of Nova's Ironic driver over every server, every 200 ms.
async fn drive(inner: Arc<Mutex<Inner>>, ironic: RealIronic) {
    loop {
        let servers: Vec<FakeServer> = inner.lock().unwrap().servers.values().cloned().collect();
        for s in servers {
            if s.node.is_empty() {
                // Placed by the test: deleting it just drops it.
                if s.task_state.is_some() {
                    inner.lock().unwrap().servers.remove(&s.id);
                }
                continue;
            }
            if let Some(update) = step(&ironic, &s).await {
                let mut g = inner.lock().unwrap();
                match update {
                    Update::Gone => {
                        g.servers.remove(&s.id);
                    }
                    Update::Set(f) => {
                        if let Some(x) = g.servers.get_mut(&s.id) {
                            f(x);
                        }
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

enum Update {
    Gone,
    Set(Box<dyn FnOnce(&mut FakeServer) + Send>),
}

async fn step(ironic: &RealIronic, s: &FakeServer) -> Option<Update> {
    let (code, node) = ironic
        .call(reqwest::Method::GET, &format!("/nodes/{}", s.node), None)
        .await;
    if code != 200 {
        return None;
    }
    let state = node["provision_state"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let moving = !node["target_provision_state"].is_null();
    let bound = node["instance_uuid"].as_str() == Some(s.id.as_str());
    if s.task_state.as_deref() == Some("deleting") {
        if !bound {
            return Some(Update::Gone);
        }
        if !s.torn
            && (state == "active" || state == "deploy failed")
            && (!moving || state == "deploy failed")
        {
            let (c, _) = ironic
                .call(
                    reqwest::Method::PUT,
                    &format!("/nodes/{}/states/provision", s.node),
                    Some(json!({"target": "deleted"})),
                )
                .await;
            if c == 202 {
                return Some(Update::Set(Box::new(|x| x.torn = true)));
            }
            return None;
        }
        if state == "available" && !moving {
            ironic
                .call(
                    reqwest::Method::PATCH,
                    &format!("/nodes/{}", s.node),
                    Some(json!([
                        {"op": "remove", "path": "/instance_uuid"},
                        {"op": "replace", "path": "/instance_info", "value": {}},
                    ])),
                )
                .await;
            return Some(Update::Gone);
        }
        return None;
    }
    if s.status != "BUILD" {
        return None;
    }
    if !s.spawned {
        if state != "available" || moving || !node["instance_uuid"].is_null() {
            return Some(Update::Set(Box::new(|x| {
                x.status = "ERROR".into();
                x.fault = Some("the node is not available for this server".into());
            })));
        }
        let (c, v) = ironic
            .call(
                reqwest::Method::PATCH,
                &format!("/nodes/{}", s.node),
                Some(json!([
                    {"op": "add", "path": "/instance_uuid", "value": s.id},
                    {"op": "add", "path": "/instance_info", "value": {
                        "image_source": format!("http://images.invalid/{}.qcow2", s.image),
                        "image_checksum": "0123456789abcdef0123456789abcdef",
                    }},
                ])),
            )
            .await;
        if c != 200 {
            tracing::warn!(server = %s.id, code = c, body = %v, "fake nova: bind refused");
            return None;
        }
        let (c, _) = ironic
            .call(
                reqwest::Method::PUT,
                &format!("/nodes/{}/states/provision", s.node),
                Some(json!({"target": "active"})),
            )
            .await;
        if c == 202 {
            return Some(Update::Set(Box::new(|x| x.spawned = true)));
        }
        return None;
    }
    match state.as_str() {
        "active" if !moving && bound => Some(Update::Set(Box::new(|x| x.status = "ACTIVE".into()))),
        "deploy failed" => Some(Update::Set(Box::new(|x| {
            x.status = "ERROR".into();
            x.fault = Some("Failed to provision instance: deploy failed".into());
        }))),
        _ => None,
    }
}
