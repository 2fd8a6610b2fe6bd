//! A device another transaction holds (another lane's batch, a command)
//! does not hold back the rest of its batch: the batch's other devices are
//! applied while it is held, and its own messages after, in their order,
//! once each.

use std::time::Duration;

use chrono::Utc;

use crate::support::*;

fn slurm(
    name: &str,
    at: chrono::DateTime<Utc>,
    healthy: &str,
    reason: &str,
) -> fleet_proto::v1::ConditionSnapshot {
    snapshot(
        "slurm",
        "s1",
        "name",
        name,
        at,
        vec![
            cond("SlurmRegistered", "True", "Registered"),
            cond("SlurmNodeHealthy", healthy, reason),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_device_waits_alone_and_keeps_its_order() {
    let mut env = TestEnv::new().await;
    // One lane, and a linger long enough that the three messages below,
    // waiting in the stream when the hub starts, are one batch: before,
    // that batch waited for the held device as a whole.
    env.hub.lanes = 1;
    env.hub.linger = Duration::from_millis(300);
    let (hub, trigger, task) = start_hub(&env).await;
    let held = env.create_device("s1", "gpu-held-01").await;
    let free = env.create_device("s1", "gpu-free-01").await;
    stop(trigger, task).await;
    drop(hub);

    let holder = hold(&env, &held).await;
    let t0 = micros(Utc::now());
    let t1 = t0 + chrono::Duration::seconds(1);
    env.publish_snapshot(&slurm("gpu-held-01", t0, "False", "Drained"))
        .await;
    env.publish_snapshot(&slurm("gpu-held-01", t1, "True", "Idle"))
        .await;
    env.publish_snapshot(&slurm("gpu-free-01", t0, "True", "Idle"))
        .await;
    // A key that names no device, in the same batch: the batch's one
    // statement that resolves and locks (issue 20) leaves it out as it
    // leaves out the held device, and only the held one waits.
    env.publish_snapshot(&slurm("gpu-ghost-01", t0, "True", "Idle"))
        .await;

    let hub = RunningHub::start(&env).await;
    eventually(
        "the free device applied while the other is held",
        || async { observed_at(&env, &free, "slurm").await.filter(|t| *t == t0) },
    )
    .await;
    assert_eq!(observed_at(&env, &held, "slurm").await, None);
    let ghost = || async {
        optional_row::<(i64,)>(
            &env,
            "SELECT seen_count FROM unresolved_observations WHERE source = 'slurm' AND key = $1",
            "gpu-ghost-01",
        )
        .await
    };
    eventually(
        "the unknown key recorded while the device is held",
        || async { ghost().await.filter(|c| c.0 == 1) },
    )
    .await;

    holder.commit().await.unwrap();
    eventually("the held device applied once it is let go", || async {
        observed_at(&env, &held, "slurm").await.filter(|t| *t == t1)
    })
    .await;
    let healthy: (String, String) = row(
        &env,
        "SELECT status, reason FROM device_conditions WHERE device_id = $1 AND type = 'SlurmNodeHealthy'",
        &held,
    )
    .await;
    assert_eq!(healthy, ("True".to_string(), "Idle".to_string()));
    assert_eq!(
        ghost().await,
        Some((1,)),
        "the unknown key is recorded once"
    );
    // Counted once their batch is done.
    assert!(
        hub.metrics.deferred.get() >= 2,
        "both of the held device's messages were deferred"
    );
    outbox_drained(&env).await;
    // In order and once each: the earlier snapshot's status first, then
    // the later one's change from it.
    let changes: Vec<(String, String)> = status_events(&env, &held)
        .await
        .into_iter()
        .flat_map(|e| e.conditions)
        .filter(|c| c.condition_type == "SlurmNodeHealthy")
        .map(|c| (c.from_status, c.to_status))
        .collect();
    assert_eq!(
        changes,
        [
            (String::new(), "False".to_string()),
            ("False".to_string(), "True".to_string())
        ]
    );
    hub.stop(env).await;
}
