//! The real Ironic (fake hardware) the workflow tests drive, started by
//! `tests/peers/ironic.sh` (from `tests/run`). Each test makes its own
//! nodes, named uniquely, and removes them.

use std::time::Duration;

use serde_json::{json, Value};

/// A random version 4 UUID.
pub fn random_uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

pub fn ironic_url() -> String {
    std::env::var("IRONIC_URL").unwrap_or_else(|_| "http://127.0.0.1:6385".into())
}

pub struct RealIronic {
    pub url: String,
    http: reqwest::Client,
    made: std::sync::Mutex<Vec<String>>,
}

const VERSION: &str = "1.80";

impl RealIronic {
    /// The peer, or a panic saying how to start it.
    pub async fn connect() -> RealIronic {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let url = ironic_url();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .build()
            .expect("http client");
        let ok = http
            .get(format!("{url}/v1/drivers"))
            .header("X-OpenStack-Ironic-API-Version", VERSION)
            .send()
            .await
            .map(|r| r.status().is_success())
            .unwrap_or(false);
        assert!(
            ok,
            "the real Ironic is needed at {url}: start it with `bash tests/peers/ironic.sh` (or set IRONIC_URL)"
        );
        RealIronic {
            url,
            http,
            made: Default::default(),
        }
    }

    /// One request; a node locked by its conductor (409 `NodeLocked`, as
    /// right after a transition or during a power sync) or the peer's SQLite
    /// busy (500 "database is locked", under parallel tests) is tried again
    /// for up to 10 s, as a client of Ironic would.
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (s, v) = self.call_once(method.clone(), path, body.clone()).await;
            let locked = (s == 409 || s == 500) && v.to_string().contains("locked");
            if !locked || tokio::time::Instant::now() > deadline {
                return (s, v);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn call_once(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut r = self
            .http
            .request(method, format!("{}/v1{path}", self.url))
            .header("X-OpenStack-Ironic-API-Version", VERSION);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.expect("ironic answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn node(&self, ident: &str) -> Value {
        let (s, v) = self
            .call(reqwest::Method::GET, &format!("/nodes/{ident}"), None)
            .await;
        assert_eq!(s, 200, "GET node {ident}: {v}");
        v
    }

    pub async fn patch(&self, ident: &str, ops: Value) {
        let (s, v) = self
            .call(
                reqwest::Method::PATCH,
                &format!("/nodes/{ident}"),
                Some(ops),
            )
            .await;
        assert_eq!(s, 200, "PATCH node {ident}: {v}");
    }

    /// Adds a trait to the node's own traits.
    pub async fn add_trait(&self, ident: &str, name: &str) {
        let (s, v) = self
            .call(
                reqwest::Method::PUT,
                &format!("/nodes/{ident}/traits/{name}"),
                None,
            )
            .await;
        assert_eq!(s, 204, "PUT trait {name} on {ident}: {v}");
    }

    /// The node's lessee and its own traits.
    pub async fn lessee_and_traits(&self, ident: &str) -> (Value, Vec<String>) {
        let n = self.node(ident).await;
        let traits = n["traits"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        (n["lessee"].clone(), traits)
    }

    /// Asks for a provision transition; returns Ironic's status code.
    pub async fn provision(&self, ident: &str, body: Value) -> (u16, Value) {
        self.call(
            reqwest::Method::PUT,
            &format!("/nodes/{ident}/states/provision"),
            Some(body),
        )
        .await
    }

    /// Waits until the node rests in `state` (no transition in flight).
    pub async fn wait_state(&self, ident: &str, state: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let n = self.node(ident).await;
            if n["provision_state"] == state && n["target_provision_state"].is_null() {
                return n;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {ident} did not reach {state}: {n}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A fake-hardware node moved to `available`; returns its uuid.
    pub async fn available_node(&self, name: &str) -> String {
        self.available_node_with(name, json!({})).await
    }

    /// The same, with more fields on the node (`"automated_clean": true`
    /// makes its teardown clean for 5 s, see `tests/peers/ironic.sh`).
    pub async fn available_node_with(&self, name: &str, extra: Value) -> String {
        let uuid = self.enroll_node(name, extra).await;
        let (s, v) = self.provision(&uuid, json!({"target": "manage"})).await;
        assert_eq!(s, 202, "manage {name}: {v}");
        self.wait_state(&uuid, "manageable").await;
        let (s, v) = self.provision(&uuid, json!({"target": "provide"})).await;
        assert_eq!(s, 202, "provide {name}: {v}");
        self.wait_state(&uuid, "available").await;
        uuid
    }

    /// A fake-hardware node left in `enroll` (with `extra` fields); returns
    /// its uuid.
    pub async fn enroll_node(&self, name: &str, extra: Value) -> String {
        let mut body = json!({"name": name, "driver": "fake-hardware", "resource_class": "gpu"});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let (s, v) = self.call(reqwest::Method::POST, "/nodes", Some(body)).await;
        assert_eq!(s, 201, "create node {name}: {v}");
        let uuid = v["uuid"].as_str().expect("node uuid").to_string();
        self.made.lock().unwrap().push(uuid.clone());
        self.wait_state(&uuid, "enroll").await;
        uuid
    }

    /// Removes every node this test made (undeploying what is deployed).
    pub async fn cleanup(&self) {
        let made: Vec<String> = std::mem::take(&mut *self.made.lock().unwrap());
        remove(&self.http, &self.url, made).await;
    }
}

/// A failed test removes its nodes too.
impl Drop for RealIronic {
    fn drop(&mut self) {
        let made: Vec<String> = std::mem::take(&mut *self.made.lock().unwrap());
        if made.is_empty() {
            return;
        }
        let (http, url) = (self.http.clone(), self.url.clone());
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(remove(&http, &url, made));
            }
        })
        .join();
    }
}

async fn remove(http: &reqwest::Client, url: &str, uuids: Vec<String>) {
    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        let mut r = http
            .request(method, format!("{url}/v1{path}"))
            .header("X-OpenStack-Ironic-API-Version", VERSION);
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            match r.send().await {
                Ok(resp) => resp.json::<Value>().await.unwrap_or(Value::Null),
                Err(_) => Value::Null,
            }
        }
    };
    for uuid in uuids {
        let _ = call(
            reqwest::Method::DELETE,
            format!("/nodes/{uuid}/maintenance"),
            None,
        )
        .await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let n = call(reqwest::Method::GET, format!("/nodes/{uuid}"), None).await;
            let state = n["provision_state"].as_str().unwrap_or("").to_string();
            let moving = !n["target_provision_state"].is_null();
            if tokio::time::Instant::now() > deadline || n.is_null() {
                break;
            }
            if moving {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            match state.as_str() {
                "active" | "deploy failed" => {
                    call(
                        reqwest::Method::PUT,
                        format!("/nodes/{uuid}/states/provision"),
                        Some(json!({"target": "deleted"})),
                    )
                    .await;
                }
                "clean hold" | "clean wait" => {
                    call(
                        reqwest::Method::PUT,
                        format!("/nodes/{uuid}/states/provision"),
                        Some(json!({"target": "abort"})),
                    )
                    .await;
                }
                _ => break,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = call(
            reqwest::Method::PATCH,
            format!("/nodes/{uuid}"),
            Some(json!([{"op": "remove", "path": "/instance_uuid"}])),
        )
        .await;
        let _ = call(reqwest::Method::DELETE, format!("/nodes/{uuid}"), None).await;
    }
}

/// connector-openstack reading the real Ironic for site `s1` (keyed by node
/// name, polled every `every_secs`), so the devices' Ironic mirror reaches
/// the hub as in production.
pub fn start_openstack_connector(
    env: &crate::TestEnv,
    ironic: &RealIronic,
    every_secs: f64,
) -> (
    fleet_runtime::shutdown::ShutdownTrigger,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    start_openstack_connector_with(env, ironic, every_secs, |_, _| {})
}

/// [`start_openstack_connector`] with `f` adjusting the connector and its
/// site `s1` (its maintenance project, `key_by`, ...).
pub fn start_openstack_connector_with(
    env: &crate::TestEnv,
    ironic: &RealIronic,
    every_secs: f64,
    f: impl FnOnce(&mut fleet_connector_openstack::Config, &mut fleet_openstack::SiteConfig),
) -> (
    fleet_runtime::shutdown::ShutdownTrigger,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let mut c = fleet_connector_openstack::Config::default();
    c.listen = "127.0.0.1:0".into();
    c.poll.resync_interval = Duration::from_secs_f64(every_secs);
    c.poll.jitter = 0.0;
    c.poll.resync_spread = 0.0;
    let mut site = fleet_openstack::SiteConfig {
        ironic_url: ironic.url.clone(),
        placement_enabled: false,
        ..Default::default()
    };
    f(&mut c, &mut site);
    c.sites.insert("s1".into(), site);
    let (trigger, shutdown) = fleet_runtime::Shutdown::new();
    let task = tokio::spawn(fleet_connector_openstack::run(
        env.common.clone(),
        c,
        shutdown,
    ));
    (trigger, task)
}
