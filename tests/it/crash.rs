//! `spec/quality.md`: kill the hub with SIGKILL at random points while
//! snapshots stream in, restart it, three times; the final database equals
//! applying every snapshot once, the lifecycle log holds exactly the real
//! transitions, and `STATUS` holds no duplicate event. And the same checks
//! across a takeover: two replicas sharing the partitions by lease, one
//! killed mid-stream.

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use fleet_domain::state::{DeviceRecord, DeviceState, Ttls};
use fleet_proto::{v1, Message};
use rand::{Rng, SeedableRng};

use crate::support::*;

pub(crate) fn spawn_hub(env: &TestEnv, log: &std::path::Path, replica: &str) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    env.fleet_env(Command::new(env!("CARGO_BIN_EXE_fleet")).arg("hub"))
        .env(
            "FLEET__NATS__NUM_REPLICAS",
            env.common.nats.num_replicas.to_string(),
        )
        .env("FLEET__HUB__LISTEN", "127.0.0.1:0")
        // A restarted pod keeps its name and re-claims its leases at once.
        .env("FLEET__HUB__REPLICA", replica)
        .env("FLEET__HUB__LEASE_TTL", "3s")
        .env("FLEET__HUB__ACK_WAIT", "2s")
        .env("FLEET__HUB__BATCH_SIZE", "32")
        .env("FLEET__HUB__LINGER", "2ms")
        .env("FLEET__FRESHNESS__DEFAULT_TTL", "1day")
        .env("RUST_LOG", "warn,fleet_hub=info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn fleet hub")
}

/// Whether every hub consumer has delivered and had acked everything, and
/// the outbox is empty. A consumer's own state is what says so: a
/// replicated work-queue stream on nats-server 2.9 can go on counting
/// messages that every consumer has acked after a leader change
/// (nats-io/nats-server#3953, #5148), so the stream's count going to zero
/// is not waited for.
async fn drained(env: &TestEnv) -> bool {
    for p in 0..env.common.nats.partitions {
        for queue in fleet_bus::Queue::ALL {
            let Ok(stream) = env.js.get_stream(env.streams.observations(queue, p)).await else {
                return false;
            };
            let Ok(mut c) = stream
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>(&queue.consumer(p))
                .await
            else {
                return false;
            };
            match c.info().await {
                Ok(i) if i.num_pending == 0 && i.num_ack_pending == 0 => {}
                _ => return false,
            }
        }
    }
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    n == 0
}

/// Waits (up to 60 s: a loaded 2-core CI machine, a cluster electing
/// leaders) until [`drained`]; if not, fails with what was left: each
/// partition consumer's state, the outbox, the leases and the hubs' log.
async fn until_drained(env: &TestEnv, log: &std::path::Path, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        if drained(env).await {
            if let Ok(held) = fleet_bus::observations_held(&env.js, &env.common.nats).await {
                if held > 0 {
                    println!(
                        "{what}: every consumer acked all; the streams still count {held} messages"
                    );
                }
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut state = vec![];
    for (queue, p, name) in env.streams.observations_all(env.common.nats.partitions) {
        let Ok(mut stream) = env.js.get_stream(&name).await else {
            state.push(format!("{name}: no stream"));
            continue;
        };
        if let Ok(info) = stream.info().await {
            state.push(format!(
                "{name}: {} messages, first seq {}, last seq {}",
                info.state.messages, info.state.first_sequence, info.state.last_sequence
            ));
        }
        let consumer = queue.consumer(p);
        match stream
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>(&consumer)
            .await
        {
            Ok(mut c) => match c.info().await {
                Ok(i) => state.push(format!(
                    "{consumer}: pending {}, ack pending {}, redelivered {}, waiting {}, delivered {}, ack floor {}, leader {:?}",
                    i.num_pending,
                    i.num_ack_pending,
                    i.num_redelivered,
                    i.num_waiting,
                    i.delivered.stream_sequence,
                    i.ack_floor.stream_sequence,
                    i.cluster.as_ref().and_then(|c| c.leader.clone()),
                )),
                Err(e) => state.push(format!("{consumer}: info failed: {e}")),
            },
            Err(e) => state.push(format!("{consumer}: {e}")),
        }
    }
    let outbox: Result<i64, _> = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&env.pool)
        .await;
    state.push(format!("outbox rows: {outbox:?}"));
    let leases: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT replica, partition, epoch FROM hub_partition_leases ORDER BY partition",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap_or_default();
    state.push(format!("leases: {leases:?}"));
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(60).collect();
    panic!(
        "timed out waiting for {what}\n{}\n--- hubs' log (last 60 lines) ---\n{}",
        state.join("\n"),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

/// Which device each snapshot is of, in each device's time order.
pub(crate) type Plan = Vec<(usize, v1::ConditionSnapshot)>;

/// Per device, `per_device` openstack snapshots with random values, in
/// time order; and one interleaving of all of them that keeps each
/// device's own order.
pub(crate) fn plan_snapshots(
    seed: u64,
    devices: usize,
    per_device: usize,
) -> (Plan, Vec<v1::ConditionSnapshot>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let t0 = micros(Utc::now()) - chrono::Duration::seconds(600);
    // Per device, a sequence of openstack snapshots with random values.
    let mut plan: Vec<(usize, v1::ConditionSnapshot)> = vec![];
    for d in 0..devices {
        for k in 0..per_device {
            let b: Vec<bool> = (0..6).map(|_| rng.gen_bool(0.5)).collect();
            let at = t0 + chrono::Duration::seconds((k * 10) as i64);
            plan.push((
                d,
                openstack(
                    "s1",
                    &format!("gpu-x-{d:02}"),
                    at,
                    b[0] || b[1],
                    b[1] && b[2],
                    b[3],
                    b[4],
                    b[5],
                    b[2],
                ),
            ));
        }
    }
    // Interleave devices; each device's own snapshots stay in time order.
    let mut queues: Vec<Vec<v1::ConditionSnapshot>> = vec![vec![]; devices];
    for (d, s) in &plan {
        queues[*d].push(s.clone());
    }
    queues.iter_mut().for_each(|q| q.reverse());
    let mut order = vec![];
    while queues.iter().any(|q| !q.is_empty()) {
        let d = rng.gen_range(0..devices);
        if let Some(s) = queues[d].pop() {
            order.push(s);
        }
    }
    (plan, order)
}

/// Publishes `order`, a little at a time, so that kills land mid-stream.
pub(crate) fn publish_all(
    env: &TestEnv,
    order: Vec<v1::ConditionSnapshot>,
) -> tokio::task::JoinHandle<()> {
    {
        let js = env.js.clone();
        let subjects = env.subjects.clone();
        let partitions = env.common.nats.partitions;
        tokio::spawn(async move {
            for (i, s) in order.iter().enumerate() {
                let key = s.device.clone().unwrap();
                let at = fleet_connector::snapshot::observed_nanos(s);
                // As a connector does: a publish that fails (a NATS server
                // lost, a stream leader being elected) is sent again under
                // the same Nats-Msg-Id, which the stream deduplicates.
                let mut tries = 0;
                loop {
                    let sent = match fleet_bus::publish_observation(
                        &js,
                        &subjects,
                        partitions,
                        "openstack",
                        &key,
                        at,
                        "fleet.v1.ConditionSnapshot",
                        None,
                        s.encode_to_vec().into(),
                    )
                    .await
                    {
                        Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    match sent {
                        Ok(()) => break,
                        Err(e) => {
                            tries += 1;
                            assert!(tries < 150, "publish {i} failed {tries} times: {e}");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
                // Spread the stream over the kills below.
                if i % 4 == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        })
    }
}

/// Waits until every observation and outbox row is through, then checks
/// that the final database equals applying every snapshot once, in order:
/// status and conditions, the lifecycle log as the in-order history, and
/// one `StatusChanged` per lifecycle row with none twice.
pub(crate) async fn assert_applied_once(
    env: &TestEnv,
    ids: &[String],
    plan: &Plan,
    log: &std::path::Path,
) {
    until_drained(env, log, "the hub drained every observation and the outbox").await;
    // Redeliveries after the last kill arrive within ack_wait.
    tokio::time::sleep(Duration::from_secs(3)).await;
    until_drained(env, log, "drained again").await;

    // Expected: every snapshot applied once, in order, by the pure domain.
    let now = Utc::now();
    let ttls = Ttls::uniform(chrono::Duration::days(1));
    let mut expected_status: HashMap<String, Vec<String>> = HashMap::new();
    let mut expected: HashMap<String, DeviceState> = HashMap::new();
    for (d, id) in ids.iter().enumerate() {
        let mut rec = DeviceRecord::new(id.clone(), "s1".into(), format!("gpu-x-{d:02}"));
        rec.no_schedule_reasons = vec!["unreachable".into()];
        let mut s = DeviceState::new(rec);
        let mut seq = vec!["unknown".to_string()];
        for (pd, snap) in plan {
            if *pd != d {
                continue;
            }
            let (_, domain) = fleet_hub::decode::snapshot(snap, now).unwrap();
            s.apply_snapshot(&domain, now);
            s.reconcile(now, &ttls);
            seq.push(s.record.operational_status.to_string());
        }
        expected_status.insert(id.clone(), seq);
        expected.insert(id.clone(), s);
    }

    let lifecycle: Vec<(String, String)> =
        sqlx::query_as("SELECT device_id, value FROM device_lifecycle_events WHERE kind = 'operational' ORDER BY id")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    let mut by_device: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (id, v) in lifecycle {
        by_device.entry(id).or_default().push(v);
    }
    for id in ids {
        let want = &expected[id];
        let got_status = env.device_field(id, "operational_status").await;
        assert_eq!(
            got_status,
            want.record.operational_status.to_string(),
            "final status of {id}"
        );
        let conds: Vec<(String, String, bool)> =
            sqlx::query_as("SELECT type, status, decisive FROM device_conditions WHERE device_id = $1 ORDER BY type")
                .bind(id)
                .fetch_all(&env.pool)
                .await
                .unwrap();
        let mut want_conds: Vec<(String, String, bool)> = want
            .conditions
            .values()
            .map(|c| {
                (
                    c.condition_type.to_string(),
                    c.status.to_string(),
                    c.decisive,
                )
            })
            .collect();
        want_conds.sort();
        assert_eq!(conds, want_conds, "conditions of {id}");
        // The lifecycle log: every real transition of the in-order history,
        // each once, in order (birth row first), whatever the kills did.
        let rows = &by_device[id];
        let mut want_rows = expected_status[id].clone();
        want_rows.dedup();
        assert_eq!(
            rows, &want_rows,
            "{id}: the lifecycle log is not the in-order history"
        );
        assert_eq!(rows.last(), Some(&got_status));
    }

    // STATUS: one operational event (or birth) per lifecycle row, none twice.
    let mut seen: HashMap<(String, i64), usize> = HashMap::new();
    let mut total = 0;
    for e in read_status(env, &format!("{}.status.>", env.common.nats.subject_root)).await {
        // A birth (one `device` event) carries the operational birth row.
        if e.value_of("operational").is_none() {
            continue;
        }
        *seen.entry((e.device_id, e.version)).or_default() += 1;
        total += 1;
    }
    let dupes: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        dupes.is_empty(),
        "duplicate StatusChanged events: {dupes:?}"
    );
    let rows: usize = by_device.values().map(|v| v.len()).sum();
    assert_eq!(total, rows, "one operational event per lifecycle row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_points_loses_nothing_and_duplicates_nothing() {
    let env = TestEnv::new().await;
    let log = std::env::temp_dir().join(format!("{}-hub.log", env.db_name));
    let mut hub = Reaped::new(spawn_hub(&env, &log, "crash-hub"));

    let devices = 16;
    let mut ids = vec![];
    for i in 0..devices {
        ids.push(env.create_device("s1", &format!("gpu-x-{i:02}")).await);
    }
    let (plan, order) = plan_snapshots(0x5eed, devices, 20);
    let publisher = publish_all(&env, order);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..700))).await;
        hub.stop("KILL", Duration::from_secs(10)).await;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..300))).await;
        hub = Reaped::new(spawn_hub(&env, &log, "crash-hub"));
    }
    publisher.await.unwrap();
    assert_applied_once(&env, &ids, &plan, &log).await;
    drop(hub);
    let _ = std::fs::remove_file(&log);
    env.cleanup().await;
}

/// The partition leases that are live now, by replica.
pub(crate) async fn live_leases(env: &TestEnv) -> BTreeMap<String, Vec<i32>> {
    let rows: Vec<(String, i32)> = sqlx::query_as(
        "SELECT l.replica, l.partition FROM hub_partition_leases l
           JOIN hub_replicas r ON r.replica = l.replica
          WHERE r.expires_at > now() ORDER BY l.partition",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for (r, p) in rows {
        out.entry(r).or_default().push(p);
    }
    out
}

/// Issue 20, "Scale out": two hub replicas share the partitions through
/// their leases, without static assignment; one is killed with SIGKILL
/// mid-stream, the other takes its partitions over once their leases
/// expire (`hub.lease_ttl` 3 s here, plus at most a round), and every
/// observation is applied exactly once, in order, across the handover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_stream_loses_its_partitions_to_the_other() {
    let env = TestEnv::new().await;
    let log = std::env::temp_dir().join(format!("{}-hubs.log", env.db_name));
    let mut a = Reaped::new(spawn_hub(&env, &log, "replica-a"));
    let b = Reaped::new(spawn_hub(&env, &log, "replica-b"));
    let partitions = env.common.nats.partitions as usize;

    let devices = 16;
    let mut ids = vec![];
    for i in 0..devices {
        ids.push(env.create_device("s1", &format!("gpu-x-{i:02}")).await);
    }
    eventually("the two replicas share every partition", || async {
        let l = live_leases(&env).await;
        let held: usize = l.values().map(Vec::len).sum();
        (l.len() == 2 && held == partitions).then_some(())
    })
    .await;

    let (plan, order) = plan_snapshots(0x1ea5e, devices, 20);
    let publisher = publish_all(&env, order);
    tokio::time::sleep(Duration::from_millis(400)).await;
    a.stop("KILL", Duration::from_secs(10)).await;
    let killed = std::time::Instant::now();
    eventually("replica-b holds every partition", || async {
        let l = live_leases(&env).await;
        (l.len() == 1 && l.get("replica-b").map(Vec::len) == Some(partitions)).then_some(())
    })
    .await;
    let takeover = killed.elapsed();
    println!(
        "takeover of replica-a's partitions: {:.2} s after SIGKILL",
        takeover.as_secs_f64()
    );
    publisher.await.unwrap();
    assert_applied_once(&env, &ids, &plan, &log).await;
    let epochs: i64 = sqlx::query_scalar("SELECT max(epoch) FROM hub_partition_leases")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(epochs >= 2, "a taken-over lease carries a new epoch");
    drop(b);
    let _ = std::fs::remove_file(&log);
    env.cleanup().await;
}
