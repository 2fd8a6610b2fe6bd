//! A real nats-server running the configuration compose and Helm ship
//! (`helm/fleet/files/nats.conf`), with the passwords compose defaults to,
//! plus one unrestricted `test-admin` user the test itself reads with.

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fleet::config::FleetConfig;

use crate::support::{repo, TestEnv};

pub const ADMIN: (&str, &str) = ("test-admin", "test-admin-pw");
pub const AGENT_PASSWORD: &str = "dev-agent";

/// `${VAR:-default}` -> default (compose's own defaults).
fn compose_default(v: &str) -> String {
    let mut out = String::new();
    let mut rest = v;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let end = rest[at..].find('}').expect("closing brace") + at;
        let inner = &rest[at + 2..end];
        out.push_str(inner.split_once(":-").map(|(_, d)| d).unwrap_or(""));
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

fn yaml_str(v: &serde_yaml_ng::Value) -> String {
    match v {
        serde_yaml_ng::Value::String(s) => s.clone(),
        serde_yaml_ng::Value::Number(n) => n.to_string(),
        serde_yaml_ng::Value::Bool(b) => b.to_string(),
        other => panic!("unexpected YAML value {other:?}"),
    }
}

/// compose.yaml: the NATS passwords it hands nats-server, and each fleet
/// service's environment, with `${VAR:-default}` resolved to the default.
pub struct Compose {
    pub nats_passwords: BTreeMap<String, String>,
    pub services: BTreeMap<String, BTreeMap<String, String>>,
}

pub fn compose() -> Compose {
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(repo("compose.yaml")).unwrap()).unwrap();
    let env_of = |v: &serde_yaml_ng::Value| -> BTreeMap<String, String> {
        v.as_mapping()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (yaml_str(k), compose_default(&yaml_str(v))))
                    .collect()
            })
            .unwrap_or_default()
    };
    let nats_passwords = env_of(&doc["services"]["nats"]["environment"]);
    let mut services = BTreeMap::new();
    for (name, svc) in doc["services"].as_mapping().unwrap() {
        let env = env_of(&svc["environment"]);
        if env.contains_key("FLEET__NATS__URL") {
            services.insert(yaml_str(name), env);
        }
    }
    Compose {
        nats_passwords,
        services,
    }
}

pub struct ShippedNats {
    /// The first server's client port.
    pub port: u16,
    /// Every server's client port (one, or the nodes of a cluster).
    pub ports: Vec<u16>,
    children: Vec<Child>,
    dir: std::path::PathBuf,
}

impl Drop for ShippedNats {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl ShippedNats {
    /// One server running the shipped configuration.
    pub async fn start() -> ShippedNats {
        Self::start_nodes(1).await
    }

    /// A 3-node cluster, each node running the shipped configuration, as
    /// compose and Helm run it (docs/scaling.md).
    pub async fn cluster() -> ShippedNats {
        Self::start_nodes(3).await
    }

    async fn start_nodes(n: usize) -> ShippedNats {
        let ports: Vec<u16> = (0..n)
            .map(|_| fleet_testkit::connector::free_port())
            .collect();
        let routes: Vec<u16> = (0..n)
            .map(|_| fleet_testkit::connector::free_port())
            .collect();
        let route_urls = routes
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let dir = std::env::temp_dir().join(format!("fleet-shipped-nats-{}", ulid::Ulid::new()));
        std::fs::create_dir_all(&dir).unwrap();
        let shipped = std::fs::read_to_string(repo("helm/fleet/files/nats.conf")).unwrap();
        assert!(shipped.contains("port: 4222") && shipped.contains("    users: ["));
        let mut children = vec![];
        for (i, port) in ports.iter().enumerate() {
            let conf = shipped
                .replace("port: 4222", &format!("port: {port}"))
                .replace("http_port: 8222", "")
                .replace(
                    "\"/data/jetstream\"",
                    &format!("\"{}\"", dir.join(format!("js{i}")).display()),
                )
                .replace(
                    "    users: [",
                    &format!(
                        "    users: [\n      {{ user: {}, password: {} }}",
                        ADMIN.0, ADMIN.1
                    ),
                );
            let path = dir.join(format!("nats{i}.conf"));
            std::fs::write(&path, conf).unwrap();
            let mut cmd = Command::new("nats-server");
            cmd.arg("-c")
                .arg(&path)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if n > 1 {
                cmd.args(["--server_name", &format!("nats-{}", i + 1)])
                    .args(["--cluster_name", "fleet"])
                    .args(["--cluster", &format!("nats://127.0.0.1:{}", routes[i])])
                    .args(["--routes", &route_urls]);
            }
            for (k, v) in compose().nats_passwords {
                cmd.env(k, v);
            }
            cmd.env("FLEET_NATS_AGENT_PASSWORD", AGENT_PASSWORD);
            children.push(
                cmd.spawn()
                    .expect("nats-server is needed on PATH (Debian package nats-server)"),
            );
        }
        let nats = ShippedNats {
            port: ports[0],
            ports,
            children,
            dir,
        };
        nats.until_ready(n).await;
        nats
    }

    /// Waits until every server answers and JetStream can place a stream
    /// on all of them (a cluster has elected its meta leader).
    async fn until_ready(&self, replicas: usize) {
        for port in &self.ports {
            for _ in 0..100 {
                if tokio::net::TcpStream::connect(("127.0.0.1", *port))
                    .await
                    .is_ok()
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if replicas == 1 {
            return;
        }
        let first = self.url().split(',').next().unwrap_or_default().to_string();
        fleet_testkit::nats_cluster::until_replicated(replicas, || async {
            async_nats::ConnectOptions::with_user_and_password(ADMIN.0.into(), ADMIN.1.into())
                .connect(first.as_str())
                .await
                .map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|e| panic!("the shipped NATS cluster did not form within 30 s: {e}"));
    }

    /// Every server's address, comma-separated, as `nats.url` takes them.
    pub fn url(&self) -> String {
        fleet_testkit::nats_cluster::loopback_urls(&self.ports)
    }

    /// A test environment (fresh database) on this server, with the shipped
    /// subject root and stream names, reading as `test-admin`.
    pub async fn env(&self) -> TestEnv {
        self.env_with(fleet_bus::NatsConfig::default().partitions)
            .await
    }

    /// [`Self::env`] for services configured with `partitions` (Helm pins
    /// its own count; compose leaves the default).
    pub async fn env_with(&self, partitions: u32) -> TestEnv {
        let url = self.url();
        let replicas = self.ports.len();
        TestEnv::with_nats_config(move |n| {
            n.url = url;
            n.num_replicas = replicas;
            n.user = ADMIN.0.into();
            n.password = fleet_bus::Secret::new(ADMIN.1);
            n.subject_root = "fleet".into();
            n.radar_root = "radar".into();
            n.stream_prefix = String::new();
            n.partitions = partitions;
        })
        .await
    }

    /// A service's configuration exactly as compose gives it (environment
    /// through `FleetConfig::load_from`), pointed at this server, the test's
    /// database and free ports.
    pub fn service_config(&self, service: &str, env: &TestEnv) -> FleetConfig {
        let compose = compose();
        let vars = compose
            .services
            .get(service)
            .unwrap_or_else(|| panic!("compose.yaml has no fleet service {service}"));
        self.config_from(service, vars, env)
    }

    /// A configuration from a deployment's environment, with the NATS host
    /// made this server and the database the test's.
    pub fn config_from(
        &self,
        what: &str,
        vars: &BTreeMap<String, String>,
        env: &TestEnv,
    ) -> FleetConfig {
        let mut map: HashMap<String, String> = HashMap::new();
        for (k, v) in vars {
            let v = self.to_these_servers(v);
            if k == "FLEET__DATABASE__URL" {
                map.insert(k.clone(), env.common.database.url.clone());
            } else if k.ends_with("__LISTEN") {
                map.insert(k.clone(), "127.0.0.1:0".into());
            } else if !k.starts_with("OTEL_") {
                map.insert(k.clone(), v);
            }
        }
        let mut c = FleetConfig::load_from(None, Some(map))
            .unwrap_or_else(|e| panic!("{what}: the configuration loads: {e}"));
        c.database.url = env.common.database.url.clone();
        c.database.max_connections = 4;
        c
    }

    /// A deployment's NATS addresses made these servers': compose's
    /// `nats`, `nats-2`, `nats-3` and Helm's `<release>-nats-<i>` pods, in
    /// order; one server takes every address.
    fn to_these_servers(&self, v: &str) -> String {
        if !v.contains("://") || !v.contains(":4222") {
            return v.to_string();
        }
        let parts: Vec<String> = v
            .split(',')
            .enumerate()
            .map(|(i, u)| {
                let port = self.ports[i.min(self.ports.len() - 1)];
                let (scheme, rest) = u.trim().split_once("://").expect("a URL");
                let (userinfo, _) = rest
                    .rsplit_once('@')
                    .map(|(u, h)| (format!("{u}@"), h))
                    .unwrap_or((String::new(), rest));
                format!("{scheme}://{userinfo}127.0.0.1:{port}")
            })
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        parts
            .into_iter()
            .filter(|p| seen.insert(p.clone()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A client as `user` that records the server's permission errors.
    pub async fn client(
        &self,
        user: &str,
        password: &str,
    ) -> (
        async_nats::Client,
        tokio::sync::mpsc::UnboundedReceiver<String>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut n = fleet_bus::NatsConfig {
            url: self.url(),
            user: user.into(),
            password: fleet_bus::Secret::new(password),
            ..Default::default()
        };
        n.subject_root = "fleet".into();
        let client = n
            .options("fleet-test")
            .await
            .unwrap()
            .event_callback(move |e| {
                let tx = tx.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = e {
                        let _ = tx.send(e.to_string());
                    }
                }
            })
            .connect(n.server_addrs().unwrap())
            .await
            .unwrap_or_else(|e| panic!("{user} connects: {e}"));
        (client, rx)
    }
}

/// Every server error that arrives within `wait`.
pub async fn errors_within(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    wait: Duration,
) -> Vec<String> {
    let mut out = vec![];
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(e)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        out.push(e);
    }
    out
}

/// One workload of the rendered Helm chart.
#[derive(Debug, serde::Deserialize)]
pub struct Workload {
    pub args: Vec<String>,
    pub env: BTreeMap<String, serde_json::Value>,
}

/// helm/fleet rendered with Helm's own library (`tests/helm/render.py`,
/// helm-python-sdk), every workload's environment with its Secret
/// references resolved the way a cluster would: a NATS password key to the
/// password nats-server has under that name.
pub fn helm() -> BTreeMap<String, (Vec<String>, BTreeMap<String, String>)> {
    let mut args = vec![repo("tests/helm/render.py")];
    for c in ["netbox", "openstack", "slurm", "health", "borneo", "fabric"] {
        args.push(format!("services.connector-{c}.enabled=true"));
    }
    let out = Command::new("python3")
        .args(&args)
        .output()
        .expect("python3 runs tests/helm/render.py");
    assert!(
        out.status.success(),
        "rendering helm/fleet failed (install with: python3 -m pip install helm-python-sdk kubernetes-validate pyyaml): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let workloads: BTreeMap<String, Workload> = serde_json::from_slice(&out.stdout).unwrap();
    let passwords = compose().nats_passwords;
    workloads
        .into_iter()
        .map(|(name, w)| {
            let env = w
                .env
                .into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        serde_json::Value::String(s) => s,
                        other => {
                            let key = other["key"].as_str().unwrap().to_string();
                            if key.starts_with("FLEET_NATS_") {
                                if key == "FLEET_NATS_AGENT_PASSWORD" {
                                    AGENT_PASSWORD.to_string()
                                } else {
                                    passwords.get(&key).cloned().unwrap_or_else(|| {
                                        panic!("{name}: no NATS password named {key}")
                                    })
                                }
                            } else {
                                // The database URL: the test's.
                                String::new()
                            }
                        }
                    };
                    (k, v)
                })
                .collect();
            (name, (w.args, env))
        })
        .collect()
}
