//! `fleet bench api` (`spec/quality.md`): the operator API under concurrent
//! keep-alive load at a fleet of `--devices` (inserted directly with SQL
//! into a fresh database): filtered device-list pages (first pages and
//! pages after a random cursor) and device details, p50/p99/max and
//! requests/s per workload. The API runs in this process on port 0; the
//! load comes from the same process, so the figures include the client's
//! share of the two cores.

use std::time::{Duration, Instant};

use crate::config::FleetConfig;
use anyhow::{bail, Context};
use fleet_api::Scope;
use fleet_runtime::Shutdown;
use rand::Rng;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[derive(clap::Args, Debug)]
pub struct ApiBench {
    /// Fleet size.
    #[arg(long, default_value_t = 100_000)]
    pub devices: i64,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Seconds per workload.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Page size of the list requests.
    #[arg(long, default_value_t = 100)]
    pub page: i64,
    /// Keep the benchmark database afterwards.
    #[arg(long)]
    pub keep: bool,
}

const SITES: i64 = 10;

/// Devices across ten sites with varied axes, six openstack conditions
/// each (two decisive) and their freshness rows.
async fn seed(pool: &PgPool, n: i64) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO sites (id, name) SELECT 's' || i, 'site ' || i FROM generate_series(0, $1 - 1) i",
    )
    .bind(SITES)
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO devices (id, name, site_id, role, trust, operational_status, health_status, \
         inventory_status, connectivity, provision_state, observed_generation, in_triage, slurm_states, \
         cordoned, maintenance, capacity_bucket) \
         SELECT 'dev_b' || lpad(i::text, 8, '0'), 'gpu-' || i, 's' || (i % $2), 'host', 'platform', \
           (ARRAY['available','in_use','quarantine','validation','unknown','failed'])[1 + h % 6], \
           CASE WHEN (h / 37) % 200 = 0 THEN 'critical' \
             ELSE (ARRAY['healthy','healthy','degraded','unknown'])[1 + (h / 7) % 4] END, \
           CASE WHEN (h / 11) % 9 = 0 THEN 'staged' ELSE 'active' END, \
           CASE WHEN (h / 13) % 10 = 0 THEN 'unreachable' ELSE 'connected' END, \
           CASE WHEN (h / 17) % 13 = 0 THEN 'ready' ELSE 'deployed' END, 1, (h / 19) % 50 = 0, \
           CASE WHEN (h / 23) % 7 = 0 THEN ARRAY['IDLE','DRAIN'] ELSE ARRAY['ALLOCATED'] END, \
           (h / 29) % 31 = 0, (h / 31) % 37 = 0, 'schedulable' \
         FROM (SELECT i, (hashint8(i) & 2147483647) AS h FROM generate_series(1, $1) i) g",
    )
    .bind(n)
    .bind(SITES)
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO device_conditions (device_id, type, status, reason, message, source, condition_of, \
         durable, observed_at, received_at, decisive, last_transition_at) \
         SELECT d.id, t.type, t.status, '', '', 'openstack', 'operational', false, now(), now(), \
                t.type IN ('CustomerReady', 'InstanceAllocated'), now() \
         FROM devices d CROSS JOIN (VALUES ('IronicProvisionHealthy', 'True'), ('IronicMaintenance', 'False'), \
           ('CustomerReady', 'True'), ('InstanceAllocated', 'True'), ('IronicAvailable', 'False'), \
           ('InMaintenancePool', 'False')) AS t(type, status)",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO device_source_freshness (device_id, source, observed_at, digest, received_at) \
         SELECT id, 'openstack', now(), '\\x00', now() FROM devices",
    )
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE").execute(pool).await?;
    Ok(())
}

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    async fn open(addr: std::net::SocketAddr) -> anyhow::Result<Conn> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(Conn {
            reader: BufReader::new(s),
        })
    }

    /// GET `path`; returns the status.
    async fn get(&mut self, path: &str, token: &str) -> anyhow::Result<u16> {
        let req =
            format!("GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n\r\n");
        self.reader.get_mut().write_all(req.as_bytes()).await?;
        let mut line = String::new();
        self.reader.read_line(&mut line).await?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("status line")?;
        let mut length = 0usize;
        loop {
            line.clear();
            if self.reader.read_line(&mut line).await? == 0 {
                bail!("connection closed");
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse()?;
                }
            }
        }
        let mut body = vec![0u8; length];
        self.reader.read_exact(&mut body).await?;
        Ok(status)
    }
}

struct Figures {
    name: String,
    requests: usize,
    errors: usize,
    rps: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

async fn load(
    name: &str,
    addr: std::net::SocketAddr,
    token: &str,
    concurrency: usize,
    seconds: u64,
    path: impl Fn(&mut rand::rngs::ThreadRng) -> String + Send + Sync + Clone + 'static,
) -> anyhow::Result<Figures> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let token = token.to_string();
        let path = path.clone();
        tasks.spawn(async move {
            let mut conn = Conn::open(addr).await?;
            let mut lat = Vec::new();
            let mut errors = 0usize;
            while Instant::now() < deadline {
                let p = path(&mut rand::thread_rng());
                let t = Instant::now();
                let status = conn.get(&p, &token).await?;
                lat.push(t.elapsed());
                if status != 200 {
                    errors += 1;
                }
            }
            anyhow::Ok((lat, errors))
        });
    }
    let mut lat = Vec::new();
    let mut errors = 0;
    while let Some(r) = tasks.join_next().await {
        let (l, e) = r??;
        lat.extend(l);
        errors += e;
    }
    let elapsed = start.elapsed();
    lat.sort();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    Ok(Figures {
        name: name.to_string(),
        requests: lat.len(),
        errors,
        rps: lat.len() as f64 / elapsed.as_secs_f64(),
        p50: q(0.50),
        p99: q(0.99),
        max: *lat.last().unwrap_or(&Duration::ZERO),
    })
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

pub async fn run(mut config: FleetConfig, b: ApiBench) -> anyhow::Result<()> {
    let base = config
        .database
        .url
        .rsplit_once('/')
        .map(|(b, _)| b.to_string())
        .context("database.url has no database name")?;
    let db_name = format!(
        "fleet_bench_api_{}",
        ulid::Ulid::new().to_string().to_lowercase()
    );
    config.database.url = format!("{base}/{db_name}");
    config.database.max_connections = config.database.max_connections.max(b.concurrency as u32);
    config.api.max_page_size = config.api.max_page_size.max(b.page);
    crate::migrate(&config).await?;
    let pool = fleet_store::connect(&config.database.url, 4).await?;
    let t = Instant::now();
    seed(&pool, b.devices).await?;
    eprintln!(
        "seeded {} devices in {:.1}s",
        b.devices,
        t.elapsed().as_secs_f64()
    );
    let (_, token) = fleet_api::create_token(&pool, &[Scope::DeviceRead], "bench").await?;

    let app = fleet_api::App::connect(&config.common(), &config.api).await?;
    let (trigger, shutdown) = Shutdown::new();
    let addr = fleet_api::serve(app, "127.0.0.1:0", shutdown).await?;
    let n = b.devices;
    let page = b.page;
    let random_id =
        move |rng: &mut rand::rngs::ThreadRng| format!("dev_b{:08}", rng.gen_range(1..=n));
    let filters = [
        "site=s{site}&operational_status=available",
        "site=s{site}&health_status=degraded",
        "operational_status=in_use,available&customer_ready=true",
        "schedulable=true&site=s{site}",
        "slurm_states=DRAIN&site=s{site}",
        "in_triage=true",
        "site=s{site}&health_status=critical",
    ];
    let filtered = move |rng: &mut rand::rngs::ThreadRng| {
        let f = filters[rng.gen_range(0..filters.len())]
            .replace("{site}", &rng.gen_range(0..SITES).to_string());
        format!("/api/v1/devices/?{f}&limit={page}")
    };
    let filtered_deep = move |rng: &mut rand::rngs::ThreadRng| {
        let cursor = fleet_api::page::encode(&(random_id(rng),));
        format!("{}&cursor={cursor}", filtered(rng))
    };
    // Warm up the pool and caches.
    load("warm-up", addr, &token, b.concurrency, 2, filtered).await?;
    let mut figures = vec![
        load(
            "device list, filtered, first page",
            addr,
            &token,
            b.concurrency,
            b.seconds,
            filtered,
        )
        .await?,
        load(
            "device list, filtered, page after a random cursor",
            addr,
            &token,
            b.concurrency,
            b.seconds,
            filtered_deep,
        )
        .await?,
        load(
            "device detail (with decisive conditions)",
            addr,
            &token,
            b.concurrency,
            b.seconds,
            move |rng| format!("/api/v1/devices/{}/", random_id(rng)),
        )
        .await?,
    ];
    figures.push(
        load(
            "mixed: half filtered pages, half details",
            addr,
            &token,
            b.concurrency,
            b.seconds,
            move |rng| {
                if rng.gen_bool(0.5) {
                    filtered_deep(rng)
                } else {
                    format!("/api/v1/devices/{}/", random_id(rng))
                }
            },
        )
        .await?,
    );
    trigger.trigger();

    println!(
        "fleet bench api: {} devices, {} connections, {} s per workload, page size {}",
        b.devices, b.concurrency, b.seconds, b.page
    );
    println!();
    println!("| workload | requests | errors | requests/s | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|---|---|");
    for f in &figures {
        println!(
            "| {} | {} | {} | {:.0} | {} | {} | {} |",
            f.name,
            f.requests,
            f.errors,
            f.rps,
            ms(f.p50),
            ms(f.p99),
            ms(f.max)
        );
    }
    let worst = figures[..2].iter().map(|f| f.p99).max().unwrap_or_default();
    println!();
    println!(
        "filtered page p99 {} ms: target <= 50 ms {}",
        ms(worst),
        if worst <= Duration::from_millis(50) {
            "met"
        } else {
            "NOT met"
        }
    );
    pool.close().await;
    if !b.keep {
        let admin = format!("{base}/postgres");
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await?;
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS \"{db_name}\" WITH (FORCE)"
        ))
        .execute(&mut conn)
        .await?;
    }
    if figures.iter().any(|f| f.errors > 0) {
        bail!("some requests failed");
    }
    Ok(())
}
