//! The placer against the real hub, NATS and PostgreSQL: concurrent
//! requesters while devices are cordoned, drained, failed and lost; the
//! capacity view; impairment; typed answers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use fleet_placer::AllocateRequest;
use fleet_placer_client::PlacerError;
use fleet_proto::{v1, Message};
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use v1::hub_command::Command as C;

use crate::support::*;

async fn version(env: &TestEnv, id: &str) -> i64 {
    sqlx::query_scalar("SELECT version FROM devices WHERE id = $1")
        .bind(id)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

/// A device command with the version just read, retried on CONFLICT.
async fn device_command(env: &TestEnv, verb: &str, id: &str, make: impl Fn(String) -> C) -> bool {
    for _ in 0..20 {
        let v = version(env, id).await;
        let r = env.command(verb, v, make(id.to_string())).await;
        match r
            .error
            .as_ref()
            .map(|e| fleet_proto::error_code_of(e.code).as_str_name())
        {
            None => return true,
            Some("CONFLICT") => continue,
            Some(other) => panic!("{verb} {id}: {other}"),
        }
    }
    false
}

/// Connectivity last seen 11 minutes ago: the hub's sweeper makes it `lost`.
async fn go_silent_long_ago(env: &TestEnv, id: &str, epoch: i64) {
    let at = Utc::now() - chrono::Duration::minutes(11);
    env.publish_connectivity(id, epoch, "opened", at).await;
}

/// Every `schedulable` event on STATUS: device -> [(version, bucket)].
async fn bucket_history(env: &TestEnv) -> BTreeMap<String, Vec<(i64, String)>> {
    let stream = env.js.get_stream(env.streams.status()).await.unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            filter_subject: env.subjects.status_axis("schedulable"),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut out: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(5000)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .unwrap();
        let mut n = 0;
        while let Some(Ok(m)) = batch.next().await {
            n += 1;
            let e = v1::StatusChanged::decode(m.payload.as_ref()).unwrap();
            out.entry(e.device_id).or_default().push((e.version, e.to));
        }
        if n == 0 {
            break;
        }
    }
    out
}

fn bucket_at(history: &BTreeMap<String, Vec<(i64, String)>>, device: &str, version: i64) -> String {
    // Seeded at version 1 as schedulable; each event names the bucket from
    // its version on.
    history
        .get(device)
        .and_then(|h| {
            h.iter()
                .filter(|(v, _)| *v <= version)
                .max_by_key(|(v, _)| *v)
        })
        .map(|(_, b)| b.clone())
        .unwrap_or_else(|| "schedulable".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requesters_never_double_book_while_devices_change_under_them() {
    let mut env = TestEnv::new().await;
    env.common.freshness.unreachable_after = std::time::Duration::from_secs(3600);
    let devices = 96;
    seed_pool(&env, "p1", devices, 8).await;
    let hub = RunningHub::start(&env).await;
    let (placer, placer_stop, placer_task) = start_placer(&env).await;
    let ids: Vec<String> = (0..devices).map(|i| format!("dev_p1_{i:05}")).collect();
    let names: Vec<String> = (0..devices).map(|i| format!("p1-gpu-{i}")).collect();

    let done = Arc::new(AtomicBool::new(false));
    let booked = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut requesters = vec![];
    for r in 0..16u64 {
        let client = client(&env);
        let (done, booked, refused) = (done.clone(), booked.clone(), refused.clone());
        requesters.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(r);
            let mut mine: Vec<String> = vec![];
            while !done.load(Ordering::Relaxed) {
                if !mine.is_empty() && rng.gen_bool(0.3) {
                    let id = mine.swap_remove(rng.gen_range(0..mine.len()));
                    client.release(&id, Some("t1")).await.expect("release");
                    continue;
                }
                let req = AllocateRequest {
                    tenant_id: "t1".into(),
                    pool_id: "p1".into(),
                    gpus: rng.gen_range(1..=12),
                    same_device: rng.gen_bool(0.3),
                    nvlink_domain: rng.gen_bool(0.2).then(|| "*".to_string()),
                    request_id: None,
                };
                match client.allocate(&req).await {
                    Ok(a) => {
                        assert_eq!(a.atoms.len() as u32, req.gpus);
                        if req.same_device {
                            let d: BTreeSet<_> = a.atoms.iter().map(|x| &x.device_id).collect();
                            assert_eq!(d.len(), 1, "same_device split: {a:?}");
                        }
                        booked.fetch_add(1, Ordering::Relaxed);
                        mine.push(a.id);
                    }
                    Err(PlacerError::InsufficientCapacity(_)) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => panic!("allocate: {e:?}"),
                }
            }
        }));
    }

    // Meanwhile: cordon, drain, uncordon, fail (Ironic) and lose devices.
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let (mut cordons, mut drains, mut fails, mut losses) = (0, 0, 0, 0);
    let mut lost: BTreeSet<usize> = BTreeSet::new();
    let t0 = micros(Utc::now());
    for round in 0..60 {
        let i = rng.gen_range(0..devices as usize);
        let id = &ids[i];
        match rng.gen_range(0..5) {
            0 => {
                if device_command(&env, "cordon", id, |d| {
                    C::Cordon(v1::Cordon {
                        device_id: d,
                        reason: "chaos".into(),
                    })
                })
                .await
                {
                    cordons += 1;
                }
            }
            1 => {
                if device_command(&env, "drain", id, |d| {
                    C::Drain(v1::Drain {
                        device_id: d,
                        reason: "chaos".into(),
                    })
                })
                .await
                {
                    drains += 1;
                }
            }
            2 => {
                device_command(&env, "uncordon", id, |d| {
                    C::Uncordon(v1::Uncordon { device_id: d })
                })
                .await;
            }
            3 => {
                let at = t0 + chrono::Duration::milliseconds(round);
                env.publish_snapshot(&openstack_as("s1", &names[i], at, Node::Failed))
                    .await;
                fails += 1;
            }
            _ => {
                if lost.insert(i) {
                    go_silent_long_ago(&env, id, 1).await;
                    losses += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done.store(true, Ordering::Relaxed);
    for r in requesters {
        r.await.unwrap();
    }
    let booked = booked.load(Ordering::Relaxed);
    assert!(booked > 200, "only {booked} allocations were booked");
    assert!(
        cordons + drains >= 10 && fails >= 5 && losses >= 5,
        "too little chaos: {cordons} {drains} {fails} {losses}"
    );

    // Zero double-booked atoms, and the index never had to refuse one.
    let doubles: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT device_id, atom FROM allocation_atoms WHERE released_at IS NULL \
         GROUP BY device_id, atom HAVING count(*) > 1) d",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(doubles, 0);
    assert_eq!(placer.metrics.double_booking_refused.get(), 0);
    let total_atoms: i64 = sqlx::query_scalar("SELECT count(*) FROM allocation_atoms")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(total_atoms as usize >= booked);

    // No atom was booked on a device that was unschedulable at the version
    // its transaction locked.
    outbox_drained(&env).await;
    let history = bucket_history(&env).await;
    let changed = history
        .values()
        .filter(|h| h.iter().any(|(_, b)| b != "schedulable"))
        .count();
    assert!(changed >= 10, "only {changed} devices changed bucket");
    let atoms: Vec<(String, i64)> =
        sqlx::query_as("SELECT device_id, device_version FROM allocation_atoms")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    for (device, v) in &atoms {
        let b = bucket_at(&history, device, *v);
        assert_eq!(
            b, "schedulable",
            "an atom was booked on {device} at version {v}, bucket {b}"
        );
    }

    // Capacity: the view converges to PostgreSQL and the buckets add up.
    let c = client(&env);
    let cap = eventually("the capacity view matches PostgreSQL", || async {
        let view = c.capacity("p1").await.unwrap();
        let db = placer.capacity_from_db("p1").await.unwrap();
        (view == db).then_some(view)
    })
    .await;
    assert_eq!(cap.total, devices as i64 * 8);
    assert_eq!(cap.bucket_sum(), cap.total);
    assert!(cap.maintenance > 0 && cap.unreachable > 0, "{cap:?}");
    let active_on_schedulable: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM allocation_atoms a JOIN devices d ON d.id = a.device_id \
         WHERE a.released_at IS NULL AND d.capacity_bucket = 'schedulable'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(cap.schedulable_allocated, active_on_schedulable);

    // Impaired: allocations on lost or failed devices made before the change.
    let impaired: i64 =
        sqlx::query_scalar("SELECT count(*) FROM allocations WHERE status = 'impaired'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert!(impaired > 0, "no allocation was impaired");

    // A new placer rebuilds the same view from PostgreSQL.
    stop(placer_stop, placer_task).await;
    let (placer2, placer_stop, placer_task) = start_placer(&env).await;
    assert_eq!(
        placer2.capacity("p1").await.unwrap(),
        placer2.capacity_from_db("p1").await.unwrap()
    );

    stop(placer_stop, placer_task).await;
    hub.stop(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_lost_devices_impair_their_allocations_and_publish_events() {
    let env = TestEnv::new().await;
    seed_pool(&env, "p1", 3, 8).await;
    let hub = RunningHub::start(&env).await;
    let (_placer, placer_stop, placer_task) = start_placer(&env).await;
    let c = client(&env);
    let mut by_device = BTreeMap::new();
    for _ in 0..3 {
        let a = c
            .allocate(&AllocateRequest {
                tenant_id: "t1".into(),
                pool_id: "p1".into(),
                gpus: 8,
                same_device: true,
                nvlink_domain: None,
                request_id: None,
            })
            .await
            .unwrap();
        by_device.insert(a.atoms[0].device_id.clone(), a);
    }
    assert_eq!(by_device.len(), 3, "one whole device each");
    // The pool is full now.
    let full = c
        .allocate(&AllocateRequest {
            tenant_id: "t1".into(),
            pool_id: "p1".into(),
            gpus: 1,
            same_device: false,
            nvlink_domain: None,
            request_id: None,
        })
        .await;
    assert!(
        matches!(full, Err(PlacerError::InsufficientCapacity(_))),
        "{full:?}"
    );

    env.publish_snapshot(&openstack_as(
        "s1",
        "p1-gpu-0",
        micros(Utc::now()),
        Node::Failed,
    ))
    .await;
    go_silent_long_ago(&env, "dev_p1_00001", 1).await;

    let rows = eventually("two allocations impaired", || async {
        let rows: Vec<(String, String, Option<String>)> =
            sqlx::query_as("SELECT id, status, impaired_reason FROM allocations ORDER BY id")
                .fetch_all(&env.pool)
                .await
                .unwrap();
        (rows.iter().filter(|r| r.1 == "impaired").count() == 2).then_some(rows)
    })
    .await;
    let status = |dev: &str| {
        let id = &by_device[dev].id;
        rows.iter()
            .find(|r| &r.0 == id)
            .map(|r| (r.1.clone(), r.2.clone()))
            .unwrap()
    };
    assert_eq!(
        status("dev_p1_00000"),
        ("impaired".into(), Some("operational:failed".into()))
    );
    assert_eq!(
        status("dev_p1_00001"),
        ("impaired".into(), Some("connectivity:lost".into()))
    );
    assert_eq!(status("dev_p1_00002").0, "active");
    // Nothing was moved: the atoms stay where they were booked.
    let a = c.get(&by_device["dev_p1_00000"].id).await.unwrap();
    assert_eq!(a.atoms, by_device["dev_p1_00000"].atoms);
    assert_eq!(a.status, "impaired");

    // One event each on the placer's stream.
    let stream = env
        .js
        .get_stream(fleet_placer::events_stream(&env.streams))
        .await
        .unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config::default())
        .await
        .unwrap();
    // Events fetched by earlier polls stay delivered (unacked), so a later
    // poll returns only the newer ones: collect across polls.
    let seen = std::sync::Mutex::new(Vec::new());
    let events = eventually("two impairment events", || async {
        let mut batch = consumer.fetch().max_messages(100).messages().await.unwrap();
        let mut out = vec![];
        while let Some(Ok(m)) = batch.next().await {
            let schema = m
                .headers
                .as_ref()
                .and_then(|h| h.get(fleet_bus::HEADER_SCHEMA))
                .map(|v| v.to_string());
            assert_eq!(schema.as_deref(), Some("fleet.v1.AllocationEvent"));
            out.push(v1::AllocationEvent::decode(m.payload.as_ref()).unwrap());
        }
        let mut seen = seen.lock().unwrap();
        seen.extend(out);
        (seen.len() >= 2).then(|| seen.clone())
    })
    .await;
    let mut kinds: Vec<(String, String)> = events
        .iter()
        .map(|e| (e.device_id.clone(), e.reason.clone()))
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        vec![
            ("dev_p1_00000".into(), "operational:failed".into()),
            ("dev_p1_00001".into(), "connectivity:lost".into())
        ]
    );
    assert!(events
        .iter()
        .all(|e| e.kind == "impaired" && e.tenant_id == "t1"));

    // The lost device's GPUs move to the unreachable bucket.
    eventually("capacity shows the lost device", || async {
        let cap = c.capacity("p1").await.unwrap();
        (cap.unreachable == 8 && cap.schedulable_allocated == 16 && cap.bucket_sum() == 24)
            .then_some(())
    })
    .await;

    stop(placer_stop, placer_task).await;
    hub.stop(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_packed_constrained_idempotent_and_typed() {
    let env = TestEnv::new().await;
    seed_pool(&env, "p1", 8, 4).await;
    sqlx::query("INSERT INTO pools (id, site_id, kind, owner_tenant_id) VALUES ('p-t2', 's1', 'custom', 't2')")
        .execute(&env.pool)
        .await
        .unwrap();
    let (_placer, placer_stop, placer_task) = start_placer(&env).await;
    let c = client(&env);
    let req = |gpus: u32, same_device: bool, domain: Option<&str>| AllocateRequest {
        tenant_id: "t1".into(),
        pool_id: "p1".into(),
        gpus,
        same_device,
        nvlink_domain: domain.map(str::to_string),
        request_id: None,
    };

    // "fill partly used devices first": a second GPU lands next to the first.
    let a = c.allocate(&req(1, false, None)).await.unwrap();
    let b = c.allocate(&req(1, false, None)).await.unwrap();
    assert_eq!(a.atoms[0].device_id, b.atoms[0].device_id);
    assert_ne!(a.atoms[0].atom, b.atoms[0].atom);
    // A whole device, and a named NVLink domain (devices 4..7 are nvl-1).
    let d = c.allocate(&req(4, true, None)).await.unwrap();
    assert_eq!(
        d.atoms
            .iter()
            .map(|x| &x.device_id)
            .collect::<BTreeSet<_>>()
            .len(),
        1
    );
    let n = c.allocate(&req(8, false, Some("nvl-1"))).await.unwrap();
    let in_domain: Vec<String> =
        sqlx::query_scalar("SELECT labels->>'nvlink_domain' FROM devices WHERE id = ANY($1)")
            .bind(
                n.atoms
                    .iter()
                    .map(|x| x.device_id.clone())
                    .collect::<Vec<_>>(),
            )
            .fetch_all(&env.pool)
            .await
            .unwrap();
    assert!(in_domain.iter().all(|d| d == "nvl-1"), "{in_domain:?}");
    // "*": 4 more in one domain; none holds 9 free.
    assert!(c.allocate(&req(4, false, Some("*"))).await.is_ok());
    assert!(matches!(
        c.allocate(&req(9, false, Some("*"))).await,
        Err(PlacerError::InsufficientCapacity(_))
    ));
    assert!(matches!(
        c.allocate(&req(5, true, None)).await,
        Err(PlacerError::InsufficientCapacity(_))
    ));

    // Idempotency: the same request_id answers the first allocation.
    let mut r = req(2, false, None);
    r.request_id = Some("req-1".into());
    let first = c.allocate(&r).await.unwrap();
    let again = c.allocate(&r).await.unwrap();
    assert_eq!(first.id, again.id);

    // Release frees the atoms; twice is fine; another tenant's is not found.
    assert!(matches!(
        c.release(&first.id, Some("t2")).await,
        Err(PlacerError::NotFound(_))
    ));
    let released = c.release(&first.id, Some("t1")).await.unwrap();
    assert_eq!(released.status, "released");
    assert!(released.released_at.is_some());
    assert_eq!(c.release(&first.id, None).await.unwrap().status, "released");
    let booked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM allocation_atoms WHERE allocation_id = $1 AND released_at IS NULL",
    )
    .bind(&first.id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(booked, 0);

    // Typed errors.
    let mut bad = req(0, false, None);
    assert!(matches!(
        c.allocate(&bad).await,
        Err(PlacerError::InvalidArgument(_))
    ));
    bad.gpus = 1;
    bad.pool_id = "nope".into();
    assert!(matches!(
        c.allocate(&bad).await,
        Err(PlacerError::NotFound(_))
    ));
    bad.pool_id = "p-t2".into();
    assert!(matches!(
        c.allocate(&bad).await,
        Err(PlacerError::Forbidden(_))
    ));
    bad.pool_id = "p1".into();
    bad.tenant_id = "ghost".into();
    assert!(matches!(
        c.allocate(&bad).await,
        Err(PlacerError::NotFound(_))
    ));
    assert!(matches!(
        c.capacity("nope").await,
        Err(PlacerError::NotFound(_))
    ));
    // Garbage on the wire is a typed error, not a crash.
    let reply = env
        .nats
        .request(
            env.subjects.placer_cmd("allocate"),
            vec![0xff, 0xff, 0x01].into(),
        )
        .await
        .unwrap();
    let reply = v1::PlacerReply::decode(reply.payload.as_ref()).unwrap();
    assert_eq!(
        reply.error.unwrap().code(),
        fleet_proto::ErrorCode::InvalidArgument
    );
    let reply = env
        .nats
        .request(env.subjects.placer_cmd("explode"), vec![].into())
        .await
        .unwrap();
    assert_eq!(
        v1::PlacerReply::decode(reply.payload.as_ref())
            .unwrap()
            .error
            .unwrap()
            .code(),
        fleet_proto::ErrorCode::InvalidArgument
    );

    let cap = c.capacity("p1").await.unwrap();
    assert_eq!(cap.total, 32);
    assert_eq!(cap.schedulable_allocated, 1 + 1 + 4 + 8 + 4);
    assert_eq!(cap.bucket_sum(), 32);

    stop(placer_stop, placer_task).await;
    env.cleanup().await;
}
