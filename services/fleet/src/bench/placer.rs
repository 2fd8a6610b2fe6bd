//! `fleet bench placer` (`spec/quality.md`, "the placer (allocations/s with
//! concurrent requesters, zero double bookings)"): a fresh database with a
//! pool of N schedulable hosts, the placer in this process, and R
//! concurrent requesters booking 1 to 8 GPUs (a share on one device) and
//! releasing their oldest allocation past a holding limit, so the pool
//! stays around the target utilisation. Reports allocations/s, request
//! latency, and the double-booked atoms found in PostgreSQL afterwards
//! (must be 0), plus how often the unique index had to refuse one (must be
//! 0: the row lock prevents it first).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::FleetConfig;
use fleet_bus::{StreamNames, Subjects};
use fleet_placer::{AllocateRequest, Placer};
use fleet_placer_client::{PlacerClient, PlacerError};
use fleet_runtime::Shutdown;
use rand::{Rng, SeedableRng};

#[derive(clap::Args, Debug)]
pub struct PlacerBench {
    /// Hosts in the pool.
    #[arg(long, default_value_t = 10_000)]
    pub devices: i64,
    /// GPUs per host.
    #[arg(long, default_value_t = 8)]
    pub gpus: i32,
    /// Concurrent requesters.
    #[arg(long, default_value_t = 16)]
    pub requesters: usize,
    /// Length of the measured run.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Pool utilisation the requesters hold (they release their oldest
    /// allocation past it).
    #[arg(long, default_value_t = 0.75)]
    pub utilisation: f64,
    /// Call the placer library directly instead of over NATS request/reply.
    #[arg(long)]
    pub direct: bool,
    /// Keep the benchmark database and streams afterwards.
    #[arg(long)]
    pub keep: bool,
}

#[derive(Default)]
struct Tally {
    allocated: u64,
    refused: u64,
    released: u64,
    latencies: Vec<Duration>,
}

enum Path {
    Nats(PlacerClient),
    Direct(Arc<Placer>),
}

impl Path {
    async fn allocate(&self, r: &AllocateRequest) -> Result<fleet_placer::Allocation, PlacerError> {
        match self {
            Path::Nats(c) => c.allocate(r).await,
            Path::Direct(p) => Ok(p.allocate(r.clone()).await?),
        }
    }
    async fn release(&self, id: &str) -> Result<fleet_placer::Allocation, PlacerError> {
        match self {
            Path::Nats(c) => c.release(id, Some("bench")).await,
            Path::Direct(p) => Ok(p.release(id, Some("bench")).await?),
        }
    }
}

pub async fn run(base: FleetConfig, args: PlacerBench) -> anyhow::Result<()> {
    let mut fresh = crate::bench::Fresh::new(&base, "placer").await?;
    fresh.config.placer.listen = "127.0.0.1:0".into();
    let result = bench(&fresh.config, &args).await;
    if !args.keep {
        let names = StreamNames::new(&fresh.config.nats.stream_prefix);
        fresh.remove(&[fleet_placer::events_stream(&names)]).await;
    }
    println!("{}", result?);
    Ok(())
}

async fn bench(config: &FleetConfig, args: &PlacerBench) -> anyhow::Result<String> {
    let db = fleet_store::connect(&config.database.url, 4).await?;
    eprintln!("bench: seeding {} hosts x {} GPUs", args.devices, args.gpus);
    sqlx::query("INSERT INTO sites (id, name) VALUES ('bench', 'bench')")
        .execute(&db)
        .await?;
    sqlx::query("INSERT INTO tenants (id, name) VALUES ('bench', 'bench')")
        .execute(&db)
        .await?;
    sqlx::query("INSERT INTO pools (id, site_id, kind) VALUES ('pool', 'bench', 'metal-host')")
        .execute(&db)
        .await?;
    sqlx::query("INSERT INTO pool_hardware_profiles (pool_id, gpu_count) VALUES ('pool', $1)")
        .bind(args.gpus)
        .execute(&db)
        .await?;
    sqlx::query(
        "INSERT INTO devices (id, name, site_id, pool_id, rack, role, trust, provision_state, observed_generation, \
         connectivity, capacity_bucket, labels) \
         SELECT 'dev_bench_' || lpad(g::text, 6, '0'), 'gpu-' || g, 'bench', 'pool', 'r' || (g / 32), 'host', \
         'platform', 'deployed', 1, 'connected', 'schedulable', jsonb_build_object('nvlink_domain', 'nvl-' || (g / 8)) \
         FROM generate_series(0, $1 - 1) g",
    )
    .bind(args.devices)
    .execute(&db)
    .await?;
    sqlx::query("ANALYZE devices").execute(&db).await?;

    // The streams the placer reads but does not own (STATUS, DLQ) are the
    // hub's: no hub runs here, so the bench creates them as the hub would.
    {
        let nats = fleet_bus::connect_now(&config.nats, "fleet-bench").await?;
        let js = async_nats::jetstream::new(nats);
        fleet_bus::ensure_streams(&js, &config.nats).await?;
    }
    let placer = Placer::connect(config.common(), config.placer.clone()).await?;
    let (trigger, shutdown) = Shutdown::new();
    let task = tokio::spawn(fleet_placer::run_with(placer.clone(), shutdown));
    let subjects = Subjects::new(&config.nats.subject_root, &config.nats.radar_root);
    let client = PlacerClient::new(placer.deps.nats.clone(), subjects, Duration::from_secs(30));
    // Wait until the request subscription answers.
    let ready = Instant::now();
    while matches!(
        client.capacity("pool").await,
        Err(PlacerError::Unavailable(_) | PlacerError::NotRunning)
    ) {
        if ready.elapsed() > Duration::from_secs(10) {
            anyhow::bail!("the placer did not start answering");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mean_gpus = 4.5;
    let hold = ((args.devices as f64 * args.gpus as f64 * args.utilisation)
        / (args.requesters as f64 * mean_gpus))
        .max(1.0) as usize;
    eprintln!(
        "bench: {} requesters for {} s over {}, each holding up to {hold} allocations",
        args.requesters,
        args.seconds,
        if args.direct { "the library" } else { "NATS" }
    );
    let path = Arc::new(if args.direct {
        Path::Direct(placer.clone())
    } else {
        Path::Nats(client.clone())
    });
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for r in 0..args.requesters {
        let path = path.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(r as u64);
            let mut held: std::collections::VecDeque<String> = Default::default();
            let mut t = Tally::default();
            while Instant::now() < deadline {
                if held.len() >= hold {
                    if let Some(a) = held.pop_front() {
                        path.release(&a).await?;
                        t.released += 1;
                    }
                }
                let req = AllocateRequest {
                    tenant_id: "bench".into(),
                    pool_id: "pool".into(),
                    gpus: rng.gen_range(1..=8),
                    same_device: rng.gen_bool(0.5),
                    nvlink_domain: None,
                    request_id: None,
                };
                let at = Instant::now();
                match path.allocate(&req).await {
                    Ok(a) => {
                        t.latencies.push(at.elapsed());
                        t.allocated += 1;
                        held.push_back(a.id);
                    }
                    Err(PlacerError::InsufficientCapacity(_)) => t.refused += 1,
                    Err(e) => return Err(anyhow::anyhow!("allocate: {e}")),
                }
            }
            Ok::<Tally, anyhow::Error>(t)
        }));
    }
    let mut total = Tally::default();
    for t in tasks {
        let t = t.await??;
        total.allocated += t.allocated;
        total.refused += t.refused;
        total.released += t.released;
        total.latencies.extend(t.latencies);
    }
    let elapsed = started.elapsed().as_secs_f64();
    total.latencies.sort();
    let pct = |p: f64| {
        total
            .latencies
            .get(
                ((total.latencies.len() as f64 * p) as usize)
                    .min(total.latencies.len().saturating_sub(1)),
            )
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or(0.0)
    };

    let doubles: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT device_id, atom FROM allocation_atoms WHERE released_at IS NULL \
         GROUP BY device_id, atom HAVING count(*) > 1) d",
    )
    .fetch_one(&db)
    .await?;
    let booked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM allocation_atoms WHERE released_at IS NULL")
            .fetch_one(&db)
            .await?;
    let cap = placer.capacity_from_db("pool").await?;
    let view = placer.capacity("pool").await?;
    let refused_by_index = placer.metrics.double_booking_refused.get();
    let slow = placer.metrics.slow_path.get();
    trigger.trigger();
    let _ = task.await;

    let mut out = String::new();
    use std::fmt::Write;
    writeln!(
        out,
        "placer benchmark: {} hosts x {} GPUs, {} requesters, {:.0} s, via {}",
        args.devices,
        args.gpus,
        args.requesters,
        elapsed,
        if args.direct {
            "the library"
        } else {
            "NATS request/reply"
        }
    )?;
    writeln!(out, "| figure | value |")?;
    writeln!(out, "|---|---|")?;
    writeln!(
        out,
        "| allocations/s | {:.0} |",
        total.allocated as f64 / elapsed
    )?;
    writeln!(
        out,
        "| allocations (refused: pool full) | {} ({}) |",
        total.allocated, total.refused
    )?;
    writeln!(
        out,
        "| releases/s | {:.0} |",
        total.released as f64 / elapsed
    )?;
    writeln!(
        out,
        "| allocate latency p50 / p99 / max (ms) | {:.2} / {:.2} / {:.2} |",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    )?;
    writeln!(out, "| requests that took the slow path | {slow} |")?;
    writeln!(
        out,
        "| GPUs booked at the end / pool | {booked} / {} |",
        cap.total
    )?;
    writeln!(out, "| capacity view equals PostgreSQL | {} |", view == cap)?;
    writeln!(out, "| double-booked atoms | {doubles} |")?;
    writeln!(
        out,
        "| bookings refused by the unique index | {refused_by_index} |"
    )?;
    if doubles != 0 || refused_by_index != 0 {
        anyhow::bail!("{out}\nDOUBLE BOOKING: the placer is broken");
    }
    Ok(out)
}
