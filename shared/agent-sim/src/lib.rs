//! A simulated node agent: the node agent protocol of `agent.proto` over
//! NATS, with no hardware behind it. It joins with a join token and
//! generated hardware identifiers, opens sessions, heartbeats, closes (or
//! goes silent), and answers relayed commands from a fake inventory.
//! `fleet sim agents --count N` runs a fleet of them ([`run_agents`]);
//! `fleet dev` and the gateway's tests drive single agents.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use fleet_bus::Subjects;
use fleet_proto::{v1, ErrorCode, Message};
use fleet_runtime::Shutdown;
use futures::StreamExt;

/// The GPU model every simulated machine reports (`nvidia-smi`'s name).
pub const GPU_MODEL: &str = "NVIDIA H100 80GB HBM3";

/// What a simulated machine reports.
#[derive(Debug, Clone)]
pub struct SimSpec {
    pub hostname: String,
    pub hardware: v1::HardwareIdentifiers,
    pub inventory: v1::Inventory,
}

impl SimSpec {
    /// A machine numbered `i`: serials, a BMC MAC, two NIC MACs and a TPM
    /// hash derived from `prefix` and `i`, so the same number is the same
    /// machine (and re-joins in place).
    pub fn numbered(prefix: &str, i: usize, gpus: u32) -> SimSpec {
        let n = i as u64;
        let h = fleet_domain_hash(prefix);
        let mac = |k: u64| {
            let v = (h ^ (n << 8) ^ k) & 0x00ff_ffff_ffff;
            // A locally administered unicast address.
            let v = (v | 0x0200_0000_0000) & !0x0100_0000_0000;
            let b = v.to_be_bytes();
            format!(
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                b[2], b[3], b[4], b[5], b[6], b[7]
            )
        };
        SimSpec {
            hostname: format!("{prefix}-{i:05}"),
            hardware: v1::HardwareIdentifiers {
                system_serial: format!("SIM{h:08X}S{i:06}"),
                board_serial: format!("SIM{h:08X}B{i:06}"),
                bmc_mac: mac(1),
                nic_macs: vec![mac(2), mac(3)],
                tpm_ek_hash: format!("{:016x}{:016x}{:016x}{:016x}", h, n + 1, h ^ n, 0x5151u64),
            },
            inventory: v1::Inventory {
                gpu_count: gpus as i32,
                gpu_model: GPU_MODEL.into(),
                cpu_count: 112,
                memory_bytes: 2 << 40,
            },
        }
    }
}

/// FNV-1a, so generated identifiers do not depend on a hasher's seed.
fn fleet_domain_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h & 0xffff_ffff
}

/// What the gateway answered instead of success.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct SimError {
    pub code: String,
    pub message: String,
}

impl SimError {
    fn new(code: &str, message: impl Into<String>) -> Self {
        SimError {
            code: code.to_string(),
            message: message.into(),
        }
    }
    fn from_proto(e: &v1::AgentError) -> Self {
        SimError::new(
            fleet_proto::error_code_of(e.code).as_str_name(),
            e.message.clone(),
        )
    }
}

#[derive(Debug, Default)]
struct Shared {
    epoch: i64,
    inventory: v1::Inventory,
    received: Vec<String>,
}

pub struct SimAgent {
    nats: async_nats::Client,
    subjects: Subjects,
    pub spec: SimSpec,
    pub device_id: String,
    pub credential: String,
    pub identity_generation: i64,
    pub epoch: i64,
    pub session_token: String,
    pub platform_secrets: BTreeMap<String, String>,
    pub heartbeat_interval: Duration,
    seq: u64,
    shared: Arc<Mutex<Shared>>,
    listener: Option<tokio::task::JoinHandle<()>>,
    timeout: Duration,
}

impl Drop for SimAgent {
    fn drop(&mut self) {
        if let Some(l) = self.listener.take() {
            l.abort();
        }
    }
}

impl SimAgent {
    pub fn new(nats: async_nats::Client, subjects: Subjects, spec: SimSpec) -> Self {
        let shared = Shared {
            inventory: spec.inventory.clone(),
            ..Default::default()
        };
        SimAgent {
            nats,
            subjects,
            spec,
            device_id: String::new(),
            credential: String::new(),
            identity_generation: 0,
            epoch: 0,
            session_token: String::new(),
            platform_secrets: BTreeMap::new(),
            heartbeat_interval: Duration::from_secs(10),
            seq: 0,
            shared: Arc::new(Mutex::new(shared)),
            listener: None,
            timeout: Duration::from_secs(30),
        }
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn call<R: Message + Default>(
        &self,
        subject: String,
        payload: Vec<u8>,
    ) -> Result<R, SimError> {
        let asked = self.nats.request(subject, Bytes::from(payload));
        let msg = tokio::time::timeout(self.timeout, asked)
            .await
            .map_err(|_| {
                SimError::new(
                    ErrorCode::Unavailable.as_str_name(),
                    "the gateway did not answer in time",
                )
            })?
            .map_err(|e| SimError::new(ErrorCode::Unavailable.as_str_name(), e.to_string()))?;
        R::decode(msg.payload.as_ref()).map_err(|e| {
            SimError::new(
                ErrorCode::Unavailable.as_str_name(),
                format!("undecodable reply: {e}"),
            )
        })
    }

    /// Joins with a join token; keeps the device id and credential.
    pub async fn join(&mut self, join_token: &str) -> Result<v1::JoinReply, SimError> {
        let req = v1::JoinRequest {
            join_token: join_token.to_string(),
            hostname: self.spec.hostname.clone(),
            hardware: Some(self.spec.hardware.clone()),
            inventory: Some(self.shared().inventory.clone()),
            agent_version: "sim/1".into(),
        };
        let r: v1::JoinReply = self
            .call(self.subjects.agent_join(), req.encode_to_vec())
            .await?;
        if let Some(e) = &r.error {
            return Err(SimError::from_proto(e));
        }
        self.device_id = r.device_id.clone();
        self.credential = r.credential.clone();
        self.identity_generation = r.identity_generation;
        Ok(r)
    }

    /// Opens a session and (re)starts answering commands for it.
    pub async fn open(&mut self) -> Result<v1::SessionOpened, SimError> {
        if self.device_id.is_empty() {
            return Err(SimError::new(
                ErrorCode::InvalidArgument.as_str_name(),
                "join first",
            ));
        }
        self.listen().await?;
        let req = v1::OpenSession {
            device_id: self.device_id.clone(),
            credential: self.credential.clone(),
        };
        let r: v1::SessionOpened = self
            .call(
                self.subjects.agent(&self.device_id, "open"),
                req.encode_to_vec(),
            )
            .await?;
        if let Some(e) = &r.error {
            return Err(SimError::from_proto(e));
        }
        self.epoch = r.epoch;
        self.session_token = r.session_token.clone();
        self.platform_secrets = r.platform_secrets.clone().into_iter().collect();
        if r.heartbeat_interval_secs > 0 {
            self.heartbeat_interval = Duration::from_secs(r.heartbeat_interval_secs as u64);
        }
        self.shared().epoch = r.epoch;
        Ok(r)
    }

    pub async fn heartbeat(&mut self) -> Result<(), SimError> {
        self.seq += 1;
        let req = v1::Heartbeat {
            device_id: self.device_id.clone(),
            epoch: self.epoch,
            session_token: self.session_token.clone(),
            seq: self.seq,
            // The simulated node converges its first spec at once.
            observed_generation: 1,
        };
        let r: v1::HeartbeatAck = self
            .call(
                self.subjects.agent(&self.device_id, "heartbeat"),
                req.encode_to_vec(),
            )
            .await?;
        match r.error {
            Some(e) => Err(SimError::from_proto(&e)),
            None => Ok(()),
        }
    }

    /// A clean close.
    pub async fn close(&mut self) -> Result<(), SimError> {
        let req = v1::CloseSession {
            device_id: self.device_id.clone(),
            epoch: self.epoch,
            session_token: self.session_token.clone(),
            reason: "agent shutdown".into(),
        };
        let r: v1::SessionClosed = self
            .call(
                self.subjects.agent(&self.device_id, "close"),
                req.encode_to_vec(),
            )
            .await?;
        self.stop_listening();
        match r.error {
            Some(e) => Err(SimError::from_proto(&e)),
            None => Ok(()),
        }
    }

    /// Stops answering commands (a crashed or unplugged machine).
    pub fn stop_listening(&mut self) {
        if let Some(l) = self.listener.take() {
            l.abort();
        }
    }

    /// The GPUs the next `inventory.refresh` reports (a GPU fell off the bus).
    pub fn set_gpu_count(&self, n: u32) {
        self.shared().inventory.gpu_count = n as i32;
    }

    /// The commands this agent received, in order.
    pub fn received(&self) -> Vec<String> {
        self.shared().received.clone()
    }

    async fn listen(&mut self) -> Result<(), SimError> {
        self.stop_listening();
        let mut sub = self
            .nats
            .subscribe(self.subjects.agent(&self.device_id, "cmd"))
            .await
            .map_err(|e| SimError::new(ErrorCode::Unavailable.as_str_name(), e.to_string()))?;
        // The subscription is live at the server before the session opens.
        self.nats
            .flush()
            .await
            .map_err(|e| SimError::new(ErrorCode::Unavailable.as_str_name(), e.to_string()))?;
        let (nats, shared) = (self.nats.clone(), self.shared.clone());
        self.listener = Some(tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let Some(reply) = msg.reply.clone() else {
                    continue;
                };
                let Ok(cmd) = v1::AgentCommand::decode(msg.payload.as_ref()) else {
                    continue;
                };
                let (result, delay) = {
                    let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
                    if cmd.epoch != s.epoch {
                        // Not this session's command: stay silent.
                        continue;
                    }
                    s.received.push(cmd.command.clone());
                    let delay = cmd
                        .args
                        .get("sleep_ms")
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0);
                    (
                        answer(&cmd, &s.inventory),
                        Duration::from_millis(delay.min(60_000)),
                    )
                };
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let _ = nats.publish(reply, result.encode_to_vec().into()).await;
            }
        }));
        Ok(())
    }

    /// Heartbeats every interval until shutdown, then closes cleanly.
    /// Returns the error that ended the session early (a revoked identity).
    pub async fn run(mut self, mut shutdown: Shutdown) -> Result<(), SimError> {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.heartbeat_interval) => {},
                _ = shutdown.wait() => return self.close().await,
            }
            if let Err(e) = self.heartbeat().await {
                if e.code != ErrorCode::Unavailable.as_str_name() {
                    return Err(e);
                }
                tracing::debug!(device_id = %self.device_id, error = %e, "heartbeat failed; retrying");
            }
        }
    }
}

/// The simulated answer to a command.
fn answer(cmd: &v1::AgentCommand, inv: &v1::Inventory) -> v1::AgentCommandResult {
    let ok = |output: String| v1::AgentCommandResult {
        request_id: cmd.request_id.clone(),
        status: "ok".into(),
        output,
        error: String::new(),
        inventory: None,
    };
    match cmd.command.as_str() {
        "inventory.refresh" => v1::AgentCommandResult {
            inventory: Some(inv.clone()),
            ..ok(format!("{} x {}", inv.gpu_count, inv.gpu_model))
        },
        "diag.nvml" => ok((0..inv.gpu_count)
            .map(|g| format!("GPU {g}: {} OK (simulated)", inv.gpu_model))
            .collect::<Vec<_>>()
            .join("\n")),
        "logs.collect" => ok("collected 0 lines (simulated)".into()),
        "gpu.reset" => ok(format!(
            "reset GPU {} (simulated)",
            cmd.args.get("gpu").map(String::as_str).unwrap_or("all")
        )),
        "node.reboot" => ok("rebooting (simulated)".into()),
        other => v1::AgentCommandResult {
            request_id: cmd.request_id.clone(),
            status: "unsupported".into(),
            output: String::new(),
            error: format!("unknown command {other}"),
            inventory: None,
        },
    }
}

/// `fleet sim agents`: options.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub count: usize,
    pub join_token: String,
    /// Host names and identifiers derive from it.
    pub prefix: String,
    pub gpus: u32,
    /// Joins and opens at once.
    pub concurrency: usize,
}

/// Runs `count` simulated agents until shutdown: join, open, heartbeat,
/// and a clean close at the end.
pub async fn run_agents(
    nats: async_nats::Client,
    subjects: Subjects,
    opts: SimOptions,
    shutdown: Shutdown,
) {
    let started = std::time::Instant::now();
    let agents: Vec<Result<SimAgent, (usize, SimError)>> = futures::stream::iter(0..opts.count)
        .map(|i| {
            let (nats, subjects, opts) = (nats.clone(), subjects.clone(), opts.clone());
            async move {
                let mut a = SimAgent::new(
                    nats,
                    subjects,
                    SimSpec::numbered(&opts.prefix, i, opts.gpus),
                );
                a.join(&opts.join_token).await.map_err(|e| (i, e))?;
                a.open().await.map_err(|e| (i, e))?;
                Ok(a)
            }
        })
        .buffer_unordered(opts.concurrency.max(1))
        .collect()
        .await;
    let mut tasks = tokio::task::JoinSet::new();
    let mut failed = 0;
    for a in agents {
        match a {
            Ok(a) => {
                let s = shutdown.clone();
                tasks.spawn(async move {
                    let id = a.device_id.clone();
                    if let Err(e) = a.run(s).await {
                        tracing::warn!(device_id = %id, error = %e, "simulated agent stopped");
                    }
                });
            }
            Err((i, e)) => {
                failed += 1;
                tracing::warn!(agent = i, error = %e, "simulated agent could not join");
            }
        }
    }
    tracing::info!(
        agents = opts.count - failed,
        failed,
        took_ms = started.elapsed().as_millis() as u64,
        "simulated agents running"
    );
    while tasks.join_next().await.is_some() {}
}
