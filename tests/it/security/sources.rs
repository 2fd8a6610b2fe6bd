//! Issue 14, item 1: no publisher can pose as another source. The hub reads
//! the source at its fixed position of `<root>.obs.<source>.<partition>.<device>`
//! and requires the message's own source to equal it; anything else is
//! dead-lettered with its reason and counted. Against a live nats-server
//! running the shipped `nats.conf`, with the hub logged in as `hub`.

use std::time::Duration;

use chrono::Utc;
use fleet_proto::{timestamp, v1, Message};

use super::shipped::*;
use crate::support::*;

fn openstack_quarantine(device: &v1::DeviceKey) -> v1::ConditionSnapshot {
    v1::ConditionSnapshot {
        resource_bindings: vec![],
        source: "openstack".into(),
        device: Some(device.clone()),
        observed_at: Some(timestamp(Utc::now())),
        conditions: vec![v1::Condition {
            r#type: "IronicMaintenance".into(),
            status: "True".into(),
            reason: "Posing".into(),
            message: String::new(),
        }],
        mirror: None,
    }
}

async fn raw_publish(
    js: &async_nats::jetstream::Context,
    subject: String,
    payload: Vec<u8>,
) -> Result<(), String> {
    let ack = fleet_bus::publish(
        js,
        subject,
        &ulid::Ulid::new().to_string(),
        fleet_bus::headers(&fleet_proto::schema::<v1::ConditionSnapshot>(), None),
        payload.into(),
    )
    .await
    .map_err(|e| e.to_string())?;
    tokio::time::timeout(Duration::from_secs(3), ack)
        .await
        .map_err(|_| "no ack".to_string())?
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_cannot_pose_as_another_source() {
    let nats = ShippedNats::cluster().await;
    let env = nats.env().await;
    let c = nats.service_config("hub", &env);
    let hub = fleet_hub::Hub::connect(c.common(), c.hub)
        .await
        .expect("the hub starts as user hub");
    let (trigger, shutdown) = fleet_runtime::Shutdown::new();
    let task = tokio::spawn(fleet_hub::run_with(hub.clone(), shutdown));
    let id = env.create_device("s1", "gpu-pose-01").await;
    let key = v1::DeviceKey {
        site: "s1".into(),
        kind: "name".into(),
        key: "gpu-pose-01".into(),
    };
    let p = fleet_bus::partition("s1/name/gpu-pose-01", env.common.nats.partitions);
    let device = fleet_bus::subjects::device_token(&key);
    let attack = format!("fleet.obs.slurm.{p}.openstack.0.{device}");
    let posing = openstack_quarantine(&key).encode_to_vec();

    // connector-slurm, as compose configures it.
    let slurm = nats.service_config("connector-slurm", &env);
    let slurm = fleet_bus::connect_now(&slurm.nats, "fleet-connector-slurm")
        .await
        .unwrap();
    let slurm_js = async_nats::jetstream::new(slurm);
    // 1. The shipped permissions refuse the longer subject outright.
    assert!(
        raw_publish(&slurm_js, attack.clone(), posing.clone())
            .await
            .is_err(),
        "the server stored {attack} from connector-slurm"
    );
    // 2. Its own subject with another source in the message: the hub
    //    dead-letters it as forbidden_source.
    let own = format!("fleet.obs.slurm.{p}.{device}");
    raw_publish(&slurm_js, own.clone(), posing.clone())
        .await
        .expect("its own subject is allowed");
    // 2b. Its own source on a session queue (its permission allows the
    //     token): only the gateway's observations jump the reads' queue,
    //     the hub dead-letters it as an invalid subject.
    let jump = format!("fleet.obs.slurm.s{p}.{device}");
    let mut jumping = openstack_quarantine(&key);
    jumping.source = "slurm".into();
    raw_publish(&slurm_js, jump.clone(), jumping.encode_to_vec())
        .await
        .expect("the token is within its permission");
    // 3. A publisher with wider rights than a connector has (an older
    //    nats.conf, a misconfigured user): the hub itself refuses the shape.
    raw_publish(&env.js, attack.clone(), posing.clone())
        .await
        .expect("test-admin may publish");
    // 4. A proper slurm snapshot behind them is applied.
    let mut snap = openstack_quarantine(&key);
    snap.source = "slurm".into();
    snap.conditions = vec![v1::Condition {
        r#type: "SlurmRegistered".into(),
        status: "True".into(),
        reason: "Registered".into(),
        message: String::new(),
    }];
    raw_publish(&slurm_js, own.clone(), snap.encode_to_vec())
        .await
        .unwrap();

    let env_ref = &env;
    let sources: Vec<String> = eventually("the slurm snapshot applied", || {
        let id = id.clone();
        async move {
            let rows: Vec<String> = sqlx::query_scalar(
                "SELECT source FROM device_source_freshness WHERE device_id = $1",
            )
            .bind(&id)
            .fetch_all(&env_ref.pool)
            .await
            .unwrap();
            rows.contains(&"slurm".to_string()).then_some(rows)
        }
    })
    .await;
    assert!(!sources.contains(&"openstack".to_string()), "{sources:?}");
    assert_eq!(env.device_field(&id, "operational_status").await, "unknown");

    // Both dead-lettered, each with its reason and the subject it came on.
    let mut seen = vec![];
    for m in env.dead_letters().await {
        let h = m.headers.clone().unwrap_or_default();
        seen.push((
            m.subject.to_string(),
            h.get(fleet_bus::HEADER_DLQ_SUBJECT)
                .map(|v| v.to_string())
                .unwrap_or_default(),
        ));
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (
                "fleet.dlq.observations.forbidden_source".to_string(),
                own.clone()
            ),
            (
                "fleet.dlq.observations.invalid_subject".to_string(),
                attack.clone()
            ),
            (
                "fleet.dlq.observations.invalid_subject".to_string(),
                jump.clone()
            ),
        ]
    );
    // And counted.
    let count = |reason: &str| {
        hub.metrics
            .dead_lettered
            .get_or_create(&vec![("reason".to_string(), reason.to_string())])
            .get()
    };
    assert_eq!(count("invalid_subject"), 2);
    assert_eq!(count("forbidden_source"), 1);
    trigger.trigger();
    task.await.unwrap().unwrap();
    env.cleanup().await;
}
