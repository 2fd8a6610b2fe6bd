//! End to end through NATS, the hub and PostgreSQL.

use std::time::Duration;

use chrono::Utc;
use fleet_proto::{v1, Message};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_derives_status_with_decisive_rows_lifecycle_and_one_event() {
    let (env, hub) = start().await;
    let id = env.create_device("s1", "gpu-a1-01").await;

    let t0 = micros(Utc::now());
    let snap = |at| openstack_as("s1", "gpu-a1-01", at, Node::InUse);
    env.publish_snapshot(&snap(t0)).await;
    eventually_field(&env, &id, "operational_status", "in_use").await;

    let decisive: Vec<String> = scalars(
        &env,
        "SELECT type FROM device_conditions WHERE device_id = $1 AND decisive ORDER BY type",
        &id,
    )
    .await;
    assert_eq!(decisive, vec!["CustomerReady", "InstanceAllocated"]);
    let stored: i64 = scalar(
        &env,
        "SELECT count(*) FROM device_conditions WHERE device_id = $1",
        &id,
    )
    .await;
    assert_eq!(stored, 6, "the six openstack conditions");

    // A freshness-only resync changes nothing but the freshness row.
    let version = env.device_field(&id, "version").await;
    env.publish_snapshot(&snap(t0 + chrono::Duration::seconds(30)))
        .await;
    eventually("freshness moved", || async {
        let f = observed_at(&env, &id, "openstack").await;
        (f == Some(t0 + chrono::Duration::seconds(30))).then_some(())
    })
    .await;
    assert_eq!(
        env.device_field(&id, "version").await,
        version,
        "a freshness-only resync does not bump version"
    );

    let lifecycle: Vec<(String, String)> = rows(
        &env,
        "SELECT kind, value FROM device_lifecycle_events WHERE device_id = $1 AND kind = 'operational' ORDER BY id",
        &id,
    )
    .await;
    assert_eq!(
        lifecycle,
        vec![
            ("operational".into(), "unknown".into()),
            ("operational".into(), "in_use".into())
        ]
    );

    // Contract v2 (status.proto): the birth is one `device` event; the
    // snapshot's transaction is one event per axis that changed and one
    // `conditions` event listing all six conditions.
    let events = eventually("the birth and the snapshot's events on STATUS", || async {
        let ev = status_events(&env, &id).await;
        ev.iter().any(|e| e.axis == "conditions").then_some(ev)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = status_events(&env, &id).await;
    assert_eq!(again.len(), events.len(), "no duplicate events");
    assert!(events
        .iter()
        .all(|e| e.schema_version == fleet_proto::STATUS_SCHEMA_VERSION));
    let births: Vec<&v1::StatusChanged> = events.iter().filter(|e| e.is_birth()).collect();
    assert_eq!(births.len(), 1, "a birth is one event: {events:?}");
    assert_eq!(births[0].version, 1);
    assert_eq!(births[0].value_of("operational"), Some("unknown"));
    assert_eq!(births[0].axes.len(), 16, "every tracked axis's first value");
    let mut axes: Vec<&str> = events.iter().map(|e| e.axis.as_str()).collect();
    axes.sort();
    let before = axes.len();
    axes.dedup();
    assert_eq!(axes.len(), before, "at most one event per axis: {events:?}");
    let change = events
        .iter()
        .find(|e| e.axis == "operational")
        .expect("the operational change");
    assert_eq!(
        (change.from_value.as_str(), change.to.as_str()),
        ("unknown", "in_use")
    );
    assert_eq!(change.decisive, vec!["CustomerReady", "InstanceAllocated"]);
    assert_eq!(change.cause, "source:openstack");
    let conditions = events
        .iter()
        .find(|e| e.axis == "conditions")
        .expect("the conditions event");
    assert_eq!(conditions.conditions.len(), 6, "{conditions:?}");
    assert!(conditions
        .conditions
        .iter()
        .all(|c| c.from_status.is_empty() && !c.to_status.is_empty()));
    assert_eq!(conditions.version, change.version, "one transaction");

    hub.stop(env).await;
}

/// The fast path (`fleet_domain::state::confirm`) end to end: a repeated
/// snapshot moves only the freshness row without loading the device; a
/// single write to a row the source owns makes the next snapshot go the
/// full way, which puts the snapshot's value back.
/// Issue 20: "StatusChanged events per device from creation through the
/// first snapshot of each of six sources ... <= 15". Contract v2 publishes
/// the birth as one event and each snapshot's condition changes as one; the
/// count the v1 contract would have published for the same transactions
/// (a birth event per axis, an event per condition) is derived from the
/// same events and printed beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_born_and_read_by_six_sources_is_at_most_fifteen_events() {
    let (env, hub) = start().await;
    let id = env.create_device("s1", "gpu-six-01").await;
    let t0 = micros(Utc::now());
    let at = |s: i64| t0 + chrono::Duration::seconds(s);
    let health: Vec<v1::Condition> = [
        "ChassisHealth",
        "PowerSupplyHealth",
        "FanHealth",
        "ThermalHealth",
        "MemoryHealth",
        "StorageHealth",
        "ProcessorHealth",
        "NetworkAdapterHealth",
        "GpuHealth",
        "FpgaHealth",
    ]
    .iter()
    .map(|t| cond(t, "True", "Ok"))
    .collect();
    let snapshots = vec![
        openstack_as("s1", "gpu-six-01", at(1), Node::Available),
        snapshot(
            "slurm",
            "s1",
            "name",
            "gpu-six-01",
            at(2),
            vec![
                cond("SlurmRegistered", "True", "Registered"),
                cond("SlurmNodeHealthy", "True", "Idle"),
            ],
        ),
        snapshot("health-status", "s1", "name", "gpu-six-01", at(3), health),
        snapshot(
            "frontend-fabric",
            "s1",
            "name",
            "gpu-six-01",
            at(4),
            vec![cond(
                "FrontendPortsObservedInCustomerVrf",
                "False",
                "NotInCustomerVrf",
            )],
        ),
        snapshot(
            "backend-fabric",
            "s1",
            "name",
            "gpu-six-01",
            at(5),
            vec![cond(
                "BackendPortsObservedInMaintenanceVrf",
                "False",
                "NotInMaintenanceVrf",
            )],
        ),
        snapshot(
            "nvlink-fabric",
            "s1",
            "name",
            "gpu-six-01",
            at(6),
            vec![cond(
                "NvLinkGpusObservedInRepairPartition",
                "False",
                "NotInRepairPartition",
            )],
        ),
    ];
    for s in &snapshots {
        env.publish_snapshot(s).await;
    }
    eventually_count(
        &env,
        "every source's snapshot applied",
        "SELECT count(*) FROM device_source_freshness WHERE device_id = $1",
        &id,
        6,
    )
    .await;
    outbox_drained(&env).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let events = status_events(&env, &id).await;
    let conditions: usize = events.iter().map(|e| e.conditions.len()).sum();
    assert_eq!(conditions, 6 + 2 + 10 + 3, "every condition listed once");
    let v1: usize = events
        .iter()
        .map(|e| {
            if e.is_birth() {
                e.axes.len() + e.conditions.len()
            } else if e.axis == "conditions" {
                e.conditions.len()
            } else {
                1
            }
        })
        .sum();
    println!(
        "StatusChanged events from creation through the first snapshot of six sources: {} (contract v1 for the same transactions: {v1}): {:?}",
        events.len(),
        events.iter().map(|e| &e.axis).collect::<Vec<_>>()
    );
    assert!(
        events.len() <= 15,
        "{} events: {:?}",
        events.len(),
        events.iter().map(|e| &e.axis).collect::<Vec<_>>()
    );
    assert_eq!(
        events.iter().filter(|e| e.axis == "conditions").count(),
        6,
        "one conditions event per source's transaction"
    );
    hub.stop(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_snapshot_is_confirmed_and_a_single_write_is_not_lost() {
    let (env, hub) = start().await;
    let id = env.create_device("s1", "gpu-fast-01").await;
    let t0 = micros(Utc::now()) - chrono::Duration::seconds(60);
    let snap = |at| openstack_as("s1", "gpu-fast-01", at, Node::InUse);
    let freshness = || {
        optional_row::<(chrono::DateTime<Utc>, i64)>(
            &env,
            "SELECT observed_at, settled_version FROM device_source_freshness WHERE device_id = $1 AND source = 'openstack'",
            &id,
        )
    };
    let maintenance_row = || {
        row::<(String, chrono::DateTime<Utc>)>(
            &env,
            "SELECT status, received_at FROM device_conditions WHERE device_id = $1 AND type = 'IronicMaintenance'",
            &id,
        )
    };

    env.publish_snapshot(&snap(t0)).await;
    let version: i64 = env.device_field(&id, "version").await.parse().unwrap();
    let settled = eventually("the first snapshot settles", || async {
        let (at, settled) = freshness().await?;
        let version: i64 = env.device_field(&id, "version").await.parse().unwrap();
        (at == t0 && settled == version).then_some(settled)
    })
    .await;
    assert!(settled >= version);
    let confirmed = hub.metrics.confirmed.get();
    let (_, received) = maintenance_row().await;

    // Same content, later: confirmed from the freshness row alone.
    env.publish_snapshot(&snap(t0 + chrono::Duration::seconds(10)))
        .await;
    eventually("the resync is confirmed", || async {
        let (at, _) = freshness().await?;
        (at == t0 + chrono::Duration::seconds(10)).then_some(())
    })
    .await;
    assert_eq!(hub.metrics.confirmed.get(), confirmed + 1);
    assert_eq!(maintenance_row().await.1, received, "rows untouched");
    assert_eq!(freshness().await.unwrap().1, settled);

    // A single write by openstack to a row its snapshots own.
    let write = write_condition(
        "openstack",
        &id,
        cond("IronicMaintenance", "True", "SetByHand"),
        t0 + chrono::Duration::seconds(15),
    );
    let r = env.command("write_condition", 0, write).await;
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(maintenance_row().await.0, "True");
    assert_eq!(
        freshness().await.unwrap().1,
        0,
        "the freshness row no longer vouches for the rows"
    );

    // The same content again must be applied in full: the write is undone
    // by the later snapshot, as in-order application says.
    env.publish_snapshot(&snap(t0 + chrono::Duration::seconds(20)))
        .await;
    eventually("the snapshot is applied in full", || async {
        (maintenance_row().await.0 == "False").then_some(())
    })
    .await;
    assert_eq!(hub.metrics.confirmed.get(), confirmed + 1, "not confirmed");
    let (_, settled_again) = freshness().await.unwrap();
    assert_eq!(
        settled_again.to_string(),
        env.device_field(&id, "version").await,
        "settled again at the device's version"
    );

    // A session opening bumps the version but writes nothing the snapshot
    // owns: the settledness moves along and the next resync is confirmed.
    env.publish_connectivity(&id, 1, "opened", t0 + chrono::Duration::seconds(25))
        .await;
    eventually_field(&env, &id, "connectivity", "connected").await;
    let opened: i64 = env.device_field(&id, "version").await.parse().unwrap();
    assert!(opened > settled_again, "opening bumped the version");
    assert_eq!(
        freshness().await.unwrap().1,
        opened,
        "settled at the new version"
    );
    env.publish_snapshot(&snap(t0 + chrono::Duration::seconds(30)))
        .await;
    eventually("the resync after the opening is confirmed", || async {
        let (at, _) = freshness().await?;
        (at == t0 + chrono::Duration::seconds(30)).then_some(())
    })
    .await;
    assert_eq!(hub.metrics.confirmed.get(), confirmed + 2, "confirmed");

    hub.stop_unchecked(env).await;
}

/// The heartbeat fast path end to end: a heartbeat of the live session
/// moves only `session_last_seen` (no version bump) without loading the
/// device; a close goes the full way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_of_the_live_session_only_moves_last_seen() {
    let (env, hub) = start().await;
    let id = env.create_device("s1", "gpu-hb-01").await;
    let t0 = micros(Utc::now()) - chrono::Duration::seconds(30);
    let last_seen = || {
        scalar::<Option<chrono::DateTime<Utc>>>(
            &env,
            "SELECT session_last_seen FROM devices WHERE id = $1",
            &id,
        )
    };
    env.publish_connectivity(&id, 1, "opened", t0).await;
    eventually_field(&env, &id, "connectivity", "connected").await;
    let version = env.device_field(&id, "version").await;
    let confirmed = hub.metrics.confirmed.get();

    for k in 1..=3 {
        let at = t0 + chrono::Duration::seconds(5 * k);
        env.publish_connectivity(&id, 1, "heartbeat", at).await;
        eventually("last seen moved", || async {
            (last_seen().await == Some(at)).then_some(())
        })
        .await;
    }
    assert_eq!(
        hub.metrics.confirmed.get(),
        confirmed + 3,
        "three heartbeats confirmed"
    );
    assert_eq!(
        env.device_field(&id, "version").await,
        version,
        "a heartbeat does not bump version"
    );
    // An older heartbeat is stale: nothing moves back.
    env.publish_connectivity(&id, 1, "heartbeat", t0 + chrono::Duration::seconds(1))
        .await;
    // A close is not a heartbeat: applied in full.
    env.publish_connectivity(&id, 1, "closed", t0 + chrono::Duration::seconds(20))
        .await;
    eventually_field(&env, &id, "connectivity", "disconnected").await;
    assert_eq!(last_seen().await, Some(t0 + chrono::Duration::seconds(20)));
    assert_eq!(hub.metrics.confirmed.get(), confirmed + 3);
    assert_ne!(
        env.device_field(&id, "version").await,
        version,
        "closing changed connectivity"
    );

    hub.stop_unchecked(env).await;
}

/// Writers publish their own rows right after their commit, and the relay
/// publishes what none did (here a row as a writer that died between its
/// commit and its publish leaves it): every row reaches STATUS exactly once
/// (the hub's published counter equals the messages in the stream; a
/// second publish would be counted and then dropped by the stream's
/// duplicate window) and the outbox ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_what_no_writer_did_and_nothing_twice() {
    let (env, hub) = start().await;
    for n in 0..3 {
        env.create_device("s1", &format!("gpu-r-{n:02}")).await;
    }
    let orphan = v1::StatusChanged {
        device_id: "dev_orphan".into(),
        site: "s1".into(),
        axis: "cordoned".into(),
        from_value: "false".into(),
        to: "true".into(),
        version: 7,
        ..Default::default()
    };
    sqlx::query("INSERT INTO outbox (subject, schema, payload) VALUES ($1, $2, $3)")
        .bind(env.subjects.status("cordoned", "s1", "dev_orphan"))
        .bind(fleet_proto::schema::<v1::StatusChanged>())
        .bind(orphan.encode_to_vec())
        .execute(&env.pool)
        .await
        .unwrap();
    let seen = eventually("the relay publishes the orphan row", || async {
        let e = status_events(&env, "dev_orphan").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(seen, vec![orphan]);
    outbox_drained(&env).await;
    // Past the relay's age and scan interval: a second publish would
    // have happened by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut stream = env.js.get_stream(env.streams.status()).await.unwrap();
    let in_stream = stream.info().await.unwrap().state.messages;
    assert_eq!(in_stream, 3 + 1, "a birth event per device and the orphan");
    assert_eq!(hub.metrics.outbox_published.get(), in_stream);
    hub.stop(env).await;
}
