//! Issue 14, item 5: a PostgreSQL outage loses no transition. Observations
//! that arrive while the database is away come back, once it is, in stream
//! order, and two of one device's observations in one batch are two
//! transitions: the lifecycle log holds every real transition, in order.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use fleet_domain::state::{DeviceRecord, DeviceState, Ttls};
use fleet_proto::v1;

use crate::support::start_hub;
use crate::support::*;

/// The operational statuses applying `snaps` in order walks through,
/// starting from a new device's `unknown`, repeats removed.
fn in_order_history(id: &str, name: &str, snaps: &[v1::ConditionSnapshot]) -> Vec<String> {
    let now = Utc::now();
    let ttls = Ttls::uniform(chrono::Duration::days(1));
    let mut rec = DeviceRecord::new(id.into(), "s1".into(), name.into());
    rec.no_schedule_reasons = vec!["unreachable".into()];
    let mut s = DeviceState::new(rec);
    let mut seq = vec!["unknown".to_string()];
    for snap in snaps {
        let (_, domain) = fleet_hub::decode::snapshot(snap, now).unwrap();
        s.apply_snapshot(&domain, now);
        s.reconcile(now, &ttls);
        seq.push(s.record.operational_status.to_string());
    }
    seq.dedup();
    seq
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_loses_no_transition() {
    let env = TestEnv::new().await;
    let (_hub, trigger, task) = start_hub(&env).await;
    let devices = 40;
    let mut ids = vec![];
    for i in 0..devices {
        ids.push(env.create_device("s1", &format!("gpu-o-{i:02}")).await);
    }
    let t0 = micros(Utc::now()) - chrono::Duration::seconds(60);
    let at = |k: i64| t0 + chrono::Duration::seconds(k);
    let plan = |name: &str| {
        vec![
            // quarantine, then in use, then available.
            openstack_as("s1", name, at(0), Node::Maintenance),
            openstack_as("s1", name, at(5), Node::InUse),
            openstack_as("s1", name, at(10), Node::Available),
        ]
    };
    for i in 0..devices {
        env.publish_snapshot(&plan(&format!("gpu-o-{i:02}"))[0])
            .await;
    }
    for id in &ids {
        eventually("quarantine before the outage", || async {
            (env.device_field(id, "operational_status").await == "quarantine").then_some(())
        })
        .await;
    }

    env.database_reachable(false).await;
    for k in 1..3 {
        for i in 0..devices {
            env.publish_snapshot(&plan(&format!("gpu-o-{i:02}"))[k])
                .await;
        }
    }
    // Batches fail for a while.
    tokio::time::sleep(Duration::from_secs(4)).await;
    env.database_reachable(true).await;

    let pool = fleet_store::connect(&env.common.database.url, 2)
        .await
        .unwrap();
    let mut want: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (i, id) in ids.iter().enumerate() {
        let name = format!("gpu-o-{i:02}");
        want.insert(id.clone(), in_order_history(id, &name, &plan(&name)));
    }
    let final_status = want.values().next().unwrap().last().unwrap().clone();
    eventually(
        "every device at its final status once PostgreSQL is back",
        || async {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM devices WHERE operational_status = $1")
                    .bind(&final_status)
                    .fetch_one(&pool)
                    .await
                    .ok()?;
            (n == devices as i64).then_some(())
        },
    )
    .await;
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT device_id, value FROM device_lifecycle_events WHERE kind = 'operational' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (id, v) in rows {
        got.entry(id).or_default().push(v);
    }
    let wrong: Vec<_> = ids
        .iter()
        .filter(|id| got.get(*id) != want.get(*id))
        .map(|id| (id, got.get(id), &want[id]))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {devices} devices lost or reordered transitions, e.g. {:?}",
        wrong.len(),
        wrong.first()
    );
    pool.close().await;
    stop(trigger, task).await;
    env.cleanup().await;
}
