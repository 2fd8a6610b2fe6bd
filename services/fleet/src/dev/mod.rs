//! `fleet dev`: the whole mesh in one process against simulated external
//! systems. [`DevMesh::start`] finds (or starts) NATS and PostgreSQL, makes
//! a database and subject root of its own, starts the scenario engine and
//! its simulated NetBox, OpenStack and slurmrestd, then the hub, the
//! connectors, the API, the placer, the gateway and radar as tasks, each
//! with its own shutdown signal. [`DevMesh::shutdown`] stops them in order,
//! joins them and removes what the run made.

pub mod agents;
pub mod burn_in;
pub mod engine;
pub mod fabric;
pub mod flips;
pub mod infra;
pub mod ironic;
pub mod nova;
pub mod partner;
pub mod servers;
pub mod status;
mod wiring;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::FleetConfig;
use crate::connector_cmd::ConnectorCommand;
use anyhow::Context;
use fleet_runtime::shutdown::ShutdownTrigger;
use fleet_runtime::Shutdown;
use sqlx::PgPool;
use tokio::task::JoinHandle;

pub use engine::Scenario;
pub use status::{Agreement, Progress, Summary};

/// How to run.
#[derive(Debug, Clone)]
pub struct DevOptions {
    /// Simulated devices.
    pub devices: usize,
    /// Sites the devices are spread over (ids `s1`, `s2`, ...).
    pub sites: usize,
    /// How often the scenario engine evolves the fleet.
    pub tick: Duration,
    /// Fraction of the fleet that changes per tick.
    pub change_rate: f64,
    /// Seconds between two reads of each simulated system.
    pub resync_secs: f64,
    /// Make a database, subject root and stream prefix of its own and remove
    /// them on exit. `false` uses the configuration's as they are (the
    /// tests, which make and remove their own).
    pub isolate: bool,
    /// Start the placer, gateway and radar too.
    pub consumers: bool,
    /// Simulated node agents connecting to the gateway (at most
    /// `devices`; none without the consumers).
    pub agents: usize,
    pub seed: u64,
    /// Start with the scenario's evolution held (the fleet as generated,
    /// agents joining) until `DevMesh::release`: a fixed ground truth to
    /// converge to.
    pub held: bool,
    /// Run the hub on this many threads of its own ([`HUB_THREADS`]) so
    /// its CPU can be measured apart; `None` shares the process runtime.
    /// On a saturated machine its own threads slow the hub (a wake waits
    /// for the OS to schedule one of them); docs/dev-harness.md has the
    /// figures.
    pub hub_threads: Option<usize>,
    /// The last this many sites run without Placement: customer-ready is
    /// the Ironic node's own trait there, and the workflow service images
    /// and unimages their nodes (Ironic-direct; a Placement site needs the
    /// Nova arm this build does not have).
    pub standalone_sites: usize,
}

impl DevOptions {
    pub fn new(devices: usize) -> DevOptions {
        DevOptions {
            devices,
            sites: devices.div_ceil(25_000).clamp(2, 8),
            tick: Duration::from_secs(3),
            change_rate: 0.01,
            resync_secs: 5.0,
            isolate: true,
            consumers: true,
            agents: devices,
            seed: 20261129,
            held: false,
            hub_threads: None,
            standalone_sites: 0,
        }
    }
}

/// How long the services together have to stop after the signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

struct Task {
    name: &'static str,
    trigger: ShutdownTrigger,
    handle: JoinHandle<anyhow::Result<()>>,
    /// The runtime of a service that runs on threads of its own.
    _runtime: Option<OwnRuntime>,
}

/// The name of the hub's threads when it runs on a runtime of its own
/// (`DevOptions::hub_threads`), so its CPU can be told apart from the rest
/// of the process (`/proc/self/task/*/comm`).
pub const HUB_THREADS: &str = "fleet-hub";

/// A runtime a service runs on, shut down (without blocking) when dropped.
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A running mesh.
pub struct DevMesh {
    pub config: FleetConfig,
    pub scenario: servers::Shared,
    pub endpoints: servers::Endpoints,
    /// `http://<api.listen>`.
    pub api_url: String,
    /// A token with every scope, made for this run.
    pub token: String,
    /// The hub's `/metrics`.
    pub hub_metrics_url: String,
    pub pool: PgPool,
    pub devices: usize,
    /// Seconds between two reads of each simulated system.
    pub resync_secs: f64,
    /// Whether the placer, the gateway and radar run (`--no-consumers`).
    pub consumers: bool,
    paused: Arc<std::sync::atomic::AtomicBool>,
    /// The scenario's evolution is held (`DevOptions::held`) until
    /// `release`; agents still join and heartbeat.
    held: Arc<std::sync::atomic::AtomicBool>,
    busy: Arc<std::sync::atomic::AtomicBool>,
    agents_busy: Arc<std::sync::atomic::AtomicUsize>,
    tasks: Vec<Task>,
    sim_tasks: Vec<JoinHandle<()>>,
    infra: infra::Infra,
    isolate: bool,
    admin_url: String,
    db_name: String,
}

/// What `shutdown` found.
#[derive(Debug, Default)]
pub struct ShutdownReport {
    /// Tasks that ended with an error, or did not end in time (aborted).
    pub failed: Vec<String>,
    /// Whether a child process of this run was still running at the end.
    pub children_left: bool,
}

impl DevMesh {
    /// Every service's `/metrics` address, by service.
    pub fn metrics_urls(&self) -> Vec<(&'static str, String)> {
        let c = &self.config;
        let url = |l: &str| format!("http://{l}/metrics");
        let mut all = vec![("hub", url(&c.hub.listen)), ("api", url(&c.api.listen))];
        if self.consumers {
            all.extend([
                ("placer", url(&c.placer.listen)),
                ("gateway", url(&c.gateway.listen)),
                ("radar", url(&c.radar.listen)),
            ]);
        }
        all.extend([
            ("netbox", url(&c.connectors.netbox.listen)),
            ("openstack", url(&c.connectors.openstack.listen)),
            ("slurm", url(&c.connectors.slurm.listen)),
            ("health", url(&c.connectors.health.listen)),
            ("borneo", url(&c.connectors.borneo.listen)),
            ("fabric", url(&c.connectors.fabric.listen)),
        ]);
        all
    }
}

/// The pool of a simulated site.
/// The sites, the dev tenant and each site's pool (8 x H100, the model the
/// simulated agents report), the way an
/// operator sets them up before devices arrive: hub inventory commands (the
/// dev harness writes no inventory table itself). A tenant or pool that
/// exists is left as it is; a site that exists gets the scenario's flags.
async fn set_up_inventory(
    config: &FleetConfig,
    sites: &[String],
    standalone: &[String],
) -> anyhow::Result<()> {
    use fleet_proto::v1;
    use v1::hub_command::Command as C;
    let nats = fleet_bus::connect(&config.nats, "fleet-dev-inventory")
        .await
        .context("connecting to NATS to set up the dev inventory")?;
    let hub = fleet_hub_client::HubClient::new(
        nats,
        fleet_bus::Subjects::new(&config.nats.subject_root, &config.nats.radar_root),
        Duration::from_secs(10),
    );
    let mut commands = vec![C::CreateTenant(v1::Tenant {
        id: "dev-tenant".into(),
        name: "the dev tenant".into(),
        created_at: None,
    })];
    for s in sites {
        commands.push(C::CreateSite(v1::Site {
            id: s.clone(),
            name: format!("simulated site {s}"),
            inventory_only: false,
            placement_enabled: !standalone.contains(s),
            // The simulated back-end switches take real flips.
            backend_vrf_flip_allowed: true,
            created_at: None,
        }));
        commands.push(C::CreatePool(v1::Pool {
            id: dev_pool(s),
            site_id: s.clone(),
            kind: fleet_domain::inventory::PoolKind::MetalHost.as_str().into(),
            owner_tenant_id: "dev-tenant".into(),
            hardware_profile: Some(v1::PoolHardwareProfile {
                gpu_count: engine::GPUS_PER_DEVICE as i32,
                // What the simulated agents report, so acceptance passes
                // and their devices are adopted.
                gpu_model: fleet_agent_sim::GPU_MODEL.into(),
            }),
            created_at: None,
        }));
    }
    for c in commands {
        let verb = fleet_hub_client::verb(&c);
        // A site that exists (an earlier run on this database, or one
        // connector-netbox created with Placement and no back-end flips) is
        // given the flags the scenario runs with.
        let on_conflict = match &c {
            C::CreateSite(site) => Some(C::UpdateSite(v1::UpdateSite {
                id: site.id.clone(),
                name: None,
                placement_enabled: Some(site.placement_enabled),
                backend_vrf_flip_allowed: Some(site.backend_vrf_flip_allowed),
            })),
            _ => None,
        };
        let refused = |verb: &str, e: fleet_hub_client::HubCallError| {
            anyhow::anyhow!("setting up the dev inventory ({verb}): {e}")
        };
        match hub.call("fleet-dev", 0, c).await {
            Ok(_) => {}
            Err(fleet_hub_client::HubCallError::Refused { code, .. })
                if code == fleet_proto::ErrorCode::Conflict =>
            {
                if let Some(update) = on_conflict {
                    let verb = fleet_hub_client::verb(&update);
                    hub.call("fleet-dev", 0, update)
                        .await
                        .map_err(|e| refused(verb, e))?;
                }
            }
            Err(e) => return Err(refused(verb, e)),
        }
    }
    Ok(())
}

pub fn dev_pool(site: &str) -> String {
    format!("{site}-gpu")
}

pub(crate) fn free_addr() -> anyhow::Result<String> {
    Ok(fleet_runtime::http::free_listen_addr()?.to_string())
}

/// `base` with its database replaced by `db`.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let base = match base.rsplit_once('/') {
        Some((b, _)) if b.contains("://") && b.len() > b.find("://").unwrap_or(0) + 3 => b,
        _ => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

impl DevMesh {
    /// Starts everything; on an error what was started is stopped again.
    pub async fn start(config: FleetConfig, opts: DevOptions) -> anyhow::Result<DevMesh> {
        let mut infra = infra::Infra::default();
        let started = Self::start_inner(config, opts, &mut infra).await;
        if started.is_err() {
            infra.stop().await;
        }
        started
    }

    /// Starts everything; the infrastructure it starts is in `infra` until
    /// the mesh takes it over.
    async fn start_inner(
        mut config: FleetConfig,
        opts: DevOptions,
        infra: &mut infra::Infra,
    ) -> anyhow::Result<DevMesh> {
        if !infra::answers(&config.nats.url, 4222).await {
            tracing::info!(url = %config.nats.display_url(), "NATS does not answer; starting nats-server");
            config.nats.url = infra.start_nats().await?;
        }
        let mut admin_url = with_database(&config.database.url, "postgres");
        if !infra::answers(&config.database.url, 5432).await {
            tracing::info!(url = %fleet_store::redact(&config.database.url), "PostgreSQL does not answer; starting a throwaway cluster");
            admin_url = infra.start_postgres().await?;
            config.database.url = admin_url.clone();
        }
        let db_name;
        if opts.isolate {
            let id = ulid::Ulid::new().to_string().to_lowercase();
            db_name = format!("fleet_dev_{id}");
            config.database.url = with_database(&admin_url, &db_name);
            config.nats.subject_root = format!("dev{id}.fleet");
            config.nats.radar_root = format!("dev{id}.radar");
            config.nats.stream_prefix = format!("DEV{}_", id.to_uppercase());
        } else {
            db_name = String::new();
        }
        let hub_listen = free_addr()?;
        config.hub.listen = hub_listen.clone();
        config.api.listen = free_addr()?;
        // Known addresses, so `fleet dev` can print every /metrics.
        config.placer.listen = free_addr()?;
        config.gateway.listen = free_addr()?;
        config.radar.listen = free_addr()?;
        // Port 0: an address picked ahead and bound later can be taken in
        // between (seen beside other tests); its /metrics is not printed.
        config.workflow.listen = "127.0.0.1:0".into();
        // Three missed reads before a row goes stale, as in production, and
        // never under 15 s, so a hub lagging on a loaded machine does not
        // read its own backlog as silent sources.
        let ttl = |resync: f64| Duration::from_secs((resync * 3.0).ceil().max(15.0) as u64);
        for source in ["openstack", "slurm", "netbox", "health-status"] {
            config
                .freshness
                .ttl
                .insert(source.into(), ttl(opts.resync_secs));
        }
        // The fabric publishes three snapshots per device per read: read it
        // less often in large fleets so the hub is not mostly busy with it.
        let fabric_resync = fabric_resync(opts.resync_secs, opts.devices);
        for source in ["frontend-fabric", "backend-fabric", "nvlink-fabric"] {
            config
                .freshness
                .ttl
                .insert(source.into(), ttl(fabric_resync));
        }
        // The gateway re-publishes `GpuCountMismatch` for every live session
        // as often as the connectors read: with one agent per device, at the
        // default minute that is more than all connectors together.
        config.gateway.snapshot_resync_interval =
            Duration::from_secs(opts.resync_secs.ceil() as u64);
        config
            .freshness
            .ttl
            .insert("gateway".into(), ttl(opts.resync_secs.ceil()));
        config.hub.sweep_interval = sweep_interval(opts.resync_secs);
        let heartbeat = agents::heartbeat_interval(opts.agents.min(opts.devices));
        config.freshness.unreachable_after = config
            .freshness
            .unreachable_after
            .max(agents::unreachable_after(heartbeat));
        config.freshness.lost_after = config
            .freshness
            .lost_after
            .max(config.freshness.unreachable_after * 2);

        fleet_store::ensure_database(&config.database.url).await?;
        let pool = fleet_store::connect(&config.database.url, 8).await?;
        fleet_store::migrate(&pool)
            .await
            .context("migrating the dev database")?;

        let sites: Vec<String> = (1..=opts.sites.max(1)).map(|i| format!("s{i}")).collect();
        let standalone: Vec<String> = sites
            .iter()
            .rev()
            .take(opts.standalone_sites)
            .cloned()
            .collect();
        let (_id, token) = fleet_api::create_token(&pool, fleet_api::Scope::ALL, "fleet dev")
            .await
            .context("creating the dev API token")?;

        let mut sc = Scenario::new(opts.devices, &sites, opts.seed);
        if opts.consumers {
            sc.enable_agents(opts.agents);
        }
        let scenario: servers::Shared = Arc::new(Mutex::new(sc));
        let (endpoints, mut sim_tasks) = servers::start(scenario.clone()).await?;
        let racks: Vec<String> = scenario
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .racks
            .keys()
            .cloned()
            .collect();
        wiring::wire_connectors(
            &mut config,
            &endpoints,
            &sites,
            &standalone,
            &racks,
            opts.resync_secs,
            fabric_resync,
        );

        let paused = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let held = Arc::new(std::sync::atomic::AtomicBool::new(opts.held));
        sim_tasks.push(tokio::spawn(evolve(
            scenario.clone(),
            paused.clone(),
            held.clone(),
            opts.tick,
            opts.change_rate,
        )));

        if let Some(t) = stand_in_for_autovacuum(&pool).await {
            sim_tasks.push(t);
        }

        let mut tasks = Vec::new();
        // The connectors other than NetBox start once NetBox's devices are
        // in: reads before that resolve to no device (a hundred thousand
        // unresolved observations at 100,000), and the devices would wait a
        // whole resync interval for their first snapshot.
        let gate = (pool.clone(), opts.devices);
        let spawn =
            |name: &'static str, tasks: &mut Vec<Task>, after_import: bool, service: Service| {
                let (trigger, mut shutdown) = Shutdown::new();
                let config = config.clone();
                let gate = after_import.then(|| gate.clone());
                let handle = tokio::spawn(async move {
                    if let Some((pool, n)) = gate {
                        tokio::select! {
                            _ = imported(&pool, n) => {}
                            _ = shutdown.wait() => return Ok(()),
                        }
                    }
                    service.run(config, shutdown).await
                });
                tasks.push(Task {
                    name,
                    trigger,
                    handle,
                    _runtime: None,
                });
            };
        if let Some(threads) = opts.hub_threads {
            // Everything the hub spawns (its NATS connection, pool, lanes,
            // relay) runs on these threads.
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads.max(1))
                .thread_name(HUB_THREADS)
                .enable_all()
                .build()
                .context("building the hub's runtime")?;
            let (trigger, shutdown) = Shutdown::new();
            let handle = rt.spawn(fleet_hub::run(
                config.common(),
                config.hub.clone(),
                shutdown,
            ));
            tasks.push(Task {
                name: "hub",
                trigger,
                handle,
                _runtime: Some(OwnRuntime(Some(rt))),
            });
        } else {
            spawn("hub", &mut tasks, false, Service::Hub);
        }
        // The connectors' first reads create devices through the hub: wait
        // until it answers.
        let ready = format!("http://{hub_listen}/readyz");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !status::http_ok(&ready).await {
            if tasks[0].handle.is_finished() || tokio::time::Instant::now() > deadline {
                for t in &tasks {
                    t.trigger.trigger();
                }
                anyhow::bail!("the hub did not become ready at {ready}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if let Err(e) = set_up_inventory(&config, &sites, &standalone).await {
            for t in &tasks {
                t.trigger.trigger();
            }
            return Err(e);
        }
        spawn("api", &mut tasks, false, Service::Api);
        if opts.consumers {
            spawn("placer", &mut tasks, false, Service::Placer);
            spawn("gateway", &mut tasks, false, Service::Gateway);
            spawn("radar", &mut tasks, false, Service::Radar);
        }
        // The workflow service runs the handover's front-end flips, so it
        // runs without the other consumers too.
        spawn("workflow", &mut tasks, false, Service::Workflow);
        for (which, name) in ConnectorCommand::ALL {
            let after_import = which != ConnectorCommand::Netbox;
            spawn(name, &mut tasks, after_import, Service::Connector(which));
        }
        // Every service answers before the mesh is handed over: one that
        // ended at start (an error it could not wait out) is named here,
        // not left for a caller to find by its silence.
        let mut services = vec![("api", config.api.listen.clone())];
        if opts.consumers {
            services.extend([
                ("placer", config.placer.listen.clone()),
                ("gateway", config.gateway.listen.clone()),
                ("radar", config.radar.listen.clone()),
            ]);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        for (name, listen) in services {
            let ready = format!("http://{listen}/readyz");
            while !status::http_ok(&ready).await {
                let ended = tasks
                    .iter()
                    .find(|t| t.handle.is_finished())
                    .map(|t| t.name);
                if ended.is_some() || tokio::time::Instant::now() > deadline {
                    for t in &tasks {
                        t.trigger.trigger();
                    }
                    match ended {
                        Some(e) => {
                            anyhow::bail!("{e} ended while the dev mesh started (its log says why)")
                        }
                        None => anyhow::bail!("{name} did not become ready at {ready} within 60 s"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // The handover's front-end flips are jobs of the workflow service.
        let nats = fleet_bus::connect(&config.nats, "fleet-dev-handover")
            .await
            .context("connecting the handover flips to NATS")?;
        let subjects = fleet_bus::Subjects::new(&config.nats.subject_root, &config.nats.radar_root);
        let busy = Arc::new(std::sync::atomic::AtomicBool::new(false));
        sim_tasks.push(tokio::spawn(
            flips::Flips {
                scenario: scenario.clone(),
                pool: pool.clone(),
                workflow: fleet_workflow_client::WorkflowClient::new(
                    nats.clone(),
                    subjects.clone(),
                    Duration::from_secs(10),
                ),
                paused: paused.clone(),
                held: held.clone(),
                busy: busy.clone(),
            }
            .run(),
        ));
        let agents_busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        if opts.consumers && opts.agents > 0 {
            let agents = agents::Agents {
                scenario: scenario.clone(),
                pool: pool.clone(),
                nats,
                subjects,
                paused: paused.clone(),
                busy: agents_busy.clone(),
                heartbeat: agents::heartbeat_interval(opts.agents.min(opts.devices)),
            };
            sim_tasks.push(tokio::spawn(async move {
                if let Err(e) = agents.run().await {
                    tracing::error!(error = %format!("{e:#}"), "simulated agents stopped");
                }
            }));
        }
        Ok(DevMesh {
            api_url: format!("http://{}", config.api.listen),
            hub_metrics_url: format!("http://{hub_listen}/metrics"),
            config,
            scenario,
            endpoints,
            token,
            pool,
            devices: opts.devices,
            consumers: opts.consumers,
            resync_secs: opts.resync_secs,
            paused,
            held,
            busy,
            agents_busy,
            tasks,
            sim_tasks,
            infra: std::mem::take(infra),
            isolate: opts.isolate,
            admin_url,
            db_name,
        })
    }

    /// Stops the scenario engine's evolution and new handover flips
    /// (waiting for a round in progress and the flip jobs in flight, up to
    /// a minute) and ends any outage, so the ground truth holds still;
    /// `resume` lets it go on.
    pub async fn pause(&self) {
        self.paused.store(true, std::sync::atomic::Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while (self.busy.load(std::sync::atomic::Ordering::SeqCst)
            || self.agents_busy.load(std::sync::atomic::Ordering::SeqCst) > 0)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.scenario
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .heal();
    }

    /// Lets a scenario started `held` evolve.
    pub fn release(&self) {
        self.held.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn resume(&self) {
        self.paused
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Devices per expected operational status, now.
    pub fn ground_truth(&self) -> std::collections::BTreeMap<&'static str, usize> {
        self.scenario
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .distribution()
    }

    /// Devices per expected health status, now.
    pub fn health_truth(&self) -> std::collections::BTreeMap<&'static str, usize> {
        self.scenario
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .health_distribution()
    }

    /// Devices per expected connectivity (the simulated agents' sessions).
    pub fn connectivity_truth(&self) -> std::collections::BTreeMap<&'static str, usize> {
        self.scenario
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .connectivity_truth()
    }

    /// The services that ended on their own so far (an error or an early
    /// return), without taking them from the mesh.
    pub fn finished_tasks(&self) -> Vec<&'static str> {
        self.tasks
            .iter()
            .filter(|t| t.handle.is_finished())
            .map(|t| t.name)
            .collect()
    }

    /// A task that ended on its own (an error or an early return): its
    /// name and how it ended.
    pub async fn failed_task(&mut self) -> Option<String> {
        let i = self.tasks.iter().position(|t| t.handle.is_finished())?;
        let t = self.tasks.remove(i);
        let how = match t.handle.await {
            Ok(Ok(())) => "returned without an error".to_string(),
            Ok(Err(e)) => format!("{e:#}"),
            Err(e) => format!("panicked or was cancelled: {e}"),
        };
        Some(format!("{}: {how}", t.name))
    }

    /// Stops every task, joins them within `SHUTDOWN_GRACE`, removes the run's database and streams when it
    /// made them, and stops what it started.
    pub async fn shutdown(mut self) -> ShutdownReport {
        let mut report = ShutdownReport::default();
        for t in &self.sim_tasks {
            t.abort();
        }
        for t in self.sim_tasks.drain(..) {
            let _ = t.await;
        }
        // Every service gets its signal at once (connectors first); each
        // then has until one shared deadline to finish what it holds.
        for t in self.tasks.iter().rev() {
            t.trigger.trigger();
        }
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        while let Some(t) = self.tasks.pop() {
            let abort = t.handle.abort_handle();
            match tokio::time::timeout_at(deadline, t.handle).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => report.failed.push(format!("{}: {e:#}", t.name)),
                Ok(Err(e)) => report.failed.push(format!("{}: {e}", t.name)),
                Err(_) => {
                    abort.abort();
                    report.failed.push(format!(
                        "{}: did not stop within {} s (aborted)",
                        t.name,
                        SHUTDOWN_GRACE.as_secs()
                    ));
                }
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(3), self.pool.close()).await;
        if self.isolate
            && tokio::time::timeout(Duration::from_secs(10), self.remove_run_data())
                .await
                .is_err()
        {
            report
                .failed
                .push("removing the run's database and streams took over 10 s".into());
        }
        self.infra.stop().await;
        report.children_left = self.infra.anything_running();
        report
    }

    async fn remove_run_data(&self) {
        if let Ok(nats) = fleet_bus::connect_now(&self.config.nats, "fleet-dev-cleanup").await {
            let js = async_nats::jetstream::new(nats);
            let streams = fleet_bus::StreamNames::new(&self.config.nats.stream_prefix);
            let mut names = streams.mesh(self.config.nats.partitions);
            names.push(format!("{}PLACER", self.config.nats.stream_prefix));
            for name in names {
                let _ = js.delete_stream(&name).await;
            }
        }
        if !self.db_name.is_empty() {
            use sqlx::Connection;
            if let Ok(mut conn) = sqlx::postgres::PgConnection::connect(&self.admin_url).await {
                if let Err(e) = sqlx::query(&format!(
                    "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                    self.db_name
                ))
                .execute(&mut conn)
                .await
                {
                    tracing::warn!(error = %e, db = %self.db_name, "dropping the dev database");
                }
            }
        }
    }
}

/// A service `fleet dev` runs as a task of its own.
#[derive(Clone, Copy)]
enum Service {
    Hub,
    Api,
    Placer,
    Gateway,
    Radar,
    Workflow,
    Connector(ConnectorCommand),
}

impl Service {
    async fn run(self, c: FleetConfig, s: Shutdown) -> anyhow::Result<()> {
        match self {
            Service::Hub => fleet_hub::run(c.common(), c.hub, s).await,
            Service::Api => fleet_api::run(c.common(), c.api, s).await,
            Service::Placer => fleet_placer::run(c.common(), c.placer, s).await,
            Service::Gateway => fleet_gateway::run(c.common(), c.gateway, s).await,
            Service::Radar => fleet_radar::run(c.common(), c.radar, s).await,
            Service::Workflow => fleet_workflow::run(c.common(), c.workflow, s).await,
            Service::Connector(which) => crate::connector_cmd::run(c, which, s).await,
        }
    }
}

async fn evolve(
    scenario: servers::Shared,
    paused: Arc<std::sync::atomic::AtomicBool>,
    held: Arc<std::sync::atomic::AtomicBool>,
    tick: Duration,
    rate: f64,
) {
    let mut started: Option<tokio::time::Instant> = None;
    let mut every = tokio::time::interval(tick);
    every.tick().await;
    loop {
        every.tick().await;
        if paused.load(std::sync::atomic::Ordering::SeqCst)
            || held.load(std::sync::atomic::Ordering::SeqCst)
        {
            continue;
        }
        // No outages while the fleet is first imported: the outage rule
        // speaks only for devices a connector has read before.
        let allow_outages = started
            .get_or_insert_with(tokio::time::Instant::now)
            .elapsed()
            > Duration::from_secs(60);
        scenario
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tick(rate, allow_outages);
    }
}

/// Returns once `devices` holds `n` devices (NetBox's import is in), or
/// after ten minutes with whatever it holds.
async fn imported(pool: &PgPool, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    loop {
        let count: Result<i64, _> = sqlx::query_scalar("SELECT count(*) FROM devices")
            .fetch_one(pool)
            .await;
        if count.is_ok_and(|c| c as usize >= n) || tokio::time::Instant::now() > deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Seconds between two reads of each simulated system unless given: 5 s up
/// to 2,000 devices, then one more second per 400 devices (250 s at
/// 100,000), so the snapshots the connectors publish (one per device and
/// source per read) stay within what one small machine runs the whole mesh
/// at. TTLs follow (three reads).
pub fn default_resync(devices: usize) -> f64 {
    (devices as f64 / 400.0).max(5.0)
}

/// Seconds between two fabric reads: the others' up to 2,000 devices, then
/// one more resync per 2,000, at most a minute (or the others' if longer).
pub fn fabric_resync(resync: f64, devices: usize) -> f64 {
    (resync * (devices as f64 / 2000.0).max(1.0))
        .min(60.0)
        .max(resync)
}

/// The hub's sweep interval: a fiftieth of a read, between 1 s (small
/// fleets, whose TTLs are 15 s) and the hub's own default of 5 s. At
/// 100,000 devices the TTLs are 750 s and a sweep (with the latch-drift
/// count it paces, every six sweeps) reads every freshness row: a sweep
/// every second cost PostgreSQL about a tenth of a core while the fleet
/// converged (`pg_stat_statements`, docs/dev-harness.md).
pub fn sweep_interval(resync_secs: f64) -> Duration {
    Duration::from_secs_f64((resync_secs / 50.0).clamp(1.0, 5.0))
}

/// The tables whose statistics and dead rows matter while a fleet converges.
const MAINTAINED: &str =
    "devices, device_conditions, device_source_freshness, device_sweep, outbox, \
    unresolved_observations, device_lifecycle_events";

/// With `autovacuum = off` (as on this project's test machines) a fresh
/// dev database is never analyzed: at 100,000 devices the planner, still
/// believing `devices` empty, resolved every key by scanning a whole site.
/// Then `fleet dev` vacuums and analyzes its own tables every 20 s, as
/// autovacuum would, and says so. With autovacuum on it does nothing.
async fn stand_in_for_autovacuum(pool: &PgPool) -> Option<JoinHandle<()>> {
    let setting: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(pool)
        .await
        .ok()?;
    if setting != "off" {
        return None;
    }
    tracing::warn!(
        "PostgreSQL runs with autovacuum off: fleet dev vacuums and analyzes its tables every 20 s (longer when a pass takes long)"
    );
    // A connection of its own, and a first pass after 2 s: at 100,000
    // devices the agents' first reads, planned while `devices` still looked
    // empty, ran for minutes and held every connection of the shared pool,
    // so the analyze that would have fixed their plans never got one.
    let options = pool.connect_options();
    Some(tokio::spawn(async move {
        use sqlx::Connection;
        let mut pause = Duration::from_secs(2);
        let mut conn: Option<sqlx::PgConnection> = None;
        loop {
            tokio::time::sleep(pause).await;
            let started = tokio::time::Instant::now();
            if conn.is_none() {
                conn = sqlx::PgConnection::connect_with(&options)
                    .await
                    .map_err(|e| tracing::warn!(error = %e, "fleet dev: no connection to vacuum/analyze with; next interval retries"))
                    .ok();
            }
            if let Some(c) = conn.as_mut() {
                if let Err(e) = sqlx::query(&format!("VACUUM (ANALYZE) {MAINTAINED}"))
                    .execute(&mut *c)
                    .await
                {
                    tracing::warn!(error = %e, "fleet dev: vacuum/analyze failed; next interval retries");
                    conn = None;
                }
            }
            // At most a sixth of the time vacuuming: at 100,000 devices a
            // pass takes seconds and every 20 s it held a core a third busy.
            pause = fleet_runtime::pace::pause_after(Duration::from_secs(20), started.elapsed(), 5);
        }
    }))
}

/// Installs the process-wide rustls crypto provider (ring) that reqwest
/// built with `rustls-no-provider` needs before a client is built; the
/// operator CLI calls it. Installing twice is harmless.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    #[test]
    fn sweeps_slow_down_with_the_reads_up_to_the_hub_default() {
        use std::time::Duration;
        for (resync, sweep) in [
            (5.0, 1.0),
            (50.0, 1.0),
            (100.0, 2.0),
            (250.0, 5.0),
            (600.0, 5.0),
        ] {
            assert_eq!(
                super::sweep_interval(resync),
                Duration::from_secs_f64(sweep),
                "{resync}"
            );
        }
    }

    #[test]
    fn fabric_reads_slow_down_with_the_fleet() {
        assert_eq!(super::fabric_resync(1.0, 200), 1.0);
        assert_eq!(super::fabric_resync(5.0, 1000), 5.0);
        assert_eq!(super::fabric_resync(5.0, 10_000), 25.0);
        assert_eq!(super::fabric_resync(5.0, 100_000), 60.0);
        assert_eq!(super::fabric_resync(90.0, 100_000), 90.0);
    }

    #[test]
    fn database_in_url_is_replaced() {
        assert_eq!(
            super::with_database("postgres://postgres@127.0.0.1:5432/fleet", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            super::with_database("postgres://u:p@h:1/fleet?sslmode=disable", "x"),
            "postgres://u:p@h:1/x?sslmode=disable"
        );
        assert_eq!(
            super::with_database("postgres://postgres@h:5432", "x"),
            "postgres://postgres@h:5432/x"
        );
    }
}
