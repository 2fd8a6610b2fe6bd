//! Radar against the real hub, NATS and PostgreSQL: every row of the
//! mapping table, inventory-only devices, tenant opt-out with one
//! tombstone per device, deleted devices, and a new reader getting the
//! whole fleet from the stream.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use fleet_proto::{v1, Message};
use fleet_radar::Radar;
use fleet_runtime::Shutdown;
use futures::StreamExt;
use v1::hub_command::Command as C;

use crate::support::*;

async fn start_radar(
    env: &TestEnv,
    resync_secs: u64,
) -> (
    Arc<Radar>,
    fleet_runtime::shutdown::ShutdownTrigger,
    tokio::task::JoinHandle<()>,
) {
    let config = fleet_radar::Config {
        listen: "127.0.0.1:0".into(),
        resync_interval: Duration::from_secs(resync_secs),
        ..Default::default()
    };
    let radar = Radar::connect(env.common.clone(), config)
        .await
        .expect("radar connects");
    let (trigger, shutdown) = Shutdown::new();
    let r = radar.clone();
    let task = tokio::spawn(async move {
        fleet_radar::run_with(r, shutdown)
            .await
            .expect("radar runs");
    });
    eventually("radar answers", || async {
        let probe = v1::RadarIgnore::default();
        env.nats
            .request(
                env.subjects.radar_cmd("radar_ignore"),
                probe.encode_to_vec().into(),
            )
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    (radar, trigger, task)
}

/// What a new Radar reader gets: the last message of every subject.
async fn read_fleet(env: &TestEnv) -> BTreeMap<String, v1::RadarProjection> {
    let stream = env.js.get_stream(env.streams.radar()).await.unwrap();
    let c = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::LastPerSubject,
            filter_subject: env.subjects.radar_all(),
            ..Default::default()
        })
        .await
        .unwrap();
    // Exactly what the stream held when the reader was created: the last
    // message of every subject (later ones would follow it).
    let held = c.cached_info().num_pending as usize;
    let mut out = BTreeMap::new();
    if held == 0 {
        return out;
    }
    let mut batch = c
        .fetch()
        .max_messages(held)
        .expires(Duration::from_secs(2))
        .messages()
        .await
        .unwrap();
    while let Some(Ok(m)) = batch.next().await {
        let schema = m
            .headers
            .as_ref()
            .and_then(|h| h.get(fleet_bus::HEADER_SCHEMA))
            .map(|v| v.to_string());
        assert_eq!(schema.as_deref(), Some("fleet.v1.RadarProjection"));
        let p = v1::RadarProjection::decode(m.payload.as_ref()).unwrap();
        assert_eq!(
            m.subject.as_str(),
            env.subjects.radar(&p.site, &p.device_id)
        );
        // A projection published while this reader reads follows the
        // one it replaces: the later one wins, as for any reader.
        out.insert(p.device_id.clone(), p);
    }
    out
}

async fn create(env: &TestEnv, site: &str, name: &str, inventory: &str, owner: &str) -> String {
    let r = env
        .command(
            "create_device",
            0,
            C::CreateDevice(v1::CreateDevice {
                site: site.into(),
                name: name.into(),
                inventory_status: inventory.into(),
                owner_tenant_id: owner.into(),
                ..Default::default()
            }),
        )
        .await;
    assert!(r.error.is_none(), "create {name}: {:?}", r.error);
    device_of(&r).id
}

fn with_mirror(
    mut s: v1::ConditionSnapshot,
    m: v1::condition_snapshot::Mirror,
) -> v1::ConditionSnapshot {
    s.mirror = Some(m);
    s
}

fn chassis(name: &str, value: &str) -> v1::ConditionSnapshot {
    with_mirror(
        snapshot(
            "health-status",
            "s1",
            "name",
            name,
            micros(Utc::now()),
            vec![],
        ),
        v1::condition_snapshot::Mirror::Health(v1::HealthMirror {
            chassis_health: value.into(),
        }),
    )
}

fn custody(name: &str, state: &str) -> v1::ConditionSnapshot {
    with_mirror(
        snapshot("borneo", "s1", "name", name, micros(Utc::now()), vec![]),
        v1::condition_snapshot::Mirror::Custody(v1::CustodyMirror {
            state: state.into(),
            state_changed_at: None,
            credential_ref: String::new(),
        }),
    )
}

async fn version(env: &TestEnv, id: &str) -> i64 {
    sqlx::query_scalar("SELECT version FROM devices WHERE id = $1")
        .bind(id)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

async fn triage(env: &TestEnv, id: &str, on: bool) {
    let r = env
        .command(
            "triage",
            0,
            C::Triage(v1::Triage {
                device_ids: vec![id.to_string()],
                in_triage: on,
                triage_ticket_url: "https://tickets.example/T-1".into(),
                parent_ticket_url: String::new(),
            }),
        )
        .await;
    assert!(r.error.is_none(), "{:?}", r.error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_the_mapping_table_is_projected() {
    let env = TestEnv::new().await;
    let hub = RunningHub::start(&env).await;
    let (_radar, radar_stop, radar_task) = start_radar(&env, 30).await;
    let now = || micros(Utc::now());

    let mut ids = BTreeMap::new();
    for (name, inventory, site) in [
        ("avail", "active", "s1"),
        ("inuse", "active", "s1"),
        ("deleg", "active", "s1"),
        ("quar", "active", "s1"),
        ("valid", "active", "s1"),
        ("drain", "active", "s1"),
        ("handover", "active", "s1"),
        ("triage", "active", "s1"),
        ("failed", "active", "s1"),
        ("staged", "staged", "s1"),
        ("unknown", "active", "s1"),
        ("invonly", "active", "inv"),
    ] {
        ids.insert(name, create(&env, site, name, inventory, "").await);
    }
    // Operational status from the openstack conditions (healthy, maintenance,
    // ready, allocated, available, maintenance pool), health from the
    // chassis composite, custody from Borneo, SLURM for validation.
    for name in ["avail", "triage", "staged"] {
        env.publish_snapshot(&openstack_as("s1", name, now(), Node::Available))
            .await;
        env.publish_snapshot(&chassis(name, "Ok")).await;
    }
    env.publish_snapshot(&openstack_as("s1", "inuse", now(), Node::InUse))
        .await;
    env.publish_snapshot(&chassis("inuse", "Ok")).await;
    env.publish_snapshot(&custody("deleg", "GOOGLE_OWNED"))
        .await;
    env.publish_snapshot(&openstack_as("s1", "quar", now(), Node::Maintenance))
        .await;
    env.publish_snapshot(&chassis("quar", "Warning")).await;
    env.publish_snapshot(&openstack_as("s1", "valid", now(), Node::MaintenancePool))
        .await;
    env.publish_snapshot(&snapshot(
        "slurm",
        "s1",
        "name",
        "valid",
        now(),
        vec![
            cond("SlurmRegistered", "True", ""),
            cond("SlurmNodeHealthy", "True", ""),
        ],
    ))
    .await;
    env.publish_snapshot(&chassis("valid", "Critical")).await;
    env.publish_snapshot(&custody("drain", "DRAINED")).await;
    env.publish_snapshot(&openstack_as("s1", "failed", now(), Node::Failed))
        .await;
    env.publish_snapshot(&chassis("failed", "Ok")).await;

    eventually("statuses derived", || async {
        let triage_ready =
            env.device_field(&ids["triage"], "operational_status").await == "available";
        let valid = env.device_field(&ids["valid"], "operational_status").await == "validation";
        (triage_ready && valid).then_some(())
    })
    .await;
    triage(&env, &ids["triage"], true).await;
    // pending_handover has no writer in the mesh (seed 002: "No current
    // production path writes Fleet Manager pending_handover"); the row is
    // set here and a triage round-trip makes the hub announce the device.
    sqlx::query("UPDATE devices SET operational_status = 'pending_handover' WHERE id = $1")
        .bind(&ids["handover"])
        .execute(&env.pool)
        .await
        .unwrap();
    triage(&env, &ids["handover"], true).await;
    triage(&env, &ids["handover"], false).await;

    // (availability, health)
    let want: BTreeMap<&str, (&str, &str)> = [
        ("avail", ("AVAILABLE", "HEALTHY")),
        ("inuse", ("IN_USE", "HEALTHY")),
        ("deleg", ("IN_USE", "UNKNOWN")),
        ("quar", ("MAINTENANCE", "DEGRADED")),
        ("valid", ("MAINTENANCE", "UNHEALTHY")),
        ("drain", ("MAINTENANCE", "UNKNOWN")),
        ("handover", ("MAINTENANCE", "UNKNOWN")),
        ("triage", ("MAINTENANCE", "HEALTHY")),
        ("failed", ("UNAVAILABLE", "HEALTHY")),
        ("staged", ("UNAVAILABLE", "HEALTHY")),
        ("unknown", ("UNKNOWN", "UNKNOWN")),
        ("invonly", ("", "")),
    ]
    .into_iter()
    .collect();
    let fleet = eventually("every projection as the table says", || async {
        let fleet = read_fleet(&env).await;
        let all = want.iter().all(|(name, (a, h))| {
            fleet
                .get(&ids[name])
                .is_some_and(|p| (p.availability.as_str(), p.health.as_str()) == (*a, *h))
        });
        all.then_some(fleet)
    })
    .await;
    assert_eq!(fleet.len(), ids.len(), "one projection per device");
    let inv = &fleet[&ids["invonly"]];
    assert!(inv.inventory_only && !inv.tombstone);
    assert_eq!(
        (
            inv.site.as_str(),
            inv.name.as_str(),
            inv.inventory_status.as_str()
        ),
        ("inv", "invonly", "active")
    );
    assert!(fleet
        .values()
        .filter(|p| p.device_id != ids["invonly"])
        .all(|p| !p.inventory_only));
    assert_eq!(fleet[&ids["staged"]].inventory_status, "staged");
    // The projection carries the device version it was made from.
    assert_eq!(
        fleet[&ids["avail"]].version,
        version(&env, &ids["avail"]).await
    );

    stop(radar_stop, radar_task).await;
    hub.stop(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opted_out_tenants_get_one_tombstone_per_device_and_a_new_reader_gets_the_whole_fleet() {
    let env = TestEnv::new().await;
    sqlx::query("INSERT INTO tenants (id, name) VALUES ('t1', 'one'), ('t2', 'two')")
        .execute(&env.pool)
        .await
        .unwrap();
    let hub = RunningHub::start(&env).await;
    let d1 = create(&env, "s1", "t1-a", "active", "t1").await;
    let d2 = create(&env, "s1", "t1-b", "active", "t1").await;
    let d3 = create(&env, "s1", "t2-a", "active", "t2").await;
    let devices_before: Vec<(String, i64, chrono::DateTime<Utc>)> =
        sqlx::query_as("SELECT id, version, updated_at FROM devices ORDER BY id")
            .fetch_all(&env.pool)
            .await
            .unwrap();

    // Every message on the Radar subjects, as a live reader sees them.
    let seen: Arc<Mutex<Vec<v1::RadarProjection>>> = Arc::default();
    let mut sub = env.nats.subscribe(env.subjects.radar_all()).await.unwrap();
    env.nats.flush().await.unwrap();
    let s = seen.clone();
    let live = tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            s.lock()
                .unwrap()
                .push(v1::RadarProjection::decode(m.payload.as_ref()).unwrap());
        }
    });
    let tombstones = |id: &str| {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|p| p.device_id == id && p.tombstone)
            .count()
    };

    let (_radar, radar_stop, radar_task) = start_radar(&env, 1).await;
    eventually("three devices projected", || async {
        let f = read_fleet(&env).await;
        (f.len() == 3
            && f.values()
                .all(|p| !p.tombstone && p.availability == "UNKNOWN"))
        .then_some(())
    })
    .await;
    // Radar never writes back.
    let devices_after: Vec<(String, i64, chrono::DateTime<Utc>)> =
        sqlx::query_as("SELECT id, version, updated_at FROM devices ORDER BY id")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    assert_eq!(devices_before, devices_after);

    let ignore = |tenant: &str, on: bool, reason: &str| v1::RadarIgnore {
        tenant_id: tenant.into(),
        ignore: on,
        reason: reason.into(),
        actor: "test".into(),
    };
    let send = |r: v1::RadarIgnore| {
        let nats = env.nats.clone();
        let subject = env.subjects.radar_cmd("radar_ignore");
        async move {
            let m = nats
                .request(subject, r.encode_to_vec().into())
                .await
                .unwrap();
            v1::RadarReply::decode(m.payload.as_ref()).unwrap()
        }
    };
    // "a reason is required; without one the annotation is refused"
    let r = send(ignore("t1", true, "  ")).await;
    assert_eq!(
        r.error.unwrap().code(),
        fleet_proto::ErrorCode::InvalidArgument
    );
    let annotations: serde_json::Value =
        sqlx::query_scalar("SELECT annotations FROM tenants WHERE id = 't1'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(annotations, serde_json::json!({}));
    assert_eq!(
        send(ignore("ghost", true, "x")).await.error.unwrap().code(),
        fleet_proto::ErrorCode::NotFound
    );

    let r = send(ignore("t1", true, "internal lab fleet")).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(r.devices, 2);
    let stored: serde_json::Value = serde_json::from_slice(&r.annotations_json).unwrap();
    assert_eq!(stored["radar_ignore"], true);
    assert_eq!(stored["radar_ignore_reason"], "internal lab fleet");
    let f = read_fleet(&env).await;
    for id in [&d1, &d2] {
        assert!(f[id].tombstone, "{id} not tombstoned");
        assert_eq!(f[id].tombstone_reason, "opted_out");
        assert!(f[id].availability.is_empty() && f[id].health.is_empty());
    }
    assert!(!f[&d3].tombstone);

    // Status keeps changing, resyncs run, Radar restarts: still one tombstone each.
    triage(&env, &d1, true).await;
    env.publish_snapshot(&chassis("t1-b", "Critical")).await;
    eventually("the hub changed the opted-out devices", || async {
        (env.device_field(&d2, "health_status").await == "critical").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop(radar_stop, radar_task).await;
    let (_radar, radar_stop, radar_task) = start_radar(&env, 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        (tombstones(&d1), tombstones(&d2), tombstones(&d3)),
        (1, 1, 0)
    );

    // A new reader gets the whole fleet, one message per device.
    let f = read_fleet(&env).await;
    assert_eq!(f.len(), 3);
    assert!(f[&d1].tombstone && f[&d2].tombstone && !f[&d3].tombstone);

    // An opt-out written past the validation (no reason) is not honoured.
    sqlx::query("UPDATE tenants SET annotations = '{\"radar_ignore\": true}' WHERE id = 't2'")
        .execute(&env.pool)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!read_fleet(&env).await[&d3].tombstone);

    // Clearing the opt-out projects the devices again, with their status.
    assert!(send(ignore("t1", false, "")).await.error.is_none());
    let f = read_fleet(&env).await;
    assert!(
        !f[&d1].tombstone && f[&d1].availability == "MAINTENANCE",
        "{:?}",
        f[&d1]
    );
    assert!(
        !f[&d2].tombstone && f[&d2].health == "UNHEALTHY",
        "{:?}",
        f[&d2]
    );

    // A deleted device gets a tombstone.
    let v = version(&env, &d3).await;
    let r = env
        .command(
            "delete_device",
            v,
            C::DeleteDevice(v1::DeleteDevice {
                device_id: d3.clone(),
            }),
        )
        .await;
    assert!(r.error.is_none(), "{:?}", r.error);
    eventually("the deleted device is tombstoned", || async {
        let f = read_fleet(&env).await;
        // A read under load may come back short: look again rather than index.
        f.get(&d3)
            .is_some_and(|p| p.tombstone && p.tombstone_reason == "deleted")
            .then_some(())
    })
    .await;

    live.abort();
    stop(radar_stop, radar_task).await;
    hub.stop(env).await;
}
