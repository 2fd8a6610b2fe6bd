//! Issue 14, item 8: observations nobody reads are bounded and seen. The
//! observation streams (one per partition and queue) have an age and size
//! limit, publishers and the hub agree on the partition count at start, a
//! partition the mesh does not have is refused at publish, and messages in
//! a stream no hub consumes are counted. Issue 20: a hub replaces the one
//! observation stream of earlier versions only once it is empty.

use fleet_domain::Source;

use crate::support::start_hub;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconsumed_observations_are_bounded_refused_at_start_and_counted() {
    let env = TestEnv::new().await;
    let (hub, trigger, task) = start_hub(&env).await;

    let all = env.streams.observations_all(env.common.nats.partitions);
    assert_eq!(all.len() as u32, 2 * env.common.nats.partitions);
    for (queue, p, name) in &all {
        let mut s = env.js.get_stream(name).await.unwrap();
        let info = s.info().await.unwrap();
        assert!(
            info.config.max_age.as_secs() > 0,
            "{name} keeps messages forever"
        );
        assert!(info.config.max_bytes > 0, "{name} may grow without bound");
        assert_eq!(
            info.config.discard,
            async_nats::jetstream::stream::DiscardPolicy::New
        );
        assert_eq!(
            fleet_bus::streams::partitions_in(info.config.description.as_deref()),
            Some(env.common.nats.partitions)
        );
        assert_eq!(
            info.config.subjects,
            vec![env.subjects.obs_partition(*queue, *p)],
            "{name} holds exactly one queue of one partition"
        );
    }

    // A connector (and a second hub) with another partition count refuse
    // to start, saying why.
    let mut other = env.common.clone();
    other.nats.partitions = env.common.nats.partitions * 2;
    let (_t, shutdown) = fleet_runtime::Shutdown::new();
    let e = fleet_connector::Runtime::start(&other, Source::Slurm, "127.0.0.1:0", shutdown)
        .await
        .err()
        .expect("a connector with another nats.partitions starts");
    assert!(format!("{e:#}").contains("nats.partitions"), "{e:#}");
    let e = fleet_hub::Hub::connect(other, env.hub.clone())
        .await
        .err()
        .expect("a hub with another P starts");
    assert!(format!("{e:#}").contains("nats.partitions"), "{e:#}");

    // A partition this mesh does not have has no stream: the publish is
    // refused (a publisher retries it and its failure metric rises), not
    // kept where no hub looks.
    let root = &env.common.nats.subject_root;
    let p = env.common.nats.partitions + 3;
    let refused = async {
        env.js
            .publish(format!("{root}.obs.slurm.{p}.name-x"), "x".into())
            .await?
            .await
    }
    .await;
    assert!(refused.is_err(), "a publish to partition {p} was stored");

    // A stream with no hub consumer: what waits there a whole period is
    // counted as unconsumed, not lost in silence. The hub is stopped and
    // partition 0's reads consumer removed, as if no replica took it.
    stop(trigger, task).await;
    let reads0 = env.streams.observations(fleet_bus::Queue::Reads, 0);
    env.js
        .delete_consumer_from_stream(fleet_bus::Queue::Reads.consumer(0), &reads0)
        .await
        .unwrap();
    publish_to_partition_0(&env).await;
    let b = hub.backlog(std::time::Duration::ZERO).await.unwrap();
    assert_eq!((b.messages, b.unconsumed), (1, 1), "{b:?}");
    // Younger than the period it may be a consumer being re-created.
    let hour = std::time::Duration::from_secs(3600);
    let b = hub.backlog(hour).await.unwrap();
    assert_eq!((b.messages, b.pending, b.unconsumed), (1, 1, 0), "{b:?}");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_replaces_the_single_observation_stream_only_once_it_is_empty() {
    let env = TestEnv::new().await;
    // An installation of an earlier version: one stream of every
    // observation, holding one the previous hub has not applied.
    for (_, _, name) in env.streams.observations_all(env.common.nats.partitions) {
        env.js.delete_stream(&name).await.unwrap();
    }
    let legacy = env.streams.legacy_observations();
    let mut old = env
        .js
        .create_stream(async_nats::jetstream::stream::Config {
            name: legacy.clone(),
            subjects: vec![env.subjects.obs_all()],
            retention: async_nats::jetstream::stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .unwrap();
    publish_to_partition_0(&env).await;

    let e = fleet_hub::Hub::connect(env.common.clone(), env.hub.clone())
        .await
        .err()
        .expect("a hub starts beside an old stream that holds messages");
    assert!(format!("{e:#}").contains("still holds 1 messages"), "{e:#}");
    // Nothing changed: the message is where it was, no new stream exists.
    assert_eq!(old.info().await.unwrap().state.messages, 1);
    let first = env.streams.observations(fleet_bus::Queue::Reads, 0);
    assert!(env.js.get_stream(&first).await.is_err(), "{first} was made");

    // Drained (the previous hub applied it), the old stream goes and the
    // new ones are made.
    old.purge().await.unwrap();
    let hub = fleet_hub::Hub::connect(env.common.clone(), env.hub.clone())
        .await
        .expect("the hub starts once the old stream is empty");
    assert!(
        env.js.get_stream(&legacy).await.is_err(),
        "{legacy} is left"
    );
    for (_, _, name) in env.streams.observations_all(env.common.nats.partitions) {
        assert!(env.js.get_stream(&name).await.is_ok(), "{name} is missing");
    }
    drop(hub);
    env.cleanup().await;
}

/// One observation on partition 0's reads, stored (its PubAck awaited).
async fn publish_to_partition_0(env: &TestEnv) {
    let root = &env.common.nats.subject_root;
    env.js
        .publish(format!("{root}.obs.slurm.0.name-x"), "x".into())
        .await
        .unwrap()
        .await
        .unwrap();
}
