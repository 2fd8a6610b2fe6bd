//! The outbox publisher after a NATS server is lost: PubAcks that never
//! come cost the publisher (a hub lane, the relay) one PubAck timeout, not
//! one per row. Found by the three-node cluster test: one at a time, the
//! 57 lost acks of a batch held a lane, and its partition, for minutes.

use std::time::{Duration, Instant};

use fleet_outbox::Pending;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_pubacks_cost_one_timeout_not_one_per_row() {
    let env = TestEnv::new().await;
    // A subscriber that takes every publish and never answers: to the
    // publisher, a server that stored nothing and sent no PubAck.
    let subject = format!("{}.lost-pubacks", env.common.nats.subject_root);
    let _silent = env.nats.subscribe(subject.clone()).await.unwrap();
    env.nats.flush().await.unwrap();
    let mut js = async_nats::jetstream::new(env.nats.clone());
    js.set_timeout(Duration::from_millis(500));
    let rows: Vec<Pending> = (1..=20)
        .map(|id| Pending {
            id,
            subject: subject.clone(),
            schema: "fleet.v1.StatusChanged".into(),
            payload: vec![],
            traceparent: None,
        })
        .collect();

    let started = Instant::now();
    let acked = fleet_outbox::HUB.publish(&js, &rows).await;
    let held = started.elapsed();

    assert!(
        acked.is_empty(),
        "a row without its PubAck is not published: {acked:?}"
    );
    // One at a time, the 20 lost acks would hold it 20 x 500 ms = 10 s.
    assert!(
        held < Duration::from_secs(5),
        "20 lost PubAcks held the publisher {held:?}"
    );
    env.cleanup().await;
}
