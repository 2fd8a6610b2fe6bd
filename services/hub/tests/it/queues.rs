//! The gateway's session events are applied ahead of a backlog of the
//! connectors' reads: they are in a partition's session queue, which the
//! hub consumes with a consumer of its own and takes first into a batch.

use chrono::Utc;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opened_behind_a_backlog_of_reads_is_applied_first() {
    const DEVICES: usize = 400;
    let mut env = TestEnv::new().await;
    // One lane and small batches: the backlog is many batches long.
    env.hub.lanes = 1;
    env.hub.batch_size = 8;
    let (hub, trigger, task) = start_hub(&env).await;
    let live = env.create_device("s1", "gpu-live").await;
    // Devices whose reads are in the session's partition, so that every
    // read is ahead of it there.
    let partitions = env.common.nats.partitions;
    let partition = fleet_bus::partition(&format!("s1/device_id/{live}"), partitions);
    let names: Vec<String> = (0..)
        .map(|n| format!("gpu-busy-{n:04}"))
        .filter(|name| fleet_bus::partition(&format!("s1/name/{name}"), partitions) == partition)
        .take(DEVICES)
        .collect();
    let mut busy = Vec::with_capacity(DEVICES);
    for name in &names {
        busy.push(env.create_device("s1", name).await);
    }
    stop(trigger, task).await;
    drop(hub);

    // The hub is down while a connector's first reads pile up (each one a
    // device's first snapshot of the source) and then an agent opens its
    // session.
    let t0 = micros(Utc::now());
    for name in &names {
        let read = snapshot(
            "slurm",
            "s1",
            "name",
            name,
            t0,
            vec![
                cond("SlurmRegistered", "True", "Registered"),
                cond("SlurmNodeHealthy", "False", "Drained"),
            ],
        );
        env.publish_snapshot(&read).await;
    }
    env.publish_connectivity(&live, 1, "opened", t0).await;

    let hub = RunningHub::start(&env).await;
    let last = busy.last().cloned().unwrap_or_default();
    eventually("every read applied", || async {
        observed_at(&env, &last, "slurm").await.filter(|t| *t == t0)
    })
    .await;
    eventually_field(&env, &live, "connectivity", "connected").await;

    // Where the session's change is in the order the hub applied things:
    // a batch's time is when its rows were received, and one lane applies
    // one batch after another.
    let (before, total): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE received_at < (SELECT min(created_at) FROM device_lifecycle_events \
                                                      WHERE device_id = $1 AND kind = 'connectivity' AND value = 'connected')), \
                count(*) \
           FROM device_conditions WHERE type = 'SlurmRegistered'",
    )
    .bind(&live)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    println!("devices whose first read was applied before the session opened: {before} of {total}");
    assert_eq!(total, DEVICES as i64, "each read changed its device");
    assert!(
        before < total / 4,
        "the session waited behind {before} of the {total} reads"
    );
    hub.stop(env).await;
}
