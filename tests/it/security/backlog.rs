//! Issue 14, item 8: observations nobody reads are bounded and seen.
//! `OBSERVATIONS` has an age and size limit, publishers and the hub agree
//! on the partition count at start, and messages on a partition no hub
//! consumes are counted.

use fleet_domain::Source;

use crate::support::start_hub;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconsumed_observations_are_bounded_refused_at_start_and_counted() {
    let env = TestEnv::new().await;
    let (hub, trigger, task) = start_hub(&env).await;

    let mut s = env.js.get_stream(env.streams.observations()).await.unwrap();
    let info = s.info().await.unwrap();
    assert!(
        info.config.max_age.as_secs() > 0,
        "OBSERVATIONS keeps messages forever"
    );
    assert!(
        info.config.max_bytes > 0,
        "OBSERVATIONS may grow without bound"
    );
    assert_eq!(
        info.config.discard,
        async_nats::jetstream::stream::DiscardPolicy::New
    );
    assert_eq!(
        fleet_bus::streams::partitions_in(info.config.description.as_deref()),
        Some(env.common.nats.partitions)
    );

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

    // A message on a partition no hub consumes is counted, not lost in silence.
    let p = env.common.nats.partitions + 3;
    let subject = format!("{}.obs.slurm.{p}.name-x", env.common.nats.subject_root);
    env.js
        .publish(subject, "x".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let b = hub.backlog().await.unwrap();
    assert_eq!(b.unconsumed, 1, "{b:?}");
    // The hub's loop reads the consumers (a scan on nats-server 2.9) only
    // once the stream's oldest message has waited a whole period: until
    // then the count alone says nothing has been left unconsumed.
    let hour = std::time::Duration::from_secs(3600);
    let quick = hub.quick_backlog(hour).await.unwrap().unwrap();
    assert_eq!((quick.pending, quick.unconsumed), (quick.messages, 0));
    assert!(quick.messages >= 1, "{quick:?}");
    assert_eq!(
        hub.quick_backlog(std::time::Duration::ZERO).await.unwrap(),
        None,
        "a message older than the period needs the readings"
    );
    stop(trigger, task).await;
    env.cleanup().await;
}
