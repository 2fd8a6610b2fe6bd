//! Issue 14: hostile input on every request subject of the mesh. Every
//! responder (hub, placer, radar, gateway) answers garbage with its typed
//! reply carrying an error, and keeps serving.

use std::time::Duration;

use fleet_proto::{v1, Message};
use rand::{Rng, SeedableRng};

use crate::support::start_hub;
use crate::support::*;

const HUB_VERBS: &[&str] = &[
    "create_device",
    "create_devices",
    "cordon",
    "uncordon",
    "drain",
    "taint",
    "triage",
    "provision",
    "adopt",
    "revoke_identity",
    "delete_device",
    "write_condition",
    "enrollment_proof",
    "impairment_hold",
    "join",
    "join_devices",
    "set_maintenance",
    "apply_snapshot",
    "impairment_holds",
    "create_site",
    "update_site",
    "create_tenant",
    "update_tenant",
    "create_pool",
    "update_pool",
    "delete_inventory",
    "delegate",
    "no_such_verb",
];

/// Decodes a reply as its service's type and returns its error code.
type Decoder = fn(&[u8]) -> Option<Option<String>>;

/// Decodes `b` as `M` and names the code of the error `code` finds in it.
fn typed<M: Message + Default>(
    b: &[u8],
    code: impl FnOnce(M) -> Option<i32>,
) -> Option<Option<String>> {
    M::decode(b)
        .ok()
        .map(|r| code(r).map(|c| fleet_proto::error_code_of(c).as_str_name().to_string()))
}

fn hub(b: &[u8]) -> Option<Option<String>> {
    typed(b, |r: v1::HubReply| r.error.map(|e| e.code))
}
fn placer(b: &[u8]) -> Option<Option<String>> {
    typed(b, |r: v1::PlacerReply| r.error.map(|e| e.code))
}
fn radar(b: &[u8]) -> Option<Option<String>> {
    typed(b, |r: v1::RadarReply| r.error.map(|e| e.code))
}
fn join(b: &[u8]) -> Option<Option<String>> {
    typed(b, |r: v1::JoinReply| r.error.map(|e| e.code))
}
fn opened(b: &[u8]) -> Option<Option<String>> {
    typed(b, |r: v1::SessionOpened| r.error.map(|e| e.code))
}
fn ack(b: &[u8]) -> Option<Option<String>> {
    typed(b, |r: v1::HeartbeatAck| r.error.map(|e| e.code))
}
fn closed(b: &[u8]) -> Option<Option<String>> {
    typed(b, |r: v1::SessionClosed| r.error.map(|e| e.code))
}
fn relay(b: &[u8]) -> Option<Option<String>> {
    typed(b, |r: v1::RelayReply| r.error.map(|e| e.code))
}
fn ended(b: &[u8]) -> Option<Option<String>> {
    typed(b, |r: v1::SessionsEnded| r.error.map(|e| e.code))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_responder_answers_garbage_with_a_typed_error_and_keeps_serving() {
    let env = TestEnv::new().await;
    let (_hub, hub_stop, hub_task) = start_hub(&env).await;
    let (_gw, gw_stop, gw_task) = start_gateway(&env, |_| {}).await;
    let (placer_stop, shutdown) = fleet_runtime::Shutdown::new();
    let pc = fleet_placer::Config {
        listen: "127.0.0.1:0".into(),
        ..Default::default()
    };
    let placer_task = tokio::spawn(fleet_placer::service::run(
        env.common.clone(),
        pc,
        shutdown.clone(),
    ));
    let rc = fleet_radar::Config {
        listen: "127.0.0.1:0".into(),
        ..Default::default()
    };
    let radar_task = tokio::spawn(fleet_radar::run(env.common.clone(), rc, shutdown));

    let s = &env.subjects;
    let mut targets: Vec<(String, Decoder)> = HUB_VERBS
        .iter()
        .map(|v| (s.hub_cmd(v), hub as Decoder))
        .collect();
    for v in ["allocate", "release", "get", "capacity", "no_such_verb"] {
        targets.push((s.placer_cmd(v), placer));
    }
    for v in ["radar_ignore", "no_such_verb"] {
        targets.push((s.radar_cmd(v), radar));
    }
    targets.push((s.agent_join(), join));
    targets.push((s.agent("dev_x", "open"), opened));
    targets.push((s.agent("dev_x", "heartbeat"), ack));
    targets.push((s.agent("dev_x", "close"), closed));
    targets.push((s.gateway_cmd("relay"), relay));
    targets.push((s.gateway_cmd("end_sessions"), ended));

    let mut rng = rand::rngs::StdRng::seed_from_u64(14);
    let malformed: Vec<Vec<u8>> = vec![
        vec![0xff; 8],
        vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f],
        vec![0x0a, 0x05, b'a', 0x00],
    ];
    let random: Vec<Vec<u8>> = (0..6)
        .map(|i| {
            (0..[1, 16, 64, 512, 4096, 200_000][i])
                .map(|_| rng.gen())
                .collect()
        })
        .collect();
    let mut wrong = vec![];
    for (subject, decode) in &targets {
        for (i, payload) in malformed.iter().chain(&random).enumerate() {
            let reply = eventually("an answer", || {
                let (nats, subject, payload) = (env.nats.clone(), subject.clone(), payload.clone());
                async move {
                    tokio::time::timeout(
                        Duration::from_secs(5),
                        nats.request(subject, payload.into()),
                    )
                    .await
                    .ok()?
                    .ok()
                }
            })
            .await;
            match decode(&reply.payload) {
                None => wrong.push(format!("{subject}: an untyped reply")),
                Some(None) if i < malformed.len() => wrong.push(format!(
                    "{subject}: malformed input {i} answered without an error"
                )),
                Some(_) => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Everyone still serves: a real command goes through.
    let id = env.create_device("s1", "gpu-g-01").await;
    assert!(id.starts_with("dev_"));
    placer_stop.trigger();
    placer_task.await.unwrap().unwrap();
    radar_task.await.unwrap().unwrap();
    stop(gw_stop, gw_task).await;
    stop(hub_stop, hub_task).await;
    env.cleanup().await;
}
