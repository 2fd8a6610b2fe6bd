//! The hub's rules through NATS and PostgreSQL: custody, staleness, the
//! DLQ, unresolved keys, commands and their typed errors, inventory-only,
//! source silence, and the schema check.

use std::time::Duration;

use chrono::Utc;
use fleet_proto::{v1, Message};
use futures::StreamExt;
use v1::hub_command::Command as C;

use crate::support::*;

fn custody(
    site: &str,
    kind: &str,
    key: &str,
    at: chrono::DateTime<Utc>,
    state: &str,
) -> v1::ConditionSnapshot {
    let mut s = snapshot("borneo", site, kind, key, at, vec![]);
    s.mirror = Some(v1::condition_snapshot::Mirror::Custody(v1::CustodyMirror {
        state: state.into(),
        state_changed_at: None,
        credential_ref: String::new(),
    }));
    s
}

fn cordon(id: &str, reason: &str) -> C {
    C::Cordon(v1::Cordon {
        device_id: id.into(),
        reason: reason.into(),
    })
}

fn uncordon(id: &str) -> C {
    C::Uncordon(v1::Uncordon {
        device_id: id.into(),
    })
}

fn provision(id: &str, to: &str) -> C {
    C::Provision(v1::ProvisionMove {
        device_id: id.into(),
        to: to.into(),
    })
}

/// A `create_device` item: `name` at `site`, nothing else set.
fn device(site: &str, name: &str) -> v1::CreateDevice {
    v1::CreateDevice {
        site: site.into(),
        name: name.into(),
        ..Default::default()
    }
}

/// Publishes `payload` as it is, under the snapshot schema: `source`'s
/// observation of `key` (the publisher's dedupe time `at_nanos`), with
/// the publisher's `traceparent`; waits for its PubAck.
async fn publish_raw(
    env: &TestEnv,
    source: &str,
    key: &v1::DeviceKey,
    at_nanos: i64,
    traceparent: Option<&str>,
    payload: Vec<u8>,
) {
    fleet_bus::publish_observation(
        &env.js,
        &env.subjects,
        env.common.nats.partitions,
        source,
        key,
        at_nanos,
        &fleet_proto::schema::<v1::ConditionSnapshot>(),
        traceparent,
        payload.into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
}

async fn dlq_messages(env: &TestEnv) -> Vec<(String, String)> {
    env.dead_letters()
        .await
        .into_iter()
        .map(|m| {
            let h = m.headers.clone().unwrap_or_default();
            (
                m.subject.to_string(),
                h.get(fleet_bus::HEADER_DLQ_REASON)
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
            )
        })
        .collect()
}

fn error_message(r: &v1::HubReply) -> String {
    r.error
        .as_ref()
        .map(|e| e.message.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custody_entry_sets_delegated_and_the_breach_latch_once() {
    let (env, hub) = start().await;
    let id = env.create_device("s1", "gpu-c-01").await;
    let t0 = micros(Utc::now());
    env.publish_snapshot(&custody("s1", "name", "gpu-c-01", t0, "GOOGLE_OWNED"))
        .await;
    eventually_field(&env, &id, "operational_status", "delegated").await;
    let latch: (String, String, chrono::DateTime<Utc>) = row(
        &env,
        "SELECT status, reason, observed_at FROM device_conditions WHERE device_id = $1 AND type = 'FrontendPortsInCustomerVrf'",
        &id,
    )
    .await;
    assert_eq!(
        (latch.0.as_str(), latch.1.as_str()),
        ("Unknown", "HandoverBreach")
    );
    // One transaction: the latch and the status change have the same lifecycle clock.
    let at: chrono::DateTime<Utc> = scalar(
        &env,
        "SELECT created_at FROM device_lifecycle_events WHERE device_id = $1 AND kind = 'operational' AND value = 'delegated'",
        &id,
    )
    .await;
    let received: chrono::DateTime<Utc> = scalar(
        &env,
        "SELECT received_at FROM device_conditions WHERE device_id = $1 AND type = 'FrontendPortsInCustomerVrf'",
        &id,
    )
    .await;
    assert_eq!(
        at, received,
        "latch and status written in the same transaction"
    );

    let version = env.device_field(&id, "version").await;
    let events_before = status_events(&env, &id).await.len();
    let t1 = t0 + chrono::Duration::seconds(60);
    env.publish_snapshot(&custody("s1", "name", "gpu-c-01", t1, "GOOGLE_OWNED"))
        .await;
    eventually("second poll applied", || async {
        (observed_at(&env, &id, "borneo").await == Some(t1)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        env.device_field(&id, "version").await,
        version,
        "a second identical poll changes nothing"
    );
    assert_eq!(status_events(&env, &id).await.len(), events_before);
    let latch2: chrono::DateTime<Utc> = scalar(
        &env,
        "SELECT observed_at FROM device_conditions WHERE device_id = $1 AND type = 'FrontendPortsInCustomerVrf'",
        &id,
    )
    .await;
    assert_eq!(latch2, latch.2, "the latch is left alone");
    hub.stop(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_dead_lettered_and_changes_nothing() {
    let (env, hub) = start().await;
    let id = env.create_device("s1", "gpu-d-01").await;
    let now = micros(Utc::now());
    let key = v1::DeviceKey {
        site: "s1".into(),
        kind: "name".into(),
        key: "gpu-d-01".into(),
    };
    // The device's snapshot as `source` names itself in it, encoded.
    let encoded = |source: &str, at, conditions| {
        snapshot(source, "s1", "name", "gpu-d-01", at, conditions).encode_to_vec()
    };
    // Openstack's snapshot now, of one condition.
    let one = |t: &str, status: &str, reason: &str| {
        encoded("openstack", now, vec![cond(t, status, reason)])
    };
    // The subject's source, the payload, and why it is dead-lettered.
    let bad = [
        // Arbitrary bytes.
        (
            "openstack",
            vec![0xff, 0x00, 0x13, 0x37, 0xde, 0xad],
            "invalid",
        ),
        // An unknown condition type.
        (
            "openstack",
            one("NoSuchType", "True", ""),
            "unknown_condition_type",
        ),
        // A type the source does not own.
        (
            "slurm",
            encoded("slurm", now, vec![cond("IronicMaintenance", "True", "")]),
            "forbidden_source",
        ),
        // A payload naming another source than its subject.
        (
            "slurm",
            encoded("openstack", now, vec![]),
            "forbidden_source",
        ),
        // More than 5 minutes ahead.
        (
            "openstack",
            encoded("openstack", now + chrono::Duration::minutes(6), vec![]),
            "future_observation",
        ),
        // A bad enum value.
        (
            "openstack",
            one("IronicMaintenance", "Maybe", ""),
            "invalid",
        ),
        // A NUL character, which PostgreSQL text cannot hold.
        (
            "openstack",
            one("IronicMaintenance", "True", "Bad\0Reason"),
            "invalid",
        ),
    ];
    for (n, (source, payload, _)) in (1..).zip(&bad) {
        publish_raw(&env, source, &key, n, None, payload.clone()).await;
    }

    let dlq = eventually("seven DLQ entries", || async {
        let d = dlq_messages(&env).await;
        (d.len() >= bad.len()).then_some(d)
    })
    .await;
    let mut reasons: Vec<&str> = dlq.iter().map(|(_, r)| r.as_str()).collect();
    reasons.sort();
    let mut expected: Vec<&str> = bad.iter().map(|(_, _, why)| *why).collect();
    expected.sort();
    assert_eq!(reasons, expected);
    assert!(dlq.iter().all(|(s, _)| s.starts_with(&format!(
        "{}.dlq.observations.",
        env.common.nats.subject_root
    ))));
    let n: i64 = scalar(
        &env,
        "SELECT count(*) FROM device_conditions WHERE device_id = $1",
        &id,
    )
    .await;
    assert_eq!(n, 0, "nothing was applied");

    // The hub is still alive and applies good input.
    env.publish_snapshot(&openstack_as("s1", "gpu-d-01", now, Node::Failed))
        .await;
    eventually_field(&env, &id, "operational_status", "failed").await;
    hub.stop(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolved_keys_are_kept_not_dead_lettered_and_stale_is_ignored() {
    let (env, hub) = start().await;
    let t0 = micros(Utc::now());
    // Slurm's snapshot of a name no device has.
    let ghost = |at, registered: &str| {
        snapshot(
            "slurm",
            "s1",
            "name",
            "ghost-01",
            at,
            vec![cond("SlurmRegistered", registered, "")],
        )
    };
    env.publish_snapshot(&ghost(t0, "True")).await;
    env.publish_snapshot(&ghost(t0 + chrono::Duration::seconds(1), "True"))
        .await;
    let count: i64 = eventually("unresolved row", || async {
        let c: Option<i64> = sqlx::query_scalar("SELECT seen_count FROM unresolved_observations WHERE source = 'slurm' AND key = 'ghost-01'")
            .fetch_optional(&env.pool)
            .await
            .unwrap();
        c.filter(|c| *c == 2)
    })
    .await;
    assert_eq!(count, 2);
    // An older one counts, and leaves the latest in place.
    env.publish_snapshot(&ghost(t0 - chrono::Duration::seconds(5), "False"))
        .await;
    let kept: chrono::DateTime<Utc> = eventually("third sighting", || async {
        let r: Option<(i64, chrono::DateTime<Utc>)> = sqlx::query_as(
            "SELECT seen_count, observed_at FROM unresolved_observations WHERE source = 'slurm' AND key = 'ghost-01'",
        )
        .fetch_optional(&env.pool)
        .await
        .unwrap();
        r.filter(|(c, _)| *c == 3).map(|(_, o)| o)
    })
    .await;
    assert_eq!(kept, t0 + chrono::Duration::seconds(1));
    assert!(dlq_messages(&env).await.is_empty());

    // Stale: an older snapshot after a newer one is not applied.
    let id = env.create_device("s1", "gpu-s-01").await;
    let snap = |at, node| openstack_as("s1", "gpu-s-01", at, node);
    env.publish_snapshot(&snap(t0 + chrono::Duration::seconds(10), Node::Maintenance))
        .await;
    eventually_field(&env, &id, "operational_status", "quarantine").await;
    env.publish_snapshot(&snap(t0, Node::Failed)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        env.device_field(&id, "operational_status").await,
        "quarantine",
        "the older snapshot is stale"
    );
    hub.stop(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_check_version_and_answer_typed_errors() {
    let (env, hub) = start().await;
    let id = env.create_device("s1", "gpu-k-01").await;

    let r = env.command("cordon", 1, cordon(&id, "firmware")).await;
    assert_eq!(error_code(&r), "OK");
    let rec = device_of(&r);
    assert!(rec.cordoned);
    assert_eq!(
        rec.capacity_bucket, "excluded",
        "role unassigned: excluded before maintenance"
    );
    assert_eq!(r.version, 2);
    // CONFLICT: the version the caller read is stale.
    let r = env.command("uncordon", 1, uncordon(&id)).await;
    assert_eq!(error_code(&r), "CONFLICT");
    // NOT_FOUND
    let r = env.command("uncordon", 1, uncordon("dev_nope")).await;
    assert_eq!(error_code(&r), "NOT_FOUND");
    // INVALID_ARGUMENT: no reason, bad vocabulary, no version, wrong verb,
    // a NUL, bytes.
    for (verb, version, command, why) in [
        ("cordon", 2, cordon(&id, " "), "no reason"),
        ("provision", 2, provision(&id, "Deployed"), "bad vocabulary"),
        ("uncordon", 0, uncordon(&id), "no version"),
        ("cordon", 2, uncordon(&id), "wrong verb"),
        (
            "cordon",
            2,
            cordon(&id, "nul\0here"),
            "a NUL is refused before the store sees it",
        ),
    ] {
        let r = env.command(verb, version, command).await;
        assert_eq!(error_code(&r), "INVALID_ARGUMENT", "{why}");
    }
    let garbage = env
        .nats
        .request(
            env.subjects.hub_cmd("cordon"),
            vec![0xff, 0xff, 0x01].into(),
        )
        .await
        .unwrap();
    assert_eq!(
        error_code(&v1::HubReply::decode(garbage.payload.as_ref()).unwrap()),
        "INVALID_ARGUMENT"
    );
    // INVALID_STATE: adopting -> deployed is not in the table.
    let r = env
        .command("provision", 2, provision(&id, "deployed"))
        .await;
    assert_eq!(error_code(&r), "INVALID_STATE");
    // failed records failed_from and turns maintenance on.
    let r = env.command("provision", 2, provision(&id, "failed")).await;
    assert_eq!(error_code(&r), "OK");
    let rec = device_of(&r);
    assert_eq!(
        (
            rec.provision_state.as_str(),
            rec.failed_from.as_str(),
            rec.maintenance
        ),
        ("failed", "adopting", true)
    );
    // Nothing half-applied on error: version moved only on the successes.
    assert_eq!(env.device_field(&id, "version").await, "3");
    let kinds: Vec<String> = scalars(&env, "SELECT kind FROM device_lifecycle_events WHERE device_id = $1 AND cause LIKE 'command:%' AND cause NOT LIKE 'command:create_device%' AND kind IN ('cordoned','provision','maintenance') ORDER BY id", &id).await;
    assert_eq!(kinds, vec!["cordoned", "provision", "maintenance"]);

    // FORBIDDEN_SOURCE and FUTURE_OBSERVATION on the single-condition path:
    // `source` writes the repair latch, observed `at`.
    let repair = |source: &str, status: &str, reason: &str, at| {
        let condition = cond("NvLinkGpusInRepairPartition", status, reason);
        env.command(
            "write_condition",
            0,
            write_condition(source, &id, condition, at),
        )
    };
    let now = micros(Utc::now());
    let r = repair("slurm", "True", "MoveVerified", now).await;
    assert_eq!(error_code(&r), "FORBIDDEN_SOURCE");
    let ahead = now + chrono::Duration::minutes(10);
    let r = repair("nvlink-fabric", "True", "MoveVerified", ahead).await;
    assert_eq!(error_code(&r), "FUTURE_OBSERVATION");
    let message = error_message(&r);
    assert!(
        message.contains("ahead of the hub's clock (it read 20"),
        "{message}"
    );
    let r = repair("nvlink-fabric", "True", "MoveVerified", now).await;
    assert_eq!(error_code(&r), "OK");
    assert_eq!(condition_of(&r).status, "True");
    // A stale latch write gets the stored row back, not what it sent.
    let before = now - chrono::Duration::seconds(5);
    let r = repair("nvlink-fabric", "False", "ReturnVerified", before).await;
    assert_eq!(error_code(&r), "OK");
    assert_eq!(
        condition_of(&r).status,
        "True",
        "stale-rejected: the reply is the stored row"
    );
    // Issue 19: every vocabulary checked at the hub. A latch write whose
    // reason is not the latch's (or whose status is not its reason's), and
    // a custody state outside GOOGLE_OWNED / PARTNER_OWNED / DRAINED, are
    // INVALID_ARGUMENT and store nothing.
    for (status, reason) in [
        ("True", "NotARealReason"),
        ("True", ""),
        ("False", "MoveVerified"),
    ] {
        let later = now + chrono::Duration::seconds(1);
        let r = repair("nvlink-fabric", status, reason, later).await;
        assert_eq!(error_code(&r), "INVALID_ARGUMENT", "{status} {reason:?}");
        let message = error_message(&r);
        assert!(message.contains("MoveVerified (True)"), "{message}");
    }
    let reason: String = scalar(
        &env,
        "SELECT reason FROM device_conditions WHERE device_id = $1 AND type = 'NvLinkGpusInRepairPartition'",
        &id,
    )
    .await;
    assert_eq!(reason, "MoveVerified", "nothing stored");
    let whatever = custody("s1", "device_id", &id, now, "WHATEVER");
    let r = env
        .command("apply_snapshot", 0, C::ApplySnapshot(whatever))
        .await;
    assert_eq!(error_code(&r), "INVALID_ARGUMENT");
    assert_eq!(env.device_field(&id, "coalesce(custody, '')").await, "");
    // create_device twice: CONFLICT; unknown site: NOT_FOUND.
    let dup = env
        .command(
            "create_device",
            0,
            C::CreateDevice(device("s1", "gpu-k-01")),
        )
        .await;
    assert_eq!(error_code(&dup), "CONFLICT");
    let nosite = env
        .command("create_device", 0, C::CreateDevice(device("nowhere", "x")))
        .await;
    assert_eq!(error_code(&nosite), "NOT_FOUND");
    hub.stop(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_only_devices_are_never_derived() {
    let (env, hub) = start().await;
    let id = env.create_device("inv", "gpu-i-01").await;
    assert_eq!(
        env.device_field(&id, "inventory_only").await,
        "true",
        "inherited from the site"
    );
    env.publish_snapshot(&openstack_as(
        "inv",
        "gpu-i-01",
        micros(Utc::now()),
        Node::FailedInMaintenance,
    ))
    .await;
    eventually_count(
        &env,
        "conditions stored",
        "SELECT count(*) FROM device_conditions WHERE device_id = $1",
        &id,
        6,
    )
    .await;
    assert_eq!(env.device_field(&id, "operational_status").await, "unknown");
    hub.stop(env).await;
}

/// The cause of the device's latest operational transition.
async fn last_operational_cause(env: &TestEnv, id: &str) -> String {
    scalar(
        env,
        "SELECT cause FROM device_lifecycle_events WHERE device_id = $1 AND kind = 'operational' ORDER BY id DESC LIMIT 1",
        id,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_source_is_swept_to_unknown() {
    let mut env = TestEnv::new().await;
    env.common
        .freshness
        .ttl
        .insert("openstack".into(), Duration::from_secs(1));
    let hub = RunningHub::start(&env).await;
    let id = env.create_device("s1", "gpu-q-01").await;
    env.publish_snapshot(&openstack_as(
        "s1",
        "gpu-q-01",
        micros(Utc::now()),
        Node::Maintenance,
    ))
    .await;
    eventually_field(&env, &id, "operational_status", "quarantine").await;
    // No new snapshot: the sweeper re-derives once the TTL passes.
    eventually_field(&env, &id, "operational_status", "unknown").await;
    assert_eq!(last_operational_cause(&env, &id).await, "sweep");
    hub.stop(env).await;
}

/// `device_sweep.sweep_at` of a device.
async fn sweep_at(env: &TestEnv, id: &str) -> Option<chrono::DateTime<Utc>> {
    sqlx::query_scalar("SELECT sweep_at FROM device_sweep WHERE device_id = $1")
        .bind(id)
        .fetch_optional(&env.pool)
        .await
        .unwrap()
        .flatten()
}

/// A test environment whose OpenStack TTL is an hour.
async fn with_an_hour_ttl() -> TestEnv {
    let mut env = TestEnv::new().await;
    env.common
        .freshness
        .ttl
        .insert("openstack".into(), Duration::from_secs(3600));
    env
}

/// A device quarantined by one OpenStack snapshot, observed at the
/// returned time, through a hub already running.
async fn quarantined(env: &TestEnv, name: &str) -> (String, chrono::DateTime<Utc>) {
    let id = env.create_device("s1", name).await;
    let t0 = micros(Utc::now());
    env.publish_snapshot(&openstack_as("s1", name, t0, Node::Maintenance))
        .await;
    eventually_field(env, &id, "operational_status", "quarantine").await;
    (id, t0)
}

/// An OpenStack TTL whose deadline, for a snapshot observed at `t0`, comes
/// 2 s after the device was derived: a deadline before that would have
/// been accounted for already.
async fn ttl_out_soon_after_derived(
    env: &TestEnv,
    id: &str,
    t0: chrono::DateTime<Utc>,
) -> Duration {
    let derived: chrono::DateTime<Utc> =
        scalar(env, "SELECT derived_at FROM devices WHERE id = $1", id).await;
    (derived - t0 + chrono::Duration::seconds(2))
        .to_std()
        .unwrap()
}

/// The sweeper reads only devices whose `sweep_at` has passed: a source's
/// first snapshot brings it to that source's silence, a sweep of a device
/// nothing is due for sets it again without re-deriving, and a hub
/// restarted with a shorter TTL sweeps by the new one (it marks every
/// device due once) instead of waiting for the deadline the old TTL set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_at_follows_the_deadlines_and_a_shorter_ttl_after_a_restart() {
    let mut env = with_an_hour_ttl().await;
    let hour = Duration::from_secs(3600);
    let (hub, trigger, task) = start_hub(&env).await;
    let (id, t0) = quarantined(&env, "gpu-sw-01").await;
    let silent = t0 + chrono::Duration::from_std(hour).unwrap();
    assert_eq!(
        sweep_at(&env, &id).await,
        Some(silent),
        "the source's silence"
    );

    // Due by its sweep_at, not by its rows: looked at, not re-derived.
    let version: i64 = scalar(&env, "SELECT version FROM devices WHERE id = $1", &id).await;
    sqlx::query(
        "UPDATE device_sweep SET sweep_at = now() - interval '1 second' WHERE device_id = $1",
    )
    .bind(&id)
    .execute(&env.pool)
    .await
    .unwrap();
    eventually("sweep_at set again", || async {
        (sweep_at(&env, &id).await == Some(silent)).then_some(())
    })
    .await;
    let after: i64 = scalar(&env, "SELECT version FROM devices WHERE id = $1", &id).await;
    assert_eq!(after, version, "nothing was due");
    stop(trigger, task).await;
    drop(hub);

    let short = ttl_out_soon_after_derived(&env, &id, t0).await;
    env.common.freshness.ttl.insert("openstack".into(), short);
    let hub = RunningHub::start(&env).await;
    eventually_field(&env, &id, "operational_status", "unknown").await;
    assert_eq!(last_operational_cause(&env, &id).await, "sweep");
    // Swept: no deadline of the source is still to come.
    assert_eq!(sweep_at(&env, &id).await, None);
    hub.stop(env).await;
}

/// The settings `hub_sweep_settings` holds: the fingerprint and `mixed`.
async fn sweep_settings(env: &TestEnv) -> (String, bool) {
    sqlx::query_as("SELECT deadlines, mixed FROM hub_sweep_settings")
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

/// A rolling change of a TTL (a Deployment's rolling update): while the
/// replica with the old, longer TTL still runs beside the one started with
/// a shorter TTL, the old one leaves the sweep to the new one, so a silent
/// source is noticed by the new deadline (before, the old replica set
/// `sweep_at` again by its own TTL for every device it looked at first).
/// When the new replica has gone, the old one sweeps again under its own
/// settings, and makes every device due once since they changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_rolling_change_of_a_ttl_the_replica_started_later_sweeps() {
    let mut env = with_an_hour_ttl().await;
    env.hub.replica = "old".into();
    let (old, old_trigger, old_task) = start_hub(&env).await;
    let (id, t0) = quarantined(&env, "gpu-roll-01").await;
    eventually(
        "the only replica sweeps and records its settings",
        || async {
            (old.metrics.sweeping.get() == 1
                && sweep_settings(&env).await == (old.sweep_settings.clone(), false))
                .then_some(())
        },
    )
    .await;

    // The new replica's TTL runs out soon; the old one's in an hour.
    let short = ttl_out_soon_after_derived(&env, &id, t0).await;
    env.common.freshness.ttl.insert("openstack".into(), short);
    env.hub.replica = "new".into();
    let (new, new_trigger, new_task) = start_hub(&env).await;
    eventually(
        "the old replica leaves the sweep to the new one",
        || async {
            (old.metrics.sweeping.get() == 0 && new.metrics.sweeping.get() == 1).then_some(())
        },
    )
    .await;
    eventually_field(&env, &id, "operational_status", "unknown").await;
    assert_eq!(last_operational_cause(&env, &id).await, "sweep");
    assert_eq!(
        sweep_settings(&env).await,
        (new.sweep_settings.clone(), true),
        "the new settings, recorded while a replica with the old ones is live"
    );

    // The new replica stops (its heartbeat row goes with it): the old one is
    // the newest live again and sweeps under its own settings.
    stop(new_trigger, new_task).await;
    drop(new);
    eventually("the old replica sweeps again", || async {
        (old.metrics.sweeping.get() == 1
            && sweep_settings(&env).await == (old.sweep_settings.clone(), false))
            .then_some(())
    })
    .await;
    stop(old_trigger, old_task).await;
    drop(old);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_refuses_a_schema_that_is_behind() {
    let env = TestEnv::new().await;
    let mut common = env.common.clone();
    let fresh = format!("{}_empty", env.db_name);
    common.database.url = common.database.url.replace(&env.db_name, &fresh);
    fleet_store::ensure_database(&common.database.url)
        .await
        .unwrap();
    let err = fleet_hub::Hub::connect(common, env.hub.clone())
        .await
        .err()
        .expect("refuses to start")
        .to_string();
    assert!(err.contains("fleet migrate"), "{err}");
    let pool = fleet_store::connect(&admin_url(), 1).await.unwrap();
    sqlx::query(&format!("DROP DATABASE \"{fresh}\" WITH (FORCE)"))
        .execute(&pool)
        .await
        .unwrap();
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_events_continue_the_publishers_trace() {
    let (env, hub) = start().await;
    let id = env.create_device("s1", "gpu-t-01").await;
    let snap = openstack_as("s1", "gpu-t-01", micros(Utc::now()), Node::Maintenance);
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    publish_raw(
        &env,
        "openstack",
        snap.device.as_ref().unwrap(),
        1,
        Some(parent),
        snap.encode_to_vec(),
    )
    .await;
    let stream = env.js.get_stream(env.streams.status()).await.unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            filter_subject: env.subjects.status("operational", "s1", &id),
            ..Default::default()
        })
        .await
        .unwrap();
    let header = eventually("the quarantine event", || async {
        let mut batch = consumer.fetch().max_messages(10).messages().await.unwrap();
        let mut found = None;
        while let Some(Ok(m)) = batch.next().await {
            let e = v1::StatusChanged::decode(m.payload.as_ref()).unwrap();
            if e.to == "quarantine" {
                found = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("traceparent"))
                    .map(|v| v.to_string());
            }
        }
        found
    })
    .await;
    let tp: Vec<&str> = header.split('-').collect();
    assert_eq!(tp.len(), 4, "a valid traceparent: {header}");
    assert_eq!(
        tp[1], "4bf92f3577b34da6a3ce929d0e0e4736",
        "same trace as the publisher"
    );
    assert_ne!(tp[2], "00f067aa0ba902b7", "a span of its own");
    hub.stop(env).await;
}

/// `create_devices`: one transaction, one outcome per item in order, a
/// refused item refuses only itself, births as single creates have them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_devices_creates_many_and_refuses_item_by_item() {
    let (env, hub) = start().await;
    sqlx::query("INSERT INTO pools (id, site_id, kind) VALUES ('pd', 's1', 'metal-dedicated')")
        .execute(&env.pool)
        .await
        .unwrap();
    let existing = env.create_device("s1", "gpu-b-00").await;
    let mut list: Vec<v1::CreateDevice> = (1..=300)
        .map(|i| device("s1", &format!("gpu-b-{i:03}")))
        .collect();
    list.push(device("s1", "gpu-b-00")); // exists
    list.push(device("s1", "gpu-b-001")); // twice in the batch
    list.push(device("nowhere", "gpu-b-x")); // unknown site
    list.push(v1::CreateDevice {
        pool_id: "nopool".into(),
        ..device("s1", "gpu-b-y")
    });
    list.push(v1::CreateDevice {
        inventory_status: "sideways".into(),
        ..device("s1", "gpu-b-z")
    });
    list.push(v1::CreateDevice {
        pool_id: "pd".into(),
        ..device("s1", "gpu-b-dedicated")
    });
    list.push(device("s1", "")); // no name
    let r = env
        .command(
            "create_devices",
            0,
            C::CreateDevices(v1::CreateDevices { devices: list }),
        )
        .await;
    assert!(r.error.is_none(), "{r:?}");
    let Some(v1::hub_reply::Record::Created(created)) = &r.record else {
        panic!("create_devices answers create results: {r:?}");
    };
    let items = &created.results;
    assert_eq!(items.len(), 307);
    let code = |i: usize| {
        items[i]
            .error
            .as_ref()
            .map_or("OK", |e| fleet_proto::error_code_of(e.code).as_str_name())
            .to_string()
    };
    assert!((0..300).all(|i| code(i) == "OK" && items[i].id.starts_with("dev_")));
    assert_eq!(
        (300..307).map(code).collect::<Vec<_>>(),
        [
            "CONFLICT",
            "CONFLICT",
            "NOT_FOUND",
            "NOT_FOUND",
            "INVALID_ARGUMENT",
            "OK",
            "INVALID_ARGUMENT"
        ]
    );
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM devices WHERE name LIKE 'gpu-b-%' AND deleted_at IS NULL",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        n, 302,
        "the 300, the one that existed and the dedicated one; nothing refused was stored"
    );
    let role: String =
        sqlx::query_scalar("SELECT role FROM devices WHERE name = 'gpu-b-dedicated'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(role, "dedicated", "the pool kind decides the role");
    // Born like a single create: version 1, a birth row per tracked axis.
    let id = items[0].id.clone();
    assert_eq!(env.device_field(&id, "version").await, "1");
    let births = "SELECT count(*) FROM device_lifecycle_events WHERE device_id = $1";
    assert_eq!(
        scalar::<i64>(&env, births, &id).await,
        scalar::<i64>(&env, births, &existing).await
    );
    let cause: String = scalar(
        &env,
        "SELECT DISTINCT cause FROM device_lifecycle_events WHERE device_id = $1",
        &id,
    )
    .await;
    assert_eq!(cause, "command:create_devices:test");

    // Too many, or none: the request is refused and nothing is stored.
    let many: Vec<v1::CreateDevice> = (0..1001)
        .map(|i| device("s1", &format!("gpu-m-{i}")))
        .collect();
    let r = env
        .command(
            "create_devices",
            0,
            C::CreateDevices(v1::CreateDevices { devices: many }),
        )
        .await;
    assert_eq!(error_code(&r), "INVALID_ARGUMENT");
    let r = env
        .command(
            "create_devices",
            0,
            C::CreateDevices(v1::CreateDevices { devices: vec![] }),
        )
        .await;
    assert_eq!(error_code(&r), "INVALID_ARGUMENT");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM devices WHERE name LIKE 'gpu-m-%'")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);

    hub.stop_unchecked(env).await;
}

/// One batch holding the same unknown key more than once is one statement:
/// the sightings add up and the latest observation is the one kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolved_sightings_in_one_batch_are_merged() {
    let env = TestEnv::new().await;
    let t0 = micros(Utc::now());
    let at = |s: i64| t0 + chrono::Duration::seconds(s);
    let u =
        |key: &'static str, s: i64, payload: &'static [u8]| fleet_hub::store::devices::Unresolved {
            source: "slurm",
            site: "s1",
            key_kind: "name",
            key,
            observed_at: at(s),
            payload,
        };
    let mut tx = env.pool.begin().await.unwrap();
    fleet_hub::store::devices::record_unresolved(
        &mut tx,
        &[
            u("a", 1, b"a1"),
            u("b", 0, b"b0"),
            u("a", 3, b"a3"),
            u("a", 2, b"a2"),
        ],
    )
    .await
    .unwrap();
    fleet_hub::store::devices::record_unresolved(&mut tx, &[u("a", -1, b"old"), u("b", 4, b"b4")])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let rows: Vec<(String, i64, chrono::DateTime<Utc>, Vec<u8>)> = sqlx::query_as(
        "SELECT key, seen_count, observed_at, payload FROM unresolved_observations ORDER BY key",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            ("a".to_string(), 4, at(3), b"a3".to_vec()),
            ("b".to_string(), 2, at(4), b"b4".to_vec()),
        ]
    );
    env.cleanup().await;
}
