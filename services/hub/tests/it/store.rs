//! The hub's device write reads back as written: every column
//! `write_diffs` sets, the `text[]` ones with elements that need quoting in
//! PostgreSQL's array literals.

use chrono::{TimeZone, Utc};
use fleet_hub::store::devices;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_device_column_the_hub_writes_reads_back_as_written() {
    let (env, hub) = start().await;
    let ids = [
        env.create_device("s1", "gpu-store-01").await,
        env.create_device("s1", "gpu-store-02").await,
    ];
    let at = Utc.with_ymd_and_hms(2026, 12, 6, 23, 0, 0).unwrap();
    let mut tx = env.pool.begin().await.unwrap();
    let before = devices::lock_states(&mut tx, &ids).await.unwrap();
    let mut after = before.clone();
    let first = after.get_mut(&ids[0]).unwrap();
    let r = &mut first.record;
    r.version += 1;
    r.infrastructure_ref = Some("ironic-node-1".into());
    r.maintenance = true;
    r.maintenance_reason = Some(r#"a "quoted" reason \ with a backslash"#.into());
    r.cordoned = true;
    r.cordon_reason = Some("cordon, with a comma".into());
    r.draining = true;
    r.triage_ticket_url = Some("https://tickets.example/1".into());
    r.entered_triage_at = Some(at);
    r.taints = vec![
        "a,b".into(),
        r#"q"uote"#.into(),
        r"back\slash".into(),
        String::new(),
        "NULL".into(),
        "{brace}".into(),
        " spaced ".into(),
    ];
    r.no_schedule_reasons = vec!["unreachable".into(), "maintenance".into()];
    r.observed_generation = 7;
    r.identity_generation = 3;
    r.enrollment_proof_at = Some(at);
    r.failed_at = Some(at);
    r.mirrors.ironic_maintenance = Some(false);
    r.mirrors.ironic_lessee = Some("tenant-a".into());
    r.mirrors.slurm_states = vec!["IDLE".into(), "DRAIN".into()];
    r.mirrors.netbox_tags = vec!["gpu".into(), "rack 7".into()];
    r.session.epoch = 4;
    r.session.gateway_id = Some("gw-1".into());
    r.session.last_seen = Some(at);
    r.serial = Some("SN-1".into());
    r.rack = Some("r1".into());
    r.netbox_id = Some(42);
    // The second device's arrays emptied, its options left as they were.
    let second = after.get_mut(&ids[1]).unwrap();
    second.record.version += 1;
    second.record.no_schedule_reasons = vec![];
    let pairs: Vec<_> = ids.iter().map(|id| (&before[id], &after[id])).collect();
    let written = devices::write_diffs(&mut tx, &pairs, Utc::now(), &hub.deadlines)
        .await
        .unwrap();
    assert_eq!(written.devices, 2);
    tx.commit().await.unwrap();

    let mut tx = env.pool.begin().await.unwrap();
    let read = devices::locked_states(&mut tx, &ids).await.unwrap();
    for id in &ids {
        assert_eq!(
            read[id].record, after[id].record,
            "{id} reads back as written"
        );
    }
    assert_ne!(read[&ids[0]].record, before[&ids[0]].record);
    tx.rollback().await.unwrap();
    hub.stop(env).await;
}

/// The device `UPDATE` is planned for each batch and never kept as a
/// prepared statement, whose generic plan, made while `devices` was small,
/// could later scan the whole table for every row (`write_diffs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_update_is_never_a_prepared_statement() {
    use sqlx::Acquire;
    let (env, hub) = start().await;
    let id = env.create_device("s1", "gpu-store-03").await;
    let mut conn = env.pool.acquire().await.unwrap();
    // More than the five executions after which PostgreSQL may switch a
    // prepared statement to its generic plan.
    for _ in 0..8 {
        let mut tx = conn.begin().await.unwrap();
        let before = devices::lock_states(&mut tx, std::slice::from_ref(&id))
            .await
            .unwrap();
        let mut after = before.clone();
        let d = after.get_mut(&id).unwrap();
        d.record.version += 1;
        d.record.cordoned = !d.record.cordoned;
        let written = devices::write_diffs(
            &mut tx,
            &[(&before[&id], &after[&id])],
            Utc::now(),
            &hub.deadlines,
        )
        .await
        .unwrap();
        assert_eq!(written.devices, 1);
        tx.commit().await.unwrap();
    }
    let prepared: Vec<String> = sqlx::query_scalar("SELECT statement FROM pg_prepared_statements")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    let heads: Vec<String> = prepared
        .iter()
        .map(|s| s.chars().take(60).collect())
        .collect();
    assert!(
        prepared.iter().any(|s| s.contains("FOR NO KEY UPDATE")),
        "the lock read is prepared on this connection, so the check sees prepared statements: {heads:#?}"
    );
    assert!(
        !prepared
            .iter()
            .any(|s| s.starts_with("UPDATE devices d SET version")),
        "the device UPDATE was kept prepared: {heads:#?}"
    );
    drop(conn);
    hub.stop(env).await;
}

/// A NetBox id key resolves through `devices_netbox_id` (compared as a
/// number, issue 20) to the same devices it named when compared as text:
/// only the canonical decimal of a live device's id, never an error for a
/// key that is not a number. The one-statement resolve-and-lock answers
/// the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_netbox_id_key_names_the_device_with_that_id_and_nothing_else() {
    use fleet_domain::KeyKind;
    let (env, hub) = start().await;
    let id = env.create_device("s1", "gpu-store-04").await;
    let other = env.create_device("s2", "gpu-store-05").await;
    for (device, n) in [(&id, 101_i64), (&other, 101)] {
        sqlx::query("UPDATE devices SET netbox_id = $2 WHERE id = $1")
            .bind(device)
            .bind(n)
            .execute(&env.pool)
            .await
            .unwrap();
    }
    let key = |k: &str| ("s1".to_string(), k.to_string());
    let keys: Vec<(String, String)> = [
        "101",
        "0101",
        "+101",
        "101.0",
        " 101",
        "x1",
        "-101",
        "0",
        "99999999999999999999999",
        "",
    ]
    .into_iter()
    .map(key)
    .collect();
    let mut tx = env.pool.begin().await.unwrap();
    let found = devices::resolve(&mut tx, KeyKind::NetboxId, &keys)
        .await
        .unwrap();
    assert_eq!(found, vec![(key("101"), id.clone())]);
    let (locked, heads) = devices::resolve_and_lock_heads(
        &mut tx,
        KeyKind::NetboxId,
        &keys,
        &["netbox"],
        devices::HeldRows::Wait,
    )
    .await
    .unwrap();
    assert_eq!(locked, found);
    assert_eq!(heads.keys().collect::<Vec<_>>(), vec![&id]);
    tx.rollback().await.unwrap();
    hub.stop(env).await;
}

/// A sweep looks at the devices whose `sweep_at` passed without locking
/// the devices and without waiting for a writer: a `device_sweep` row a
/// lane holds (its transaction brings a source's first deadline, not yet
/// committed) is passed over, and the look neither waits for the lane nor
/// sets a later deadline over the one the lane brings; the next look sees
/// both sources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_passes_over_a_device_a_lane_is_writing() {
    let mut env = TestEnv::new().await;
    let ttl = |m: u64| std::time::Duration::from_secs(60 * m);
    env.common.freshness.ttl.insert("netbox".into(), ttl(60));
    env.common.freshness.ttl.insert("slurm".into(), ttl(10));
    let (hub, trigger, task) = start_hub(&env).await;
    let id = env.create_device("s1", "gpu-look-01").await;
    // The sweeper is stopped: this test is the only one that looks.
    stop(trigger, task).await;
    let t0 = micros(Utc::now());
    let fresh = |source: &'static str| {
        sqlx::query(
            "INSERT INTO device_source_freshness (device_id, source, observed_at, digest, received_at) \
             VALUES ($1, $2, $3, '\\x00', $3)",
        )
        .bind(id.clone())
        .bind(source)
        .bind(t0)
    };
    fresh("netbox").execute(&env.pool).await.unwrap();
    sqlx::query(
        "INSERT INTO device_sweep (device_id, sweep_at) VALUES ($1, now() - interval '1 second')",
    )
    .bind(&id)
    .execute(&env.pool)
    .await
    .unwrap();
    let slurm_silent = hub.deadlines.silence(fleet_domain::Source::Slurm, t0);
    let params = devices::SweepParams::new(&hub.deadlines);
    let sweep_at = || async {
        let at: chrono::DateTime<Utc> = scalar(
            &env,
            "SELECT sweep_at FROM device_sweep WHERE device_id = $1",
            &id,
        )
        .await;
        at
    };

    // The lane: SLURM's first row and the deadline it brings, not yet
    // committed.
    let mut lane = env.pool.begin().await.unwrap();
    fresh("slurm").execute(&mut *lane).await.unwrap();
    devices::lower_sweep(&mut lane, &[(id.as_str(), slurm_silent)])
        .await
        .unwrap();
    let looked = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        devices::look_for_sweep(&env.pool, 500, &params),
    )
    .await
    .expect("the look does not wait for the lane")
    .unwrap();
    assert_eq!(looked, vec![], "the held row is passed over");
    lane.commit().await.unwrap();
    assert!(sweep_at().await <= slurm_silent);

    // The next look sees both rows: SLURM's silence comes first.
    let looked = devices::look_for_sweep(&env.pool, 500, &params)
        .await
        .unwrap();
    assert_eq!(looked, vec![(id.clone(), false)], "looked at, nothing due");
    assert_eq!(sweep_at().await, slurm_silent);
    env.cleanup().await;
}

/// The hub's sessions run without JIT compilation (`connect_service`): a
/// short statement with a high estimate was compiled for seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_sessions_run_without_jit() {
    let (env, hub) = start().await;
    let jit: String = sqlx::query_scalar("SELECT current_setting('jit')")
        .fetch_one(&hub.deps.pool)
        .await
        .unwrap();
    assert_eq!(jit, "off");
    hub.stop(env).await;
}
