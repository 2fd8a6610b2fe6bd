//! `fleet bench hub` (`spec/quality.md`): sustained snapshots/s for a
//! freshness-only resync and for a changing workload, publish ->
//! StatusChanged latency at half rate, hub peak RSS, rows written per
//! snapshot, and in the same run the naive per-condition path and the raw
//! PostgreSQL and JetStream limits as ratios to the hub.
//!
//! The hub runs as its own process (`fleet hub`), so its RSS is its own.
//! Throughput phases pre-load the stream while the hub is stopped and time
//! how long the hub takes to drain it, so the publisher never limits them.

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench::Fresh;
use crate::config::FleetConfig;
use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use fleet_bus::{StreamNames, Subjects};
use fleet_proto::{timestamp, v1, Message};
use futures::StreamExt;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(clap::Args, Debug)]
pub struct HubBench {
    /// Fleet size.
    #[arg(long, default_value_t = 100_000)]
    pub devices: usize,
    /// Share of snapshots in the changing workload that flip a decisive condition.
    #[arg(long, default_value_t = 0.5)]
    pub flip_share: f64,
    /// Conditions written by the naive per-condition reference.
    #[arg(long, default_value_t = 6_000)]
    pub naive_conditions: usize,
    /// Devices flipped one by one for the latency phase.
    #[arg(long, default_value_t = 5_000)]
    pub latency_samples: usize,
    /// Write every latency sample (ms after the phase's first publish,
    /// device, publish -> `StatusChanged` ms) to this CSV file, to see when
    /// in the phase the tail happened.
    #[arg(long)]
    pub latency_trace: Option<std::path::PathBuf>,
    /// Keep the benchmark database and streams afterwards.
    #[arg(long)]
    pub keep: bool,
}

struct Bench {
    /// The config, database and streams of this run.
    fresh: Fresh,
    pool: PgPool,
    nats: async_nats::Client,
    js: async_nats::jetstream::Context,
    subjects: Subjects,
    streams: StreamNames,
    metrics_addr: String,
    names: Vec<String>,
}

const SITE: &str = "bench";

/// The six openstack conditions; `maintenance` flips quarantine <-> in_use.
fn snapshot(name: &str, at: DateTime<Utc>, maintenance: bool) -> v1::ConditionSnapshot {
    let c = |t: &str, s: bool| v1::Condition {
        r#type: t.into(),
        status: if s { "True" } else { "False" }.into(),
        reason: String::new(),
        message: String::new(),
    };
    v1::ConditionSnapshot {
        resource_bindings: vec![],
        source: "openstack".into(),
        device: Some(v1::DeviceKey {
            site: SITE.into(),
            kind: "name".into(),
            key: name.into(),
        }),
        observed_at: Some(timestamp(at)),
        conditions: vec![
            c("IronicProvisionHealthy", true),
            c("IronicMaintenance", maintenance),
            c("CustomerReady", true),
            c("InstanceAllocated", true),
            c("IronicAvailable", false),
            c("InMaintenancePool", false),
        ],
        mirror: None,
    }
}

pub async fn run(base: FleetConfig, args: HubBench) -> anyhow::Result<()> {
    let mut b = Bench::setup(base, &args).await?;
    let result = b.measure(&args).await;
    if !args.keep {
        b.teardown().await;
    }
    let report = result?;
    println!("{report}");
    Ok(())
}

impl Bench {
    async fn setup(base: FleetConfig, args: &HubBench) -> anyhow::Result<Bench> {
        let mut fresh = Fresh::isolated(&base, "fleet_bench")?;
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let metrics_addr = format!("127.0.0.1:{port}");
        fresh.config.hub.listen = metrics_addr.clone();

        let config = &fresh.config;
        crate::migrate(config).await?;
        let pool = fleet_store::connect(&config.database.url, 8).await?;
        let nats = fleet_bus::connect_now(&config.nats, "fleet-bench").await?;
        let js = async_nats::jetstream::new(nats.clone());
        let subjects = Subjects::new(&config.nats.subject_root, &config.nats.radar_root);
        let streams = StreamNames::new(&config.nats.stream_prefix);
        fleet_bus::ensure_streams(&js, &config.nats).await?;

        eprintln!("bench: inserting {} devices", args.devices);
        sqlx::query("INSERT INTO sites (id, name) VALUES ($1, 'bench')")
            .bind(SITE)
            .execute(&pool)
            .await?;
        sqlx::query(
            "INSERT INTO devices (id, name, site_id, role, provision_state, connectivity, no_schedule_reasons) \
             SELECT 'dev_bench_' || lpad(g::text, 7, '0'), 'gpu-' || lpad(g::text, 7, '0'), $1, 'host', 'deployed', \
             'disconnected', '{unreachable}' FROM generate_series(1, $2) g",
        )
        .bind(SITE)
        .bind(args.devices as i64)
        .execute(&pool)
        .await?;
        sqlx::query("ANALYZE devices").execute(&pool).await?;
        let names = (1..=args.devices).map(|g| format!("gpu-{g:07}")).collect();
        Ok(Bench {
            fresh,
            pool,
            nats,
            js,
            subjects,
            streams,
            metrics_addr,
            names,
        })
    }

    async fn teardown(&self) {
        for s in self.streams.mesh(self.fresh.config.nats.partitions) {
            let _ = self.js.delete_stream(&s).await;
        }
        self.pool.close().await;
        self.fresh.drop_database().await;
    }

    fn spawn_hub(&self) -> anyhow::Result<Child> {
        let exe = std::env::current_exe()?;
        let c = &self.fresh.config;
        Command::new(exe)
            .arg("hub")
            .env("FLEET__DATABASE__URL", &c.database.url)
            .env("FLEET__NATS__URL", &c.nats.url)
            .env("FLEET__NATS__SUBJECT_ROOT", &c.nats.subject_root)
            .env("FLEET__NATS__RADAR_ROOT", &c.nats.radar_root)
            .env("FLEET__NATS__STREAM_PREFIX", &c.nats.stream_prefix)
            .env("FLEET__NATS__PARTITIONS", c.nats.partitions.to_string())
            .env("FLEET__HUB__LISTEN", &c.hub.listen)
            // One name across the phases' restarts: the next process
            // re-claims the killed one's leases at once.
            .env("FLEET__HUB__REPLICA", "bench-hub")
            .env("FLEET__FRESHNESS__DEFAULT_TTL", "1day")
            .env(
                "RUST_LOG",
                std::env::var("FLEET_BENCH_HUB_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting fleet hub")
    }

    /// The hub's `batch_seconds` per stage now (see [`parse_stages`]).
    async fn stages(&self) -> anyhow::Result<BTreeMap<String, StageStats>> {
        Ok(parse_stages(
            &http_get(&self.metrics_addr, "/metrics").await?,
        ))
    }

    async fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(body) = http_get(&self.metrics_addr, "/readyz").await {
                if body.starts_with("ready") {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("the hub did not become ready")
    }

    /// Publishes one snapshot as the openstack connector would; the
    /// message id is its device and observation time.
    async fn publish_snapshot(
        &self,
        s: &v1::ConditionSnapshot,
    ) -> anyhow::Result<async_nats::jetstream::context::PublishAckFuture> {
        let key = s.device.clone().unwrap_or_default();
        let at = fleet_connector::snapshot::observed_nanos(s);
        Ok(fleet_bus::publish_observation(
            &self.js,
            &self.subjects,
            self.fresh.config.nats.partitions,
            "openstack",
            &key,
            at,
            &fleet_proto::schema::<v1::ConditionSnapshot>(),
            None,
            s.encode_to_vec().into(),
        )
        .await?)
    }

    /// Publishes every snapshot with pipelined PubAcks.
    async fn publish_all(&self, snaps: &[v1::ConditionSnapshot]) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let mut inflight = Vec::with_capacity(1024);
        for s in snaps {
            inflight.push(self.publish_snapshot(s).await?);
            if inflight.len() >= 1024 {
                for a in inflight.drain(..) {
                    a.await?;
                }
            }
        }
        for a in inflight {
            a.await?;
        }
        Ok(start.elapsed())
    }

    async fn pending(&self) -> anyhow::Result<u64> {
        Ok(fleet_bus::observations_held(&self.js, &self.fresh.config.nats).await?)
    }

    /// Starts the hub on a pre-loaded stream and times the drain.
    async fn drain(&self, n: usize, label: &str) -> anyhow::Result<Phase> {
        // Untimed, as autovacuum would between phases in production (this
        // machine's PostgreSQL runs with autovacuum off): without it every
        // phase reads the dead rows of all the phases before.
        sqlx::query("VACUUM (ANALYZE) devices, device_conditions, device_source_freshness, device_sweep, outbox")
            .execute(&self.pool)
            .await
            .context("VACUUM before the phase")?;
        let before = self.scrape().await.unwrap_or_default();
        let mut hub = self.spawn_hub()?;
        let start = Instant::now();
        let res: anyhow::Result<Phase> = async {
            self.wait_ready().await?;
            let ready = start.elapsed();
            let before = if before.is_empty() { HashMap::new() } else { before };
            let mut last = (u64::MAX, i64::MAX, Instant::now());
            // When the hub was first seen to have taken observations from
            // the stream, and how many were left then: the steady rate runs
            // from there, without the process's start-up.
            let mut first: Option<(Instant, u64)> = None;
            // Progress from the stream and the hub's own counters: polling
            // the outbox table itself (count(*) every 20 ms over a churning
            // queue table) kept one PostgreSQL backend busy and slowed the
            // hub it measured.
            loop {
                let left = self.pending().await?;
                if first.is_none() && left < n as u64 {
                    first = Some((Instant::now(), left));
                }
                let m = self.scrape().await.unwrap_or_default();
                let get = |k: &str| m.get(k).copied().unwrap_or(0.0);
                let unpublished = (get("fleet_hub_status_events_total") - get("fleet_hub_outbox_published_total")).max(0.0) as i64;
                if left == 0 && unpublished == 0 {
                    break;
                }
                if (left, unpublished) != (last.0, last.1) {
                    last = (left, unpublished, Instant::now());
                } else if last.2.elapsed() > Duration::from_secs(60) {
                    bail!("{label}: stalled for 60 s with {left} observations and {unpublished} status events pending");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // The phase ends when every observation is applied and every
            // status change is on STATUS.
            let elapsed = start.elapsed();
            let steady = first.and_then(|(at, left)| {
                let d = at.elapsed();
                (left > 0 && d > Duration::ZERO).then(|| left as f64 / d.as_secs_f64())
            });
            let taking = first.map(|(at, _)| at - start);
            // Untimed: the relay has also deleted what it published.
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let outbox: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox").fetch_one(&self.pool).await?;
                if outbox == 0 {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("{label}: {outbox} outbox rows left 60 s after every event was published");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let after = self.scrape().await?;
            let rows = ["devices", "device_conditions", "device_source_freshness", "device_lifecycle_events"]
                .iter()
                .map(|t| {
                    let k = format!("fleet_hub_rows_written_total{{table=\"{t}\"}}");
                    after.get(&k).copied().unwrap_or(0.0) - before.get(&k).copied().unwrap_or(0.0)
                })
                .sum::<f64>();
            let rss = rss_peak_kib(hub.id()).unwrap_or(0);
            let cpu = cpu_seconds(hub.id()).unwrap_or(0.0);
            Ok(Phase { label: label.into(), snapshots: n, elapsed, ready, taking, steady, rows_per_snapshot: rows / n as f64, rss_kib: rss, cpu })
        }
        .await;
        stop(&mut hub);
        res
    }

    async fn scrape(&self) -> anyhow::Result<HashMap<String, f64>> {
        let body = http_get(&self.metrics_addr, "/metrics").await?;
        Ok(body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                l.rsplit_once(' ')
                    .and_then(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v)))
            })
            .collect())
    }

    async fn measure(&mut self, args: &HubBench) -> anyhow::Result<String> {
        let n = self.names.len();
        let t0 = Utc::now() - chrono::Duration::hours(1);
        let phase_snaps = |offset: i64,
                           flip: &dyn Fn(usize) -> bool|
         -> Vec<v1::ConditionSnapshot> {
            self.names
                .iter()
                .enumerate()
                .map(|(i, name)| snapshot(name, t0 + chrono::Duration::seconds(offset), flip(i)))
                .collect()
        };

        eprintln!("bench: initial load ({n} snapshots creating 6 conditions each)");
        let pubd = self.publish_all(&phase_snaps(0, &|_| false)).await?;
        let initial = self.drain(n, "initial load (creates every row)").await?;
        eprintln!(
            "bench: published at {:.0}/s; {}",
            n as f64 / pubd.as_secs_f64(),
            initial.line()
        );

        eprintln!("bench: freshness-only resync");
        self.publish_all(&phase_snaps(60, &|_| false)).await?;
        let fresh = self.drain(n, "freshness-only resync").await?;
        eprintln!("bench: {}", fresh.line());

        eprintln!(
            "bench: changing workload ({:.0}% flip IronicMaintenance)",
            args.flip_share * 100.0
        );
        let every = (1.0 / args.flip_share.clamp(0.01, 1.0)).round() as usize;
        self.publish_all(&phase_snaps(120, &|i| i % every == 0))
            .await?;
        let changing = self.drain(n, "changing (flips decisive)").await?;
        eprintln!("bench: {}", changing.line());

        // Half the steady changing rate (the hub's sustained rate), not of
        // the whole phase, which counts the process's start-up: until
        // 2026-12-07 it was the whole phase's, 10 - 15 % lower.
        let rate = changing.steady_rate() / 2.0;
        // Devices the changing phase left in_use: the samples flip to
        // quarantine, the fillers are sent unchanged (freshness only).
        let in_use: Vec<String> = self
            .names
            .iter()
            .enumerate()
            .filter(|(i, _)| i % every != 0)
            .map(|(_, n)| n.clone())
            .collect();
        let k = args.latency_samples;
        // Per flip, the changing phase's unchanged snapshots; the devices
        // sent unchanged are then the only-flips phase's samples.
        let per_flip = every - 1;
        let fillers = (k * per_flip).max(k);
        if in_use.len() < k + fillers {
            bail!(
                "--latency-samples {k} needs {} devices the changing phase leaves in_use; {n} devices leave {}",
                k + fillers,
                in_use.len()
            );
        }
        let (samples, fillers) = in_use.split_at(k);
        let at = t0 + chrono::Duration::seconds(180);
        eprintln!(
            "bench: latency, the changing workload ({:.0}% flip) at half its rate",
            100.0 / every as f64
        );
        // The changing phase's mix at half its rate: one flip, then
        // `per_flip` unchanged. Only the flips produce a `StatusChanged`.
        let mixed = self
            .latency(samples, &fillers[..k * per_flip], per_flip, rate, at)
            .await?;
        eprintln!("bench: latency, only flips at half the changing rate");
        // The phase as it ran until 2026-12-07: every message a flip, so
        // the hub handles as many flips a second as in the changing phase.
        // Its devices were sent unchanged at `at` just before.
        let flips = self
            .latency(
                &fillers[..k],
                &[],
                0,
                rate,
                at + chrono::Duration::seconds(1),
            )
            .await?;
        if let Some(path) = args.latency_trace.as_deref() {
            write_trace(path, &[("mixed", &mixed), ("flips", &flips)])?;
        }

        eprintln!("bench: naive per-condition reference");
        let naive = self.naive(args.naive_conditions).await?;
        eprintln!("bench: raw PostgreSQL batched upsert");
        let raw_pg = self.raw_pg(n).await?;
        eprintln!("bench: a first snapshot's rows alone, raw");
        let lanes = self.fresh.config.hub.lanes;
        let raw_first = self.raw_first_rows(n, lanes).await?;
        eprintln!("bench: raw JetStream publish+consume");
        let raw_js = self.raw_js(n.min(100_000)).await?;

        let peak_rss = [
            initial.rss_kib,
            fresh.rss_kib,
            changing.rss_kib,
            mixed.rss_kib,
            flips.rss_kib,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let slower_raw = raw_pg.min(raw_js);
        let mut out = String::new();
        out += &format!(
            "fleet bench hub: {n} devices, 6 conditions per snapshot, {} partitions, batch {}\n",
            self.fresh.config.nats.partitions, self.fresh.config.hub.batch_size
        );
        out += "| figure | value | target |\n|---|---|---|\n";
        out += &format!(
            "| initial load snapshots/s (all rows new): whole phase; steady | {:.0}; {:.0} | - |\n",
            initial.rate(),
            initial.steady_rate()
        );
        out += &format!(
            "| freshness-only snapshots/s: whole phase; steady | {:.0}; {:.0} ({:.0} conditions/s) | >= 5,000 |\n",
            fresh.rate(),
            fresh.steady_rate(),
            fresh.steady_rate() * 6.0
        );
        out += &format!(
            "| changing snapshots/s ({:.0}% flip): whole phase; steady | {:.0}; {:.0} ({:.0} conditions/s) | >= 2,000 |\n",
            args.flip_share * 100.0,
            changing.rate(),
            changing.steady_rate(),
            changing.steady_rate() * 6.0
        );
        out += &format!(
            "| hub start-up in the phases (spawn to `/readyz`, to the first batch acked: initial / freshness / changing) | {} | - |\n",
            [&initial, &fresh, &changing]
                .iter()
                .map(|p| format!(
                    "{:.2}, {:.2} s",
                    p.ready.as_secs_f64(),
                    p.taking.unwrap_or(p.elapsed).as_secs_f64()
                ))
                .collect::<Vec<_>>()
                .join(" / ")
        );
        out += &format!(
            "| publish -> StatusChanged, the changing mix at half its rate: {:.0} snapshots/s, {:.0} flips/s (p50 / p99 / max) | {:.1} / {:.1} / {:.1} ms | p99 <= 100 ms (spec: <= 250 ms) |\n",
            mixed.rate, mixed.flip_rate, mixed.p50, mixed.p99, mixed.max
        );
        out += &format!(
            "| publish -> StatusChanged, only flips at {:.0}/s (the figure until 2026-12-07; p50 / p99 / max) | {:.1} / {:.1} / {:.1} ms | - |\n",
            flips.flip_rate, flips.p50, flips.p99, flips.max
        );
        for (label, l) in [("the changing mix", &mixed), ("only flips", &flips)] {
            out += &stage_row(label, l);
        }
        out += &format!(
            "| hub peak RSS | {:.1} MiB | <= 256 MiB |\n",
            peak_rss as f64 / 1024.0
        );
        out += &format!(
            "| hub CPU while draining (freshness / changing), share of one core | {:.0}% / {:.0}% | - |\n",
            fresh.cpu_share() * 100.0,
            changing.cpu_share() * 100.0
        );
        out += &format!(
            "| hub CPU a snapshot (initial / freshness / changing) | {:.1} / {:.1} / {:.1} us | - |\n",
            initial.cpu_per_snapshot_us(),
            fresh.cpu_per_snapshot_us(),
            changing.cpu_per_snapshot_us()
        );
        out += &format!(
            "| rows written per snapshot (initial / freshness / changing) | {:.2} / {:.2} / {:.2} | O(1) for freshness |\n",
            initial.rows_per_snapshot, fresh.rows_per_snapshot, changing.rows_per_snapshot
        );
        out += &format!(
            "| naive per-condition path, snapshots/s | {:.0} ({:.0} conditions/s) | - |\n",
            naive / 6.0,
            naive
        );
        out += &format!(
            "| hub (changing) vs naive | {:.1}x | >= 10x |\n",
            changing.rate() / (naive / 6.0)
        );
        out += &format!(
            "| raw PostgreSQL batched upsert, snapshots/s | {:.0} | - |\n",
            raw_pg
        );
        out += &format!(
            "| a first snapshot's rows alone (6 conditions, freshness, device status, 2 lifecycle, 2 outbox), raw on {} connections (the hub's lanes), snapshots/s | {:.0} ({:.3} of the raw upsert) | - |\n",
            lanes,
            raw_first,
            raw_first / raw_pg
        );
        out += &format!(
            "| raw JetStream publish+consume, msgs/s | {:.0} | - |\n",
            raw_js
        );
        // Issue 20's measure: each rate as a share of a raw limit of the
        // same run; whole phase (start-up included) and steady.
        let share =
            |p: &Phase, raw: f64| format!("{:.3}; {:.3}", p.rate() / raw, p.steady_rate() / raw);
        out += &format!(
            "| initial load vs the raw PostgreSQL upsert: whole phase; steady | {} | >= 0.25 |\n",
            share(&initial, raw_pg)
        );
        out += &format!(
            "| initial load vs its rows alone, raw: whole phase; steady | {} | - |\n",
            share(&initial, raw_first)
        );
        out += &format!(
            "| changing vs the slower raw limit: whole phase; steady | {} | >= 0.35 |\n",
            share(&changing, slower_raw)
        );
        out += &format!(
            "| freshness-only vs the slower raw limit: whole phase; steady | {} | >= 0.8 (spec: >= 0.5) |\n",
            share(&fresh, slower_raw)
        );
        Ok(out)
    }

    /// Sends `samples` flips (in_use -> quarantine), each followed by
    /// `per_flip` of the `fillers` (unchanged, freshness only), one message
    /// every 1/`rate` s, and times each flip's publish to the
    /// `StatusChanged` of its device on a subscriber. PubAcks are awaited
    /// beside the sending, so a slow ack does not hold the schedule back.
    async fn latency(
        &self,
        samples: &[String],
        fillers: &[String],
        per_flip: usize,
        rate: f64,
        at: DateTime<Utc>,
    ) -> anyhow::Result<Latency> {
        let n = samples.len();
        let mut hub = self.spawn_hub()?;
        let res = async {
            self.wait_ready().await?;
            // Warm the new hub up (connections, statement caches, buffers)
            // with a freshness-only round of other devices, so the figure is
            // the steady state and not the first second of a fresh process.
            let used: std::collections::HashSet<&String> = samples.iter().chain(fillers).collect();
            let warm: Vec<v1::ConditionSnapshot> = self
                .names
                .iter()
                .filter(|n| !used.contains(n))
                .take(20_000)
                .map(|n| snapshot(n, at - chrono::Duration::seconds(30), false))
                .collect();
            self.publish_all(&warm).await?;
            while self.pending().await? > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let stages_before = self.stages().await?;
            let mut sub = self
                .nats
                .subscribe(self.subjects.status_axis("operational"))
                .await?;
            self.nats.flush().await?;
            let wanted: std::collections::HashSet<String> =
                samples.iter().map(|n| device_id(n)).collect();
            let collector = tokio::spawn(async move {
                let mut seen = HashMap::new();
                while let Some(m) = sub.next().await {
                    if let Ok(e) = v1::StatusChanged::decode(m.payload.as_ref()) {
                        if wanted.contains(&e.device_id) && e.to == "quarantine" {
                            seen.entry(e.device_id).or_insert_with(Instant::now);
                        }
                    }
                    if seen.len() >= n {
                        break;
                    }
                }
                seen
            });
            let (acks, mut pending) = tokio::sync::mpsc::unbounded_channel::<
                async_nats::jetstream::context::PublishAckFuture,
            >();
            let acker = tokio::spawn(async move {
                while let Some(a) = pending.recv().await {
                    a.await?;
                }
                Ok::<_, anyhow::Error>(())
            });
            // Maintenance off -> on flips in_use -> quarantine; fillers
            // stay as they are.
            let mut plan: Vec<(v1::ConditionSnapshot, Option<String>)> = vec![];
            let mut fill = fillers.iter();
            for name in samples {
                plan.push((snapshot(name, at, true), Some(device_id(name))));
                for f in fill.by_ref().take(per_flip) {
                    plan.push((snapshot(f, at, false), None));
                }
            }
            let interval = Duration::from_secs_f64(1.0 / rate.max(1.0));
            let mut sent: HashMap<String, Instant> = HashMap::new();
            let start = Instant::now();
            for (i, (s, flip)) in plan.iter().enumerate() {
                tokio::time::sleep_until((start + interval * i as u32).into()).await;
                if let Some(id) = flip {
                    sent.insert(id.clone(), Instant::now());
                }
                if acks.send(self.publish_snapshot(s).await?).is_err() {
                    break;
                }
            }
            let sending = start.elapsed();
            drop(acks);
            acker.await??;
            let seen = match tokio::time::timeout(Duration::from_secs(60), collector).await {
                Ok(seen) => seen?,
                Err(_) => bail!("status changes did not all arrive within 60 s"),
            };
            let mut trace: Vec<(f64, String, f64)> = sent
                .iter()
                .filter_map(|(id, t)| {
                    let got = seen.get(id)?;
                    Some((
                        t.saturating_duration_since(start).as_secs_f64() * 1000.0,
                        id.clone(),
                        got.saturating_duration_since(*t).as_secs_f64() * 1000.0,
                    ))
                })
                .collect();
            if trace.len() < n {
                bail!("only {} of {n} status changes arrived", trace.len());
            }
            trace.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut ms: Vec<f64> = trace.iter().map(|t| t.2).collect();
            ms.sort_by(|a, b| a.total_cmp(b));
            let q = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
            let stages_after = self.stages().await?;
            let stages = ["age", "wait", "apply", "publish"]
                .iter()
                .map(|stage| {
                    let before = stages_before.get(*stage).cloned().unwrap_or_default();
                    let after = stages_after.get(*stage).cloned().unwrap_or_default();
                    let (mean_ms, n, p99_ms) = after.since(&before);
                    (stage.to_string(), mean_ms, n, p99_ms)
                })
                .collect();
            let secs = sending.as_secs_f64().max(1e-9);
            Ok(Latency {
                stages,
                rate: plan.len() as f64 / secs,
                flip_rate: n as f64 / secs,
                p50: q(0.5),
                p99: q(0.99),
                max: *ms.last().unwrap_or(&0.0),
                rss_kib: rss_peak_kib(hub.id()).unwrap_or(0),
                trace,
            })
        }
        .await;
        stop(&mut hub);
        res
    }

    /// One transaction per condition, the way a per-row REST apply works:
    /// lock the device, upsert the row, re-read its conditions, write the
    /// device. Returns conditions/s.
    async fn naive(&self, conditions: usize) -> anyhow::Result<f64> {
        let types: Vec<&str> =
            fleet_domain::catalogue::observation_types_of(fleet_domain::Source::Openstack)
                .map(|t| t.as_str())
                .collect();
        let start = Instant::now();
        for i in 0..conditions {
            let id = format!("dev_bench_{:07}", (i / types.len()) % self.names.len() + 1);
            let t = types[i % types.len()];
            let mut tx = self.pool.begin().await?;
            sqlx::query("SELECT id FROM devices WHERE id = $1 FOR UPDATE")
                .bind(&id)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO device_conditions (device_id, type, status, reason, message, source, condition_of, durable, \
                 observed_at, received_at, last_transition_at) VALUES ($1, $2, 'True', '', '', 'openstack', 'operational', \
                 false, now(), now(), now()) ON CONFLICT (device_id, type) DO UPDATE SET observed_at = now(), received_at = now()",
            )
            .bind(&id)
            .bind(t)
            .execute(&mut *tx)
            .await?;
            let _rows: Vec<(String, String)> =
                sqlx::query_as("SELECT type, status FROM device_conditions WHERE device_id = $1")
                    .bind(&id)
                    .fetch_all(&mut *tx)
                    .await?;
            sqlx::query("UPDATE devices SET updated_at = now() WHERE id = $1")
                .bind(&id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        Ok(conditions as f64 / start.elapsed().as_secs_f64())
    }

    /// The freshness write of a snapshot, batched 256 to a statement, with
    /// nothing else: snapshots/s.
    async fn raw_pg(&self, n: usize) -> anyhow::Result<f64> {
        let start = Instant::now();
        for chunk in (1..=n).collect::<Vec<_>>().chunks(256) {
            let ids: Vec<String> = chunk.iter().map(|g| format!("dev_bench_{g:07}")).collect();
            sqlx::query(
                "INSERT INTO device_source_freshness (device_id, source, observed_at, digest, received_at) \
                 SELECT i, 'raw', now(), '\\x00', now() FROM UNNEST($1::text[]) AS u(i) \
                 ON CONFLICT (device_id, source) DO UPDATE SET observed_at = EXCLUDED.observed_at",
            )
            .bind(&ids)
            .execute(&self.pool)
            .await?;
        }
        Ok(n as f64 / start.elapsed().as_secs_f64())
    }

    /// The rows a first snapshot of six conditions must write under the
    /// spec's model (`conditions.md`: one `device_conditions` row a device
    /// and type), and nothing else: per device six condition rows, a
    /// freshness row, the device's status `UPDATE` (its indexed status
    /// columns change, as a birth's do), two lifecycle rows and two outbox
    /// rows, in batches of 256 devices a transaction on as many connections
    /// as the hub has lanes, the rows built by the server. No read, no
    /// derivation, no NATS: an upper bound on the initial load's rate on
    /// this machine, into copies of the tables (`LIKE ... INCLUDING ALL`,
    /// their indexes too) that are dropped afterwards. Snapshots/s.
    async fn raw_first_rows(&self, n: usize, lanes: usize) -> anyhow::Result<f64> {
        const TABLES: [(&str, &str); 5] = [
            ("bench_raw_devices", "devices"),
            ("bench_raw_conditions", "device_conditions"),
            ("bench_raw_freshness", "device_source_freshness"),
            ("bench_raw_lifecycle", "device_lifecycle_events"),
            ("bench_raw_outbox", "outbox"),
        ];
        let drop_copies = || async {
            for (copy, _) in TABLES {
                sqlx::query(&format!("DROP TABLE {copy}"))
                    .execute(&self.pool)
                    .await?;
            }
            anyhow::Ok(())
        };
        for (copy, of) in TABLES {
            sqlx::query(&format!("CREATE TABLE {copy} (LIKE {of} INCLUDING ALL)"))
                .execute(&self.pool)
                .await?;
        }
        // The devices as the initial load found them, statuses unknown.
        sqlx::query("INSERT INTO bench_raw_devices SELECT * FROM devices")
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "UPDATE bench_raw_devices SET operational_status = 'unknown', health_status = 'unknown'",
        )
        .execute(&self.pool)
        .await?;
        sqlx::query("VACUUM (ANALYZE) bench_raw_devices")
            .execute(&self.pool)
            .await?;
        let ids: Vec<String> = self.names[..n].iter().map(|m| device_id(m)).collect();
        // The six types of the bench's own snapshot.
        let types: Vec<String> = snapshot("gpu-0000001", Utc::now(), false)
            .conditions
            .into_iter()
            .map(|c| c.r#type)
            .collect();
        let types = &types;
        let write = |chunk: &[String]| {
            let chunk = chunk.to_vec();
            async move {
                let mut tx = self.pool.begin().await?;
                sqlx::query(
                    "INSERT INTO bench_raw_conditions (device_id, type, status, reason, message, source, \
                     condition_of, durable, observed_at, received_at, decisive, last_transition_at) \
                     SELECT i, t, 'False', '', '', 'openstack', 'operational', false, now(), now(), false, now() \
                     FROM UNNEST($1::text[]) AS i, UNNEST($2::text[]) AS t",
                )
                .bind(&chunk)
                .bind(types)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO bench_raw_freshness (device_id, source, observed_at, digest, settled_version, received_at) \
                     SELECT i, 'openstack', now(), '\\x00', 1, now() FROM UNNEST($1::text[]) AS i",
                )
                .bind(&chunk)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "UPDATE bench_raw_devices SET operational_status = 'available', health_status = 'healthy', \
                     version = version + 1, updated_at = now(), derived_at = now() WHERE id = ANY($1)",
                )
                .bind(&chunk)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO bench_raw_lifecycle (device_id, kind, value, cause, created_at) \
                     SELECT i, k, 'available', 'openstack', now() FROM UNNEST($1::text[]) AS i, \
                     UNNEST(ARRAY['operational', 'health']) AS k",
                )
                .bind(&chunk)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO bench_raw_outbox (subject, schema, payload, traceparent) \
                     SELECT 'fleet.status.' || k || '.bench.' || i, 'fleet.v1.StatusChanged', \
                     convert_to(repeat('x', 160), 'UTF8'), \
                     '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' \
                     FROM UNNEST($1::text[]) AS i, UNNEST(ARRAY['operational', 'conditions']) AS k",
                )
                .bind(&chunk)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                anyhow::Ok(())
            }
        };
        let start = Instant::now();
        let written: anyhow::Result<()> = futures::stream::iter(ids.chunks(256).map(write))
            .buffer_unordered(lanes.max(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect();
        let elapsed = start.elapsed();
        drop_copies().await?;
        written?;
        Ok(n as f64 / elapsed.as_secs_f64())
    }

    /// Publish `n` snapshot-sized messages and consume+ack them from a pull
    /// consumer: msgs/s over the whole loop.
    async fn raw_js(&self, n: usize) -> anyhow::Result<f64> {
        let name = format!("{}RAW", self.fresh.config.nats.stream_prefix);
        let subject = format!("{}.raw.>", self.fresh.config.nats.subject_root);
        let stream = self
            .js
            .create_stream(async_nats::jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![subject],
                retention: async_nats::jetstream::stream::RetentionPolicy::WorkQueue,
                storage: async_nats::jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await?;
        let payload: bytes::Bytes = snapshot("gpu-0000001", Utc::now(), false)
            .encode_to_vec()
            .into();
        let start = Instant::now();
        let consumer = fleet_bus::pull_consumer(
            &self.js,
            &name,
            "raw",
            format!("{}.raw.>", self.fresh.config.nats.subject_root),
            Duration::from_secs(30),
        )
        .await?;
        let js = self.js.clone();
        let root = self.fresh.config.nats.subject_root.clone();
        let publisher = tokio::spawn(async move {
            let mut inflight = Vec::with_capacity(1024);
            for i in 0..n {
                let ack = fleet_bus::publish(
                    &js,
                    format!("{root}.raw.{}", i % 16),
                    &format!("raw-{i}"),
                    fleet_bus::headers("raw", None),
                    payload.clone(),
                )
                .await?;
                inflight.push(ack);
                if inflight.len() >= 1024 {
                    for a in inflight.drain(..) {
                        a.await.map_err(|e| fleet_bus::BusError::js("ack", e))?;
                    }
                }
            }
            for a in inflight {
                a.await.map_err(|e| fleet_bus::BusError::js("ack", e))?;
            }
            Ok::<_, fleet_bus::BusError>(())
        });
        let mut got = 0;
        while got < n {
            let mut batch = consumer
                .batch()
                .max_messages(256)
                .expires(Duration::from_millis(50))
                .messages()
                .await?;
            while let Some(Ok(m)) = batch.next().await {
                m.ack().await.map_err(|e| anyhow::anyhow!("ack: {e}"))?;
                got += 1;
            }
        }
        publisher.await??;
        let rate = n as f64 / start.elapsed().as_secs_f64();
        drop(stream);
        let _ = self.js.delete_stream(&name).await;
        Ok(rate)
    }
}

struct Phase {
    label: String,
    snapshots: usize,
    /// From starting the hub process to the stream drained and every
    /// status change published.
    elapsed: Duration,
    /// Of `elapsed`, until the hub answered `/readyz`.
    ready: Duration,
    /// Of `elapsed`, until the hub was first seen to have taken some of
    /// the stream (acked: one batch committed).
    taking: Option<Duration>,
    /// Snapshots/s from when the hub was first seen to have taken some of
    /// the stream to the end: the rate without the process's start-up
    /// (connections, leases, binding its consumers).
    steady: Option<f64>,
    rows_per_snapshot: f64,
    rss_kib: u64,
    /// CPU seconds the hub process used in the phase.
    cpu: f64,
}

impl Phase {
    /// The hub's share of one core while it drained the phase.
    fn cpu_share(&self) -> f64 {
        self.cpu / self.elapsed.as_secs_f64()
    }
    /// The hub's CPU time a snapshot, in microseconds: steadier across
    /// runs than a rate on this shared machine.
    fn cpu_per_snapshot_us(&self) -> f64 {
        self.cpu * 1e6 / self.snapshots as f64
    }
    fn rate(&self) -> f64 {
        self.snapshots as f64 / self.elapsed.as_secs_f64()
    }
    /// [`Phase::steady`], or the whole phase's rate when the drain was too
    /// short to tell.
    fn steady_rate(&self) -> f64 {
        self.steady.unwrap_or_else(|| self.rate())
    }
    fn line(&self) -> String {
        format!(
            "{}: {} snapshots in {:.2}s = {:.0}/s (ready after {:.2}s, taking after {:.2}s; {:.0}/s from then), {:.2} rows/snapshot, hub RSS {:.1} MiB, hub CPU {:.0}% of a core",
            self.label,
            self.snapshots,
            self.elapsed.as_secs_f64(),
            self.rate(),
            self.ready.as_secs_f64(),
            self.taking.unwrap_or(self.elapsed).as_secs_f64(),
            self.steady_rate(),
            self.rows_per_snapshot,
            self.rss_kib as f64 / 1024.0,
            self.cpu_share() * 100.0
        )
    }
}

/// The device id the bench gives the device named `name`.
fn device_id(name: &str) -> String {
    format!("dev_bench_{}", &name[4..])
}

/// One CSV line a sample, in publish order per phase: the phase, ms after
/// its first publish the flip was published, the device, ms until its
/// `StatusChanged` arrived.
fn write_trace(path: &std::path::Path, phases: &[(&str, &Latency)]) -> anyhow::Result<()> {
    let mut out = String::from("phase,sent_ms,device_id,latency_ms\n");
    for (phase, l) in phases {
        for (at, id, ms) in &l.trace {
            out += &format!("{phase},{at:.3},{id},{ms:.3}\n");
        }
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// The report row of a latency phase's hub batches by stage.
fn stage_row(label: &str, l: &Latency) -> String {
    let names: Vec<&str> = l.stages.iter().map(|s| s.0.as_str()).collect();
    let of = |f: &dyn Fn(&Stage) -> f64| {
        l.stages
            .iter()
            .map(|s| format!("{:.1}", f(s)))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    format!(
        "| a hub batch in the latency phase, {label}, by stage ({}): mean ms; p99 at most (histogram bucket) | {}; {} over {} batches | - |\n",
        names.join(" / "),
        of(&|s| s.1),
        of(&|s| s.3),
        l.stages.iter().map(|s| s.2).max().unwrap_or(0)
    )
}

/// A stage of the hub's batches: name, mean ms, batches, p99 bucket ms.
type Stage = (String, f64, u64, f64);

struct Latency {
    /// Snapshots/s and flips/s sent, over the sending.
    rate: f64,
    flip_rate: f64,
    p50: f64,
    p99: f64,
    max: f64,
    rss_kib: u64,
    /// Per stage of the hub's `batch_seconds` over the phase: mean ms a
    /// batch, batches, and the bucket bound (ms) of 99 % of them.
    stages: Vec<Stage>,
    /// Per flip: ms after the first publish, device, latency ms.
    trace: Vec<(f64, String, f64)>,
}

/// One stage of the hub's `fleet_hub_batch_seconds` as its `/metrics`
/// text shows it: sum in seconds, count, and the cumulative buckets.
#[derive(Debug, Clone, Default, PartialEq)]
struct StageStats {
    sum: f64,
    count: f64,
    /// `(le, cumulative count)`, in the text's order (ascending `le`).
    buckets: Vec<(f64, f64)>,
}

impl StageStats {
    /// Mean ms a batch, batches, and the bucket bound (ms) under which 99 %
    /// of the batches fell, between `before` and `self`.
    fn since(&self, before: &StageStats) -> (f64, u64, f64) {
        let n = self.count - before.count;
        if n <= 0.0 {
            return (0.0, 0, 0.0);
        }
        let mean_ms = (self.sum - before.sum) / n * 1000.0;
        let p99_ms = self
            .buckets
            .iter()
            .map(|(le, c)| {
                let c0 = before
                    .buckets
                    .iter()
                    .find(|(l, _)| l == le)
                    .map_or(0.0, |b| b.1);
                (*le, c - c0)
            })
            .find(|(_, c)| *c >= 0.99 * n)
            .map_or(f64::INFINITY, |(le, _)| le * 1000.0);
        (mean_ms, n as u64, p99_ms)
    }
}

/// Per stage of the hub's `fleet_hub_batch_seconds`.
fn parse_stages(metrics: &str) -> BTreeMap<String, StageStats> {
    let mut out: BTreeMap<String, StageStats> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("fleet_hub_batch_seconds_") else {
            continue;
        };
        let Some((kind, rest)) = rest.split_once('{') else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let label = |name: &str| {
            labels.split(',').find_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                (k == name).then(|| v.trim_matches('"').to_string())
            })
        };
        let Some(stage) = label("stage") else {
            continue;
        };
        let e = out.entry(stage).or_default();
        match kind {
            "sum" => e.sum = value,
            "count" => e.count = value,
            "bucket" => {
                let le = match label("le").as_deref() {
                    Some("+Inf") => f64::INFINITY,
                    Some(l) => match l.parse() {
                        Ok(l) => l,
                        Err(_) => continue,
                    },
                    None => continue,
                };
                e.buckets.push((le, value));
            }
            _ => {}
        }
    }
    out
}

fn stop(hub: &mut Child) {
    // SIGTERM would be gentler, but the bench only needs the process gone;
    // its work is committed and acked already.
    let _ = hub.kill();
    let _ = hub.wait();
}

/// User plus system CPU seconds of a process so far.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Peak resident set (VmHWM) of a process, in KiB.
fn rss_peak_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A minimal HTTP/1.0 GET (no client library in the binary for this).
async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    Ok(buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_stages_are_read_from_the_hubs_metrics_text() {
        let text = "# HELP fleet_hub_batch_seconds Where a lane's batch spends its time.\n\
                    # TYPE fleet_hub_batch_seconds histogram\n\
                    fleet_hub_batch_seconds_sum{stage=\"apply\"} 1.5\n\
                    fleet_hub_batch_seconds_count{stage=\"apply\"} 100\n\
                    fleet_hub_batch_seconds_bucket{le=\"0.001\",stage=\"apply\"} 2\n\
                    fleet_hub_batch_seconds_bucket{stage=\"apply\",le=\"0.016\"} 98\n\
                    fleet_hub_batch_seconds_bucket{le=\"0.032\",stage=\"apply\"} 99\n\
                    fleet_hub_batch_seconds_bucket{le=\"+Inf\",stage=\"apply\"} 100\n\
                    fleet_hub_batch_seconds_sum{stage=\"wait\"} 0.6\n\
                    fleet_hub_batch_seconds_count{stage=\"wait\"} 30\n\
                    fleet_hub_batch_size_sum 12\n\
                    # EOF\n";
        let s = parse_stages(text);
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!((s["apply"].sum, s["apply"].count), (1.5, 100.0));
        assert_eq!(s["apply"].buckets.len(), 4);
        assert_eq!((s["wait"].sum, s["wait"].count), (0.6, 30.0));
        // Against nothing before: mean 15 ms; 99 of 100 under 32 ms.
        let (mean, n, p99) = s["apply"].since(&StageStats::default());
        assert_eq!((n, p99), (100, 32.0));
        assert!((mean - 15.0).abs() < 1e-9, "{mean}");
        // Against itself: no batches.
        assert_eq!(s["apply"].since(&s["apply"]), (0.0, 0, 0.0));
        assert!(parse_stages("garbage {stage=\"x\"} y\n").is_empty());
    }
}
