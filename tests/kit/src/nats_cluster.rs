//! A NATS cluster of the test's own: `nats-server` processes on loopback
//! ports, routed to each other, each with JetStream and a store directory
//! of its own, for tests that lose a server (docs/scaling.md). Every
//! process is killed and every directory removed when it is dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use async_nats::jetstream::stream;

pub struct NatsCluster {
    /// Client ports, one per server.
    pub ports: Vec<u16>,
    /// Server names (`n0`, `n1`, ...), as stream leaders are reported.
    pub names: Vec<String>,
    servers: Vec<Option<Child>>,
    dir: PathBuf,
}

fn port() -> u16 {
    fleet_runtime::http::free_listen_addr()
        .expect("a free loopback port")
        .port()
}

impl NatsCluster {
    /// Starts `n` servers in one cluster and waits until JetStream can
    /// place a stream with `n` replicas on them.
    pub async fn start(n: usize) -> NatsCluster {
        let dir = std::env::temp_dir().join(format!("fleet-nats-cluster-{}", ulid::Ulid::new()));
        std::fs::create_dir_all(&dir).unwrap();
        let ports: Vec<u16> = (0..n).map(|_| port()).collect();
        let routes: Vec<u16> = (0..n).map(|_| port()).collect();
        let names: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        let route_urls = routes
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut servers = vec![];
        for i in 0..n {
            let log = std::fs::File::create(dir.join(format!("{}.log", names[i]))).unwrap();
            let child = Command::new("nats-server")
                .args(["-a", "127.0.0.1", "-p", &ports[i].to_string(), "-js"])
                .arg("-sd")
                .arg(dir.join(&names[i]))
                .args(["--server_name", &names[i], "--cluster_name", "fleet-test"])
                .args(["--cluster", &format!("nats://127.0.0.1:{}", routes[i])])
                .args(["--routes", &route_urls])
                .stdout(Stdio::null())
                .stderr(Stdio::from(log))
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("nats-server is needed on PATH (Debian package nats-server): {e}")
                });
            servers.push(Some(child));
        }
        let cluster = NatsCluster {
            ports,
            names,
            servers,
            dir,
        };
        cluster.until_replicated(n).await;
        cluster
    }

    /// Every server's address, comma-separated, as `nats.url` takes them.
    pub fn url(&self) -> String {
        loopback_urls(&self.ports)
    }

    /// Kills server `i` with SIGKILL (its store stays, as after a crash).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.servers[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The index of the server called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// The servers' logs, for a failing test's message.
    pub fn logs(&self) -> String {
        self.names
            .iter()
            .map(|n| {
                let log =
                    std::fs::read_to_string(self.dir.join(format!("{n}.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                format!(
                    "--- {n} ---\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits (30 s at most) until the cluster can place a stream with
    /// `replicas` copies: the routes are up and JetStream has a meta leader.
    async fn until_replicated(&self, replicas: usize) {
        let addrs: Vec<async_nats::ServerAddr> = self
            .url()
            .split(',')
            .map(|u| u.parse().expect("a server address"))
            .collect();
        if let Err(e) = until_replicated(replicas, || async {
            async_nats::connect(addrs.clone())
                .await
                .map_err(|e| e.to_string())
        })
        .await
        {
            panic!(
                "the NATS cluster did not come up within 30 s: {e}\n{}",
                self.logs()
            );
        }
    }
}

/// `nats://127.0.0.1:<port>` for every port, comma-separated, as `nats.url`
/// takes a cluster.
pub fn loopback_urls(ports: &[u16]) -> String {
    ports
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Waits (30 s at most) until a probe stream with `replicas` copies can be
/// created through a client `connect` makes; the last error otherwise.
pub async fn until_replicated<F, Fut>(replicas: usize, connect: F) -> Result<(), String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<async_nats::Client, String>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let probe = format!("PROBE_{}", ulid::Ulid::new());
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        match connect().await {
            Err(e) => last = e,
            Ok(client) => {
                let js = async_nats::jetstream::new(client);
                let config = stream::Config {
                    name: probe.clone(),
                    subjects: vec![format!("probe.{probe}")],
                    num_replicas: replicas,
                    storage: stream::StorageType::Memory,
                    ..Default::default()
                };
                match js.create_stream(config).await {
                    Ok(_) => {
                        let _ = js.delete_stream(&probe).await;
                        return Ok(());
                    }
                    Err(e) => last = e.to_string(),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last)
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.servers.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
