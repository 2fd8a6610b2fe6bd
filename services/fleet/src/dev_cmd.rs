//! `fleet dev --sim N`: the whole mesh in this process against simulated
//! external systems (`fleet-dev`), with progress while the fleet converges
//! and a one-screen summary refreshed every second (a line per second when
//! stdout is not a terminal). Ctrl-C stops everything.

// Writes that never panic: `fleet dev | tee` stopped with Ctrl-C closes the
// pipe first, and the mesh must still shut down and remove what it made.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}
macro_rules! out_part {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($t)*);
    }};
}
macro_rules! err {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use fleet::config::FleetConfig;
use fleet::dev::{Agreement, DevMesh, DevOptions, Summary};

#[derive(clap::Args, Debug, Clone)]
pub struct DevArgs {
    /// Simulated devices.
    #[arg(long, default_value_t = 1000)]
    pub sim: usize,
    /// Sites the devices are spread over (default: 2, one more per 25,000).
    #[arg(long)]
    pub sites: Option<usize>,
    /// Seconds between two steps of the scenario engine.
    #[arg(long, default_value_t = 3.0)]
    pub tick_secs: f64,
    /// Seconds between two reads of each simulated system by its connector
    /// (default: 5, one more per 400 devices above 2,000).
    #[arg(long)]
    pub resync_secs: Option<f64>,
    /// Without the placer, gateway and radar (and so without agents).
    #[arg(long)]
    pub no_consumers: bool,
    /// Simulated node agents connecting to the gateway (default: one per
    /// device; 0 for none).
    #[arg(long)]
    pub agents: Option<usize>,
    /// No simulated node agents (`--agents 0`): every device stays
    /// disconnected and carries the `unreachable` no-schedule reason.
    #[arg(long, conflicts_with = "agents")]
    pub no_agents: bool,
    /// Stop once the fleet is fully derived (every device matches the
    /// scenario's ground truth) and print the figures (for measurements).
    #[arg(long)]
    pub exit_when_derived: bool,
    /// Run the hub on this many threads of its own (named `fleet-hub`), so
    /// its CPU is shown and measured apart from the rest of the process.
    /// On a saturated machine this slows the hub: measure convergence
    /// without it.
    #[arg(long)]
    pub hub_threads: Option<usize>,
    /// The last N sites run without Placement (customer-ready is the Ironic
    /// node's own trait), where the workflow service's Image Node and
    /// Unimage Node run against the simulated Ironic.
    #[arg(long, default_value_t = 0)]
    pub standalone_sites: usize,
}

/// CPU seconds (user + system) this process and the hub's threads
/// (`fleet::dev::HUB_THREADS`, with `--hub-threads`; `None` without) have
/// used, from /proc. A thread that has ended takes its seconds with it, so
/// a difference is at least 0.
#[derive(Debug, Clone, Copy, Default)]
struct CpuSecs {
    process: f64,
    hub: Option<f64>,
}

impl CpuSecs {
    fn now() -> CpuSecs {
        let read = |path: std::path::PathBuf| -> Option<f64> {
            let stat = std::fs::read_to_string(path).ok()?;
            let rest = stat.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        };
        let process = read("/proc/self/stat".into()).unwrap_or(0.0);
        let mut hub = None;
        for task in std::fs::read_dir("/proc/self/task")
            .into_iter()
            .flatten()
            .flatten()
        {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.trim_end() == fleet::dev::HUB_THREADS {
                *hub.get_or_insert(0.0) += read(task.path().join("stat")).unwrap_or(0.0);
            }
        }
        CpuSecs { process, hub }
    }

    /// Percent of one core each used from `earlier` to `self`, `dt` apart.
    fn percent_since(&self, earlier: &CpuSecs, dt: f64) -> Cpu {
        let dt = dt.max(0.001);
        Cpu {
            process: ((self.process - earlier.process) / dt * 100.0).max(0.0),
            hub: self
                .hub
                .map(|h| ((h - earlier.hub.unwrap_or(0.0)) / dt * 100.0).max(0.0)),
        }
    }
}

/// Percent of one core: the process, and the hub when it has threads of
/// its own.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    process: f64,
    hub: Option<f64>,
}

impl Cpu {
    fn hub(&self) -> String {
        self.hub.map_or("-".to_string(), |h| format!("{h:.0}%"))
    }
}

async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

pub async fn run(config: FleetConfig, args: DevArgs) -> anyhow::Result<()> {
    let mut opts = DevOptions::new(args.sim);
    if let Some(s) = args.sites {
        opts.sites = s.max(1);
    }
    opts.tick = Duration::from_secs_f64(args.tick_secs.max(0.2));
    opts.resync_secs = args
        .resync_secs
        .unwrap_or_else(|| fleet::dev::default_resync(args.sim))
        .max(0.5);
    // Converge to the fleet as generated first, then let it evolve.
    opts.held = true;
    opts.consumers = !args.no_consumers;
    opts.hub_threads = args.hub_threads;
    opts.standalone_sites = args.standalone_sites.min(opts.sites);
    opts.agents = if args.no_agents {
        0
    } else {
        args.agents.unwrap_or(args.sim).min(args.sim)
    };
    let tty = std::io::stdout().is_terminal();
    let started = Instant::now();
    err!(
        "fleet dev: starting the mesh with {} simulated devices over {} sites, {} simulated agents, connectors reading every {} s ...",
        opts.devices,
        opts.sites,
        if opts.consumers { opts.agents } else { 0 },
        opts.resync_secs
    );
    let mut mesh = DevMesh::start(config, opts).await?;
    out!("API        {}", mesh.api_url);
    out!("console    {}/ui/   (paste the token below; the Racks tab is the standup matrix, burn-in on the simulated slurmrestd)", mesh.api_url);
    out!("token      {}", mesh.token);
    out!(
        "try        FLEET_API_URL={} FLEET_TOKEN={} cargo run --release -- devices list --operational-status failed",
        mesh.api_url, mesh.token
    );
    out!(
        "           curl -s -H 'Authorization: Bearer {}' '{}/api/v1/devices/?operational_status=quarantine&limit=5'",
        mesh.token, mesh.api_url
    );
    out!(
        "           fleet pools capacity {pool}; fleet allocations create --pool {pool} --tenant dev-tenant --gpus 8   (same FLEET_API_URL, FLEET_TOKEN)",
        pool = fleet::dev::dev_pool("s1")
    );
    out!(
        "simulated  netbox {}  openstack {}  slurm {}  prometheus {}",
        mesh.endpoints.netbox,
        mesh.endpoints.openstack,
        mesh.endpoints.slurm,
        mesh.endpoints.prometheus
    );
    out!(
        "           borneo {}  nvue {}/<switch>  nmx-m {}/<site>",
        mesh.endpoints.borneo,
        mesh.endpoints.nvue,
        mesh.endpoints.nmx
    );
    out!(
        "database   {}  subjects {}.>",
        fleet_store::redact(&mesh.config.database.url),
        mesh.config.nats.subject_root
    );
    out!(
        "radar      {}.projection.v1.>  (stream {}RADAR)",
        mesh.config.nats.radar_root,
        mesh.config.nats.stream_prefix
    );
    let metrics: Vec<String> = mesh
        .metrics_urls()
        .into_iter()
        .map(|(service, url)| format!("{service} {url}"))
        .collect();
    out!("metrics    {}", metrics.join("  "));
    let result = tokio::select! {
        r = show(&mut mesh, started, tty, args.exit_when_derived) => r,
        _ = signal() => Ok(()),
    };
    err!("\nfleet dev: stopping ...");
    let t = Instant::now();
    let report = mesh.shutdown().await;
    for f in &report.failed {
        err!("  {f}");
    }
    err!(
        "fleet dev: stopped in {:.1} s{}",
        t.elapsed().as_secs_f64(),
        if report.children_left {
            " (a child process was still running)"
        } else {
            ""
        }
    );
    result
}

/// Seconds between two comparisons with the ground truth while the fleet
/// converges (one pass over `devices`): every second up to 20,000 devices.
fn agreement_every(devices: usize) -> u64 {
    (devices as u64 / 20_000).max(1)
}

/// How long `--exit-when-derived` waits for the fleet to match the ground
/// truth before it gives up with an error.
const CONVERGE_LIMIT: Duration = Duration::from_secs(40 * 60);

async fn show(
    mesh: &mut DevMesh,
    started: Instant,
    tty: bool,
    exit_when_derived: bool,
) -> anyhow::Result<()> {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    let mut derived_at: Option<f64> = None;
    let mut snapshots_at: Option<f64> = None;
    let mut last: Option<(Instant, f64, CpuSecs)> = None;
    let mut agreement: Option<Agreement> = None;
    let mut progress: Option<fleet::dev::Progress> = None;
    let check_every = agreement_every(mesh.devices);
    let mut tick: u64 = 0;
    loop {
        every.tick().await;
        tick += 1;
        if let Some(failed) = mesh.failed_task().await {
            anyhow::bail!("a task stopped on its own: {failed}");
        }
        let now = Instant::now();
        let secs = started.elapsed().as_secs_f64();
        if derived_at.is_none() {
            // Counting reads every device and freshness row: at 100,000
            // devices as often as the agreement, not every second, and not
            // at all once every device has its snapshot (the scenario is
            // held until the fleet converges: nothing is deleted).
            let stale = progress.as_ref().is_none_or(|p| {
                (p.imported as usize) < p.of || (!p.done() && tick % check_every == 0)
            });
            if stale {
                match mesh.progress().await {
                    Ok(p) => progress = Some(p),
                    Err(e) => {
                        err!("progress: {e:#}");
                        continue;
                    }
                }
            }
            let Some(p) = progress else { continue };
            if p.done() && snapshots_at.is_none() {
                snapshots_at = Some(secs);
            }
            if p.imported as usize >= p.of && tick % check_every == 0 {
                match mesh.agreement().await {
                    Ok(a) => {
                        // Now and then, what still differs.
                        if tick % (15 * check_every) == 0 && a.matching > 0 {
                            err!("{}", differs(&a));
                        }
                        agreement = Some(a);
                    }
                    Err(e) => err!("agreement: {e:#}"),
                }
            }
            let matching = agreement.as_ref().map_or(0, |a| a.matching);
            let open = agreement.as_ref().map_or(String::new(), |a| {
                format!("   agents not open {}", a.agents_not_open)
            });
            let line = format!(
                "[{secs:6.1}s] imported {:>7} / {}   snapshots applied {:>7} / {}   matching the ground truth {:>7} / {}{open}",
                p.imported, p.of, p.derived, p.of, matching, p.of
            );
            if tty {
                out_part!("\r{line}");
                let _ = std::io::stdout().flush();
            } else {
                out!("{line}");
            }
            let converged = agreement.as_ref().is_some_and(Agreement::converged);
            if converged {
                derived_at = Some(secs);
                let events = mesh.hub_status_events().await.unwrap_or(0.0);
                out!(
                    "\nfleet fully derived: all {} devices match the scenario's ground truth (operational status, health, connectivity) after {secs:.1} s (every device had an applied OpenStack snapshot after {:.1} s; {events:.0} StatusChanged events until then, {:.1} per device); the scenario evolves from now on",
                    p.of,
                    snapshots_at.unwrap_or(secs),
                    events / (p.of.max(1) as f64)
                );
                mesh.release();
                if exit_when_derived {
                    return steady_state(mesh).await;
                }
                continue;
            }
            if exit_when_derived && started.elapsed() > CONVERGE_LIMIT {
                anyhow::bail!(
                    "not converged after {:.0} s: {:?}",
                    CONVERGE_LIMIT.as_secs_f64(),
                    agreement
                );
            }
            // Interactively, a fleet that cannot converge on this machine
            // still gets to evolve: three reads (at least 2 min) after every
            // device had a snapshot.
            if !exit_when_derived
                && snapshots_at.is_some_and(|t| secs - t > (3.0 * mesh.resync_secs).max(120.0))
            {
                derived_at = Some(secs);
                out!(
                    "\nfleet not converged {:.0} s after every device had a snapshot ({}); letting the scenario evolve",
                    secs - snapshots_at.unwrap_or(secs),
                    agreement.as_ref().and_then(|a| a.example.clone()).unwrap_or_default()
                );
                mesh.release();
            }
            continue;
        }
        let s = match mesh.summary().await {
            Ok(s) => s,
            Err(e) => {
                err!("summary: {e:#}");
                continue;
            }
        };
        let cpu = CpuSecs::now();
        let (obs_rate, cpu_pct) = match last {
            Some((t, o, c)) => {
                let dt = now.duration_since(t).as_secs_f64().max(0.001);
                ((s.observations_total - o) / dt, cpu.percent_since(&c, dt))
            }
            None => (0.0, Cpu::default()),
        };
        last = Some((now, s.observations_total, cpu));
        if tty {
            out_part!(
                "\x1b[2J\x1b[H{}",
                screen(mesh, &s, secs, derived_at, obs_rate, cpu_pct)
            );
            let _ = std::io::stdout().flush();
        } else {
            out!("{}", line(&s, secs, obs_rate, cpu_pct));
        }
    }
}

/// `--exit-when-derived`, once converged: 60 s of the evolving scenario
/// (observations/s, CPU, how many devices match meanwhile), then a pause
/// and the time until the hub matches the ground truth again.
async fn steady_state(mesh: &mut DevMesh) -> anyhow::Result<()> {
    const WINDOW: f64 = 60.0;
    let obs0 = mesh.hub_observations().await.unwrap_or(0.0);
    let cpu0 = CpuSecs::now();
    tokio::time::sleep(Duration::from_secs_f64(WINDOW)).await;
    let obs1 = mesh.hub_observations().await.unwrap_or(0.0);
    let cpu = CpuSecs::now().percent_since(&cpu0, WINDOW);
    let during = mesh.agreement().await?;
    out!(
        "steady state over {WINDOW:.0} s: {:.0} observations/s through the hub, hub CPU {} (with --hub-threads), process CPU {:.0}% (of one core); at its end {} of {} devices matched the moving ground truth",
        (obs1 - obs0) / WINDOW,
        cpu.hub(),
        cpu.process,
        during.matching,
        during.of
    );
    let t = Instant::now();
    mesh.pause().await;
    let limit = Duration::from_secs_f64(120.0 + 4.0 * mesh.resync_secs.max(15.0));
    let mut said = Instant::now();
    loop {
        let a = mesh.agreement().await?;
        // Now and then, what still differs.
        if said.elapsed() >= Duration::from_secs(30) && !a.converged() {
            err!("{}", differs(&a));
            said = Instant::now();
        }
        if a.converged() {
            out!(
                "paused: the hub matched the ground truth again after {:.1} s",
                t.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if t.elapsed() > limit {
            anyhow::bail!(
                "paused, but the hub did not match the ground truth within {:.0} s: {} of {} match ({:?})",
                limit.as_secs_f64(),
                a.matching,
                a.of,
                a.example
            );
        }
        tokio::time::sleep(Duration::from_secs(agreement_every(mesh.devices))).await;
    }
}

/// Per-axis agreement and one device that still differs.
fn differs(a: &Agreement) -> String {
    format!(
        "  operational {} / health {} / connectivity {} of {} match; e.g. {}",
        a.operational,
        a.health,
        a.connectivity,
        a.of,
        a.example.as_deref().unwrap_or("-")
    )
}

fn map(m: &std::collections::BTreeMap<String, i64>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn line(s: &Summary, secs: f64, obs: f64, cpu: Cpu) -> String {
    format!(
        "[{secs:6.1}s] operational {} | health {} | connectivity {} | custody {} | latches {} | no-schedule {} | {obs:.0} obs/s | outbox {} ({:.1} s) | hub cpu {} | cpu {:.0}%",
        map(&s.operational),
        map(&s.health),
        map(&s.connectivity),
        map(&s.custody),
        map(&s.latches),
        s.no_schedule,
        s.outbox_rows,
        s.outbox_oldest_secs,
        cpu.hub(),
        cpu.process
    )
}

/// Rows of `hub` beside `expected`, every key of either.
fn table(
    o: &mut String,
    title: &str,
    hub: &std::collections::BTreeMap<String, i64>,
    expected: &std::collections::BTreeMap<&'static str, usize>,
) {
    use std::fmt::Write as _;
    let _ = writeln!(o, "\n{title:<38} {:>9} {:>9}", "hub", "expected");
    let mut keys: Vec<String> = hub.keys().cloned().collect();
    for k in expected.keys() {
        if !keys.iter().any(|x| x == k) {
            keys.push(k.to_string());
        }
    }
    keys.sort();
    for k in &keys {
        let _ = writeln!(
            o,
            "  {k:<36} {:>9} {:>9}",
            hub.get(k).copied().unwrap_or(0),
            expected.get(k.as_str()).copied().unwrap_or(0)
        );
    }
}

fn screen(
    mesh: &DevMesh,
    s: &Summary,
    secs: f64,
    derived_at: Option<f64>,
    obs: f64,
    cpu: Cpu,
) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "fleet dev — {} simulated devices — up {secs:.0} s (fully derived after {:.1} s)    Ctrl-C stops",
        mesh.devices,
        derived_at.unwrap_or(0.0)
    );
    let _ = writeln!(o, "API {}   token {}", mesh.api_url, mesh.token);
    table(&mut o, "operational", &s.operational, &s.truth);
    table(&mut o, "health", &s.health, &s.health_truth);
    table(
        &mut o,
        "connectivity (agents)",
        &s.connectivity,
        &s.connectivity_truth,
    );
    table(&mut o, "custody (Borneo)", &s.custody, &s.custody_truth);
    table(
        &mut o,
        "FrontendPortsInCustomerVrf latch",
        &s.latches,
        &s.latch_truth,
    );
    table(
        &mut o,
        "live fabric observed True",
        &s.fabric_true,
        &s.fabric_true_truth,
    );
    let provision = s
        .provision
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join("   ");
    let _ = writeln!(
        o,
        "\nno-schedule {}   cordoned {}   provision: {provision}",
        s.no_schedule, s.cordoned
    );
    let _ = writeln!(
        o,
        "hub: {obs:.0} observations/s   event lag: {} outbox rows, oldest {:.1} s   hub CPU {}   process CPU {:.0}%",
        s.outbox_rows,
        s.outbox_oldest_secs,
        cpu.hub(),
        cpu.process
    );
    let a = mesh
        .scenario
        .lock()
        .map(|g| (g.activity.clone(), g.outages))
        .ok();
    if let Some((a, out)) = a {
        let _ = writeln!(
            o,
            "scenario: {} ticks, {} deploys, {} releases, {} ironic failures, {} repairs, {} maintenance, {} slurm drains, {} downs, {} validated, {} outages{}",
            a.ticks, a.deploys, a.releases, a.ironic_failures, a.repairs, a.maintenance,
            a.slurm_drains, a.slurm_downs, a.validated, a.outages,
            if out.ironic { " — IRONIC OUT NOW" } else if out.slurm { " — SLURM OUT NOW" } else if out.switch.is_some() { " — A LEAF SWITCH OUT NOW" } else if out.nmx.is_some() { " — NMX-M OUT NOW" } else { "" }
        );
        let _ = writeln!(
            o,
            "          {} handovers, {} breaches (on purpose), {} returns, {} drains, {} latch writes ({} retried), {} back-end VRF flips, {} NVLink moves, {} agent restarts",
            a.handovers, a.breaches, a.returns, a.drains, a.latch_writes, a.latch_failures,
            a.vrf_flips, a.nvlink_moves, a.agent_closes
        );
    }
    o
}
