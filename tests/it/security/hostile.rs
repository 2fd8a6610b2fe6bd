//! Issue 14, items 7, 10 and 11: hostile observations. Each is refused at
//! decode with a typed reason and dead-lettered at once (never retried
//! five times, never holding back the batch behind it), a message near the
//! server's max payload is dead-lettered as a cut copy instead of looping,
//! and unresolved observations are bounded.

use chrono::{TimeZone, Utc};
use fleet_proto::{v1, Message};

use crate::support::start_hub;
use crate::support::*;

async fn publish_raw(env: &TestEnv, key: &v1::DeviceKey, payload: Vec<u8>) {
    fleet_bus::publish_observation(
        &env.js,
        &env.subjects,
        env.common.nats.partitions,
        "openstack",
        key,
        ulid::Ulid::new().timestamp_ms() as i64 * 1_000_000 + rand::random::<u16>() as i64,
        &fleet_proto::schema::<v1::ConditionSnapshot>(),
        None,
        payload.into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
}

/// Every DLQ message: (reason subject token, Fleet-Dlq-Error, payload
/// size, Fleet-Dlq-Truncated).
async fn dead_letters(env: &TestEnv) -> Vec<(String, String, usize, Option<String>)> {
    env.dead_letters()
        .await
        .into_iter()
        .map(|m| {
            let h = m.headers.clone().unwrap_or_default();
            (
                m.subject.as_str().rsplit('.').next().unwrap().to_string(),
                h.get(fleet_bus::HEADER_DLQ_ERROR)
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
                m.payload.len(),
                h.get(fleet_bus::dlq::HEADER_DLQ_TRUNCATED)
                    .map(|v| v.to_string()),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_observations_are_refused_at_decode_and_dead_lettered_once() {
    let env = TestEnv::new().await;
    let (hub, trigger, task) = start_hub(&env).await;
    let id = env.create_device("s1", "gpu-h-01").await;
    let now = micros(Utc::now());

    // A 3,000-character key (past a btree index row's limit; a longer one
    // does not fit a NATS control line): refused by name, never reaching
    // the index.
    let long_key = snapshot("openstack", "s1", "name", &"k".repeat(3000), now, vec![]);
    env.publish_snapshot(&long_key).await;
    // A year -93000 timestamp.
    let mut ancient = openstack_as("s1", "gpu-h-01", now, Node::Maintenance);
    ancient.observed_at = Some(fleet_proto::timestamp(
        Utc.with_ymd_and_hms(1969, 1, 1, 0, 0, 0).unwrap(),
    ));
    ancient.observed_at.as_mut().unwrap().seconds = -3_000_000_000_000;
    let key = ancient.device.clone().unwrap();
    publish_raw(&env, &key, ancient.encode_to_vec()).await;
    // A message near the 1 MiB max payload: undecodable filler.
    publish_raw(&env, &key, vec![0xff; 1_048_300]).await;
    // A reason far too long.
    let mut long_reason = openstack_as("s1", "gpu-h-01", now, Node::Maintenance);
    long_reason.conditions[0].reason = "r".repeat(10_000);
    env.publish_snapshot(&long_reason).await;
    // And a good snapshot of the same device behind them all (a later
    // time: the same one would be a duplicate message id).
    let later = now + chrono::Duration::seconds(1);
    env.publish_snapshot(&openstack_as("s1", "gpu-h-01", later, Node::Maintenance))
        .await;
    eventually("the good snapshot applied", || async {
        (env.device_field(&id, "operational_status").await == "quarantine").then_some(())
    })
    .await;
    eventually("four dead letters", || async {
        let d = dead_letters(&env).await;
        (d.len() == 4).then_some(())
    })
    .await;
    let mut d = dead_letters(&env).await;
    d.sort();
    let reasons: Vec<&str> = d.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(
        reasons,
        vec!["invalid", "invalid", "invalid", "invalid"],
        "{d:?}"
    );
    let errors: Vec<&str> = d.iter().map(|x| x.1.as_str()).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("device.key is longer than 512")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("before 2000-01-01") || e.contains("observed_at")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("condition.reason is longer than 512")),
        "{errors:?}"
    );
    // The near-1 MiB one: a cut copy, saying how big the original was.
    let big = d.iter().find(|x| x.3.is_some()).expect("a truncated copy");
    assert_eq!(big.3.as_deref(), Some("1048300"));
    assert!(big.2 < 1_048_300);
    // Refused once each at decode: nothing went the apply-and-retry way.
    let failed = hub
        .metrics
        .dead_lettered
        .get_or_create(&vec![("reason".to_string(), "apply_failed".to_string())])
        .get();
    assert_eq!(failed, 0);
    stop(trigger, task).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolved_observations_are_cut_and_expire() {
    let mut env = TestEnv::new().await;
    env.hub.unresolved_max_rows = 2;
    let (hub, trigger, task) = start_hub(&env).await;
    let now = micros(Utc::now());
    // A large observation for a key no device has: kept cut to 16 KiB.
    let mut big = openstack_as("s1", "nobody-00", now, Node::Maintenance);
    for c in big.conditions.iter_mut().take(4) {
        c.message = "m".repeat(8000);
    }
    env.publish_snapshot(&big).await;
    for i in 1..4 {
        env.publish_snapshot(&openstack_as(
            "s1",
            &format!("nobody-{i:02}"),
            now,
            Node::Maintenance,
        ))
        .await;
    }
    eventually("four unresolved keys", || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM unresolved_observations")
            .fetch_one(&env.pool)
            .await
            .unwrap();
        (n == 4).then_some(())
    })
    .await;
    let (kept, original): (i32, i64) = sqlx::query_as(
        "SELECT length(payload), payload_bytes FROM unresolved_observations WHERE key = 'nobody-00'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        kept as usize,
        fleet_hub::store::devices::MAX_UNRESOLVED_PAYLOAD
    );
    assert!(original > 32_000, "{original}");
    // An old key expires; past the cap the oldest go.
    sqlx::query("UPDATE unresolved_observations SET received_at = now() - interval '30 days' WHERE key = 'nobody-01'")
        .execute(&env.pool)
        .await
        .unwrap();
    let gone = hub.expire_unresolved().await.unwrap();
    assert_eq!(gone, 2, "one expired, one past the cap of 2");
    let left: Vec<String> =
        sqlx::query_scalar("SELECT key FROM unresolved_observations ORDER BY key")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    assert_eq!(left.len(), 2);
    assert!(!left.contains(&"nobody-01".to_string()));
    stop(trigger, task).await;
    env.cleanup().await;
}
