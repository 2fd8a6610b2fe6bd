//! A gateway to run against the environment.

use std::sync::Arc;

use fleet_gateway::Gateway;
use fleet_runtime::shutdown::ShutdownTrigger;

use crate::{eventually, spawn_service, TestEnv};

/// Runs a gateway (with `f`'s settings) until its trigger fires; returns
/// once every route answers.
pub async fn start_gateway(
    env: &TestEnv,
    f: impl FnOnce(&mut fleet_gateway::Config),
) -> (Arc<Gateway>, ShutdownTrigger, tokio::task::JoinHandle<()>) {
    let mut config = fleet_gateway::Config {
        listen: "127.0.0.1:0".into(),
        gateway_id: "gw-test".into(),
        ..Default::default()
    };
    f(&mut config);
    let gw = Gateway::connect(env.common.clone(), config)
        .await
        .expect("gateway connects");
    let g = gw.clone();
    let (trigger, task) = spawn_service("the gateway", |s| fleet_gateway::run_with(g, s));
    for subject in [
        env.subjects.agent_join(),
        env.subjects.agent("dev_probe", "open"),
        env.subjects.agent("dev_probe", "heartbeat"),
        env.subjects.agent("dev_probe", "close"),
        env.subjects.gateway_cmd("relay"),
        env.subjects.gateway_cmd("end_sessions"),
    ] {
        eventually("the gateway answers", || {
            let (nats, subject) = (env.nats.clone(), subject.clone());
            async move {
                nats.request(subject, vec![0xff].into())
                    .await
                    .ok()
                    .map(|_| ())
            }
        })
        .await;
    }
    (gw, trigger, task)
}
