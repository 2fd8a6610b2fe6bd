//! Issue 20, "Scale out on NATS's own clustering": a 3-node nats-server
//! cluster on loopback ports with every stream at three replicas, and
//! three hub replicas sharing the partitions through their leases
//! (docs/scaling.md). Snapshots stream in while a hub replica is killed
//! with SIGKILL and then a NATS server (the leader of partition 0's reads
//! stream); at the
//! end every observation is applied exactly once, no `StatusChanged` is
//! published twice, and the lifecycle log equals in-order application.

use std::time::{Duration, Instant};

use fleet_testkit::nats_cluster::NatsCluster;

use crate::crash::{assert_applied_once, live_leases, plan_snapshots, publish_all, spawn_hub};
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hubs_on_a_three_node_cluster_lose_a_replica_and_a_server_and_apply_everything_once()
{
    let mut cluster = NatsCluster::start(3).await;
    let url = cluster.url();
    let env = TestEnv::with_nats_config(move |n| {
        n.url = url;
        n.num_replicas = 3;
        // Two partitions a replica, three after one is lost.
        n.partitions = 6;
    })
    .await;
    for (_, _, name) in env.streams.observations_all(env.common.nats.partitions) {
        let mut observations = env.js.get_stream(&name).await.expect("observation stream");
        let info = observations.info().await.expect("stream info");
        assert_eq!(info.config.num_replicas, 3, "{name} runs at R3");
    }

    let log = std::env::temp_dir().join(format!("{}-cluster-hubs.log", env.db_name));
    let mut hubs: Vec<Reaped> = ["replica-a", "replica-b", "replica-c"]
        .iter()
        .map(|r| Reaped::new(spawn_hub(&env, &log, r)))
        .collect();
    let partitions = env.common.nats.partitions as usize;

    let devices = 16;
    let mut ids = vec![];
    for i in 0..devices {
        ids.push(env.create_device("s1", &format!("gpu-x-{i:02}")).await);
    }
    eventually_within(
        "the three replicas share every partition",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let l = live_leases(&env).await;
            let held: usize = l.values().map(Vec::len).sum();
            (l.len() == 3 && held == partitions).then_some(())
        },
    )
    .await;

    let (plan, order) = plan_snapshots(0xc1a5, devices, 90);
    let publisher = publish_all(&env, order);

    // A hub replica first: the other two take its partitions over.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let victim = live_leases(&env)
        .await
        .into_keys()
        .next()
        .expect("a replica holds leases");
    let index = ["replica-a", "replica-b", "replica-c"]
        .iter()
        .position(|r| *r == victim)
        .expect("a known replica");
    hubs[index].stop("KILL", Duration::from_secs(10)).await;
    let killed = Instant::now();
    eventually_within(
        "the two survivors hold every partition",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            let l = live_leases(&env).await;
            let held: usize = l.values().map(Vec::len).sum();
            (!l.contains_key(&victim) && held == partitions).then_some(())
        },
    )
    .await;
    let takeover = killed.elapsed();
    println!(
        "takeover of {victim}'s partitions: {:.2} s after SIGKILL (hub.lease_ttl 3 s)",
        takeover.as_secs_f64()
    );

    // Then the NATS server that leads partition 0's reads stream: a new
    // leader is elected among the other two, and publishers and hubs carry
    // on.
    let mut observations = env
        .js
        .get_stream(env.streams.observations(fleet_bus::Queue::Reads, 0))
        .await
        .expect("partition 0's reads stream");
    let leader = observations
        .info()
        .await
        .ok()
        .and_then(|i| i.cluster.as_ref().and_then(|c| c.leader.clone()))
        .expect("the stream has a leader");
    let server = cluster.index_of(&leader).expect("a server of the cluster");
    assert!(
        !publisher.is_finished(),
        "the NATS server is lost mid-stream, not after it"
    );
    cluster.kill(server);
    println!("killed NATS server {leader} (the leader of partition 0's reads stream)");

    tokio::time::timeout(Duration::from_secs(120), publisher)
        .await
        .unwrap_or_else(|_| panic!("the publisher did not finish\n{}", cluster.logs()))
        .unwrap();
    assert_applied_once(&env, &ids, &plan, &log).await;
    drop(hubs);
    let _ = std::fs::remove_file(&log);
    env.cleanup().await;
    drop(cluster);
}
