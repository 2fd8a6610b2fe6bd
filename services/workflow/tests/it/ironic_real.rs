//! Issue 16: the Ironic-direct arm of Image Node and Unimage Node (seed 002,
//! ADR-0042) against the real Ironic with fake hardware.

use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// How long a job that deploys or tears a node down may take.
const DEPLOY: Duration = Duration::from_secs(120);
/// How long any other job may take.
const WITHIN: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_then_unimage_a_standalone_node_end_to_end() {
    let (ironic, env, mesh) = Mesh::start().await;
    let site = &mesh.site;
    let mut devices = vec![];
    let mut nodes = vec![];
    for i in 0..2 {
        let name = unique(&format!("img{i}"));
        let uuid = ironic.available_node(&name).await;
        devices.push(device_for(&env, "s1", &name, &uuid).await);
        nodes.push(uuid);
    }
    for d in &devices {
        mirrored(&env, d, "available").await;
    }

    let job = create(&env, "image_node", &devices)
        .await
        .expect("image job created");
    assert_eq!(job.status, "pending");
    // Seed 002: "the status is empty until Temporal starts that device".
    assert!(
        job.devices.iter().all(|d| d.status.is_empty()),
        "{:?}",
        job.devices
    );
    let job = job_terminal(&env, &job.id, DEPLOY).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    let mut minted = vec![];
    for (d, uuid) in job.devices.iter().zip(&nodes) {
        assert_eq!(d.status, "succeeded");
        assert!(d.failure_code.is_empty());
        let n = ironic.node(uuid).await;
        // "drives Ironic from AVAILABLE through DEPLOYING to ACTIVE with the
        // per-site configured image, checksum, and config-drive public keys".
        assert_eq!(n["provision_state"], "active", "{n}");
        let instance = n["instance_uuid"].as_str().expect("bound").to_string();
        assert_eq!(instance.len(), 36);
        assert_eq!(n["instance_info"]["image_source"], site.image_source);
        assert_eq!(n["instance_info"]["image_checksum"], site.image_checksum);
        minted.push(instance);
    }
    assert_ne!(
        minted[0], minted[1],
        "each execution mints its own instance_uuid"
    );

    // The same devices cannot be imaged again while imaged: the node is
    // active with an instance this run did not mint.
    mirrored(&env, &devices[0], "active").await;
    let again = run_job(&env, "image_node", &devices[..1], WITHIN).await;
    assert_eq!(again.status, "failed");
    assert_eq!(again.devices[0].failure_code, "IRONIC_NODE_NOT_AVAILABLE");
    assert_eq!(
        ironic.node(&nodes[0]).await["instance_uuid"],
        minted[0],
        "nothing touched"
    );

    // Unimage: "ACTIVE/DEPLOYFAIL -> cleaning -> AVAILABLE, then atomically
    // clears the node's instance_uuid/instance_info".
    let job = run_job(&env, "unimage_node", &devices, DEPLOY).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    for uuid in &nodes {
        let n = ironic.node(uuid).await;
        assert_eq!(n["provision_state"], "available", "{n}");
        assert!(n["instance_uuid"].is_null(), "binding cleared: {n}");
        assert!(n["instance_info"].get("image_source").is_none(), "{n}");
    }
    // "An unbound node is already complete only when Ironic is AVAILABLE":
    // a second unimage succeeds without a write.
    let job = run_job(&env, "unimage_node", &devices[..1], WITHIN).await;
    assert_eq!(job.status, "succeeded");

    mesh.stop(ironic, env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_available_node_with_a_stale_instance_uuid_is_rejected_not_adopted() {
    let (ironic, env, mesh) = Mesh::start().await;
    let name = unique("stale");
    let uuid = ironic.available_node(&name).await;
    let stale = fleet_testkit::ironic::random_uuid();
    ironic
        .patch(
            &uuid,
            json!([{"op": "add", "path": "/instance_uuid", "value": stale}]),
        )
        .await;
    let device = device_for(&env, "s1", &name, &uuid).await;
    mirrored(&env, &device, "available").await;
    let job = run_job(&env, "image_node", &[device], WITHIN).await;
    assert_eq!(job.status, "failed");
    assert_eq!(job.devices[0].status, "failed");
    assert_failed(&job, "IRONIC_STALE_INSTANCE_UUID", &stale);
    let n = ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "available", "not deployed: {n}");
    assert_eq!(n["instance_uuid"], stale, "not adopted, not cleared: {n}");

    mesh.stop(ironic, env).await;
}

/// Seed 002: "A node already tearing down (DELETING/CLEANING/CLEANWAIT/
/// DELETED) is not re-fired"; the run waits for the teardown it found and
/// completes on observed AVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_already_cleaning_is_not_fired_again() {
    let (ironic, env, mesh) = Mesh::start().await;
    let name = unique("clean");
    // Cleans for 5 s on teardown.
    let uuid = ironic
        .available_node_with(&name, json!({"automated_clean": true}))
        .await;
    let device = device_for(&env, "s1", &name, &uuid).await;
    mirrored(&env, &device, "available").await;
    let job = run_job(&env, "image_node", &[&device], WITHIN).await;
    assert_eq!(job.status, "succeeded");

    // Someone else starts the teardown; the unimage job finds it cleaning.
    let (s, v) = ironic.provision(&uuid, json!({"target": "deleted"})).await;
    assert_eq!(s, 202, "{v}");
    eventually("the node is cleaning", || async {
        (ironic.node(&uuid).await["provision_state"] == "cleaning").then_some(())
    })
    .await;
    let job = run_job(&env, "unimage_node", &[&device], WITHIN).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    let d = &job.devices[0];
    // Never fired: no teardown request recorded and no refused (409) try.
    assert_ne!(d.step, "teardown_requested", "{d:?}");
    assert_eq!(d.attempts, 0, "{d:?}");
    let n = ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "available");
    assert!(n["instance_uuid"].is_null(), "{n}");

    mesh.stop(ironic, env).await;
}

/// "DEPLOYFAIL fails closed": a bound node in deploy failed is not
/// re-deployed or torn down by Image Node; Unimage Node admits it ("A bound
/// DEPLOYFAIL is admitted for this explicit cleanup") and returns it to
/// available.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_failed_fails_closed_and_unimage_cleans_it_up() {
    let (ironic, env, mesh) = Mesh::start().await;
    let name = unique("dfail");
    let uuid = ironic.available_node(&name).await;
    let device = device_for(&env, "s1", &name, &uuid).await;
    mirrored(&env, &device, "available").await;
    // Admitted while available...
    let first = run_job(&env, "image_node", &[&device], WITHIN).await;
    assert_eq!(first.status, "succeeded");
    // ... then the node is redeployed by hand with its only deploy step
    // disabled: Ironic ends in deploy failed ("No deploy steps returned by
    // the driver"), still bound.
    provisioned(&ironic, &uuid, "deleted", "available").await;
    let bound = fleet_testkit::ironic::random_uuid();
    ironic
        .patch(
            &uuid,
            json!([{"op": "add", "path": "/instance_uuid", "value": bound}]),
        )
        .await;
    let (s, v) = ironic
        .provision(
            &uuid,
            json!({"target": "active", "deploy_steps": [{"interface": "deploy", "step": "deploy", "args": {}, "priority": 0}]}),
        )
        .await;
    assert_eq!(s, 202, "{v}");
    eventually("the node is deploy failed", || async {
        (ironic.node(&uuid).await["provision_state"] == "deploy failed").then_some(())
    })
    .await;
    // The hub mirrors it as a failure state: admission refuses Image Node.
    eventually("the hub mirrors deploy failed", || async {
        (env.device_field(&device, "coalesce(ironic_provision_state, '')")
            .await
            == "deploy failed")
            .then_some(())
    })
    .await;
    let e = create(&env, "image_node", &[device.clone()])
        .await
        .unwrap_err();
    let fleet_workflow_client::WorkflowError::Ineligible { refusals, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(refusals[0].refusal, "ironic_failure_state");
    assert_eq!(refusals[0].detail, "deploy failed");
    // Unimage admits it and cleans it up.
    let job = run_job(&env, "unimage_node", &[&device], WITHIN).await;
    assert_eq!(job.status, "succeeded", "{:?}", job.devices);
    let n = ironic.node(&uuid).await;
    assert_eq!(n["provision_state"], "available");
    assert!(n["instance_uuid"].is_null(), "{n}");

    mesh.stop(ironic, env).await;
}

/// What the proxy in front of Ironic does with a node's first deploy
/// request.
#[derive(Clone, Copy, PartialEq)]
enum FirstDeploy {
    /// Ironic takes it, then an intermediary sends it again and the run
    /// gets the second answer: Ironic's refusal of a node already
    /// deploying.
    SentTwice,
    /// Ironic takes it and the run gets a 504: the outcome unknown.
    AnswerLost,
}

/// A proxy in front of the real Ironic that plays `FirstDeploy` on the
/// first deploy request of each node it is given, and forwards everything
/// else as it is.
async fn flaky_ironic(
    upstream: &str,
    plays: std::collections::HashMap<String, FirstDeploy>,
) -> (String, tokio::task::JoinHandle<()>) {
    use axum::body::Bytes;
    use axum::http::{HeaderMap, Method, StatusCode, Uri};
    use std::sync::{Arc, Mutex};

    let plays = Arc::new(Mutex::new(plays));
    let upstream = upstream.trim_end_matches('/').to_string();
    let client = reqwest::Client::new();
    let forward = move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
        let (plays, upstream, client) = (plays.clone(), upstream.clone(), client.clone());
        async move {
            let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            let send = || {
                let mut r = client.request(method.clone(), format!("{upstream}{path}"));
                for (k, v) in &headers {
                    if k != "host" && k != "content-length" {
                        r = r.header(k, v);
                    }
                }
                r.body(body.clone()).send()
            };
            let deploy = method == Method::PUT
                && uri.path().ends_with("/states/provision")
                && serde_json::from_slice::<serde_json::Value>(&body)
                    .is_ok_and(|b| b["target"] == "active");
            let play = deploy
                .then(|| {
                    let node = uri.path().split('/').nth(3).unwrap_or_default();
                    plays.lock().unwrap().remove(node)
                })
                .flatten();
            let first = send().await.expect("the proxy reaches Ironic");
            let answer = match play {
                None => first,
                Some(FirstDeploy::SentTwice) => send().await.expect("the proxy reaches Ironic"),
                Some(FirstDeploy::AnswerLost) => {
                    return (StatusCode::GATEWAY_TIMEOUT, Vec::new());
                }
            };
            let status = StatusCode::from_u16(answer.status().as_u16()).unwrap();
            (status, answer.bytes().await.unwrap_or_default().to_vec())
        }
    };
    let app = axum::Router::new().fallback(forward);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (url, task)
}

/// Seed 002's Image Node "never repeats a write the system already
/// shows": a deploy request Ironic took although the run never heard so
/// (the answer lost, or the request sent twice by something between them
/// and refused the second time) is the run's own; the run is not failed
/// by its own earlier write and does not send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_ironic_took_without_the_run_hearing_it_is_not_a_refusal() {
    let ironic = RealIronic::connect().await;
    let twice = unique("twice");
    let lost = unique("lost");
    let twice_uuid = ironic.available_node(&twice).await;
    let lost_uuid = ironic.available_node(&lost).await;
    let (url, proxy) = flaky_ironic(
        &ironic.url,
        [
            (twice_uuid.clone(), FirstDeploy::SentTwice),
            (lost_uuid.clone(), FirstDeploy::AnswerLost),
        ]
        .into_iter()
        .collect(),
    )
    .await;
    let (ironic, env, mesh) = Mesh::start_via(ironic, &url).await;
    let devices = [
        device_for(&env, "s1", &twice, &twice_uuid).await,
        device_for(&env, "s1", &lost, &lost_uuid).await,
    ];
    for d in &devices {
        mirrored(&env, d, "available").await;
    }
    let job = run_job(&env, "image_node", &devices, DEPLOY).await;
    assert_eq!(job.status, "succeeded", "{:#?}", job.devices);
    let pinned: Vec<(String, serde_json::Value)> =
        sqlx::query_as("SELECT device_id, pinned FROM job_devices WHERE job_id = $1")
            .bind(&job.id)
            .fetch_all(&env.pool)
            .await
            .unwrap();
    for (device, uuid) in devices.iter().zip([&twice_uuid, &lost_uuid]) {
        let n = ironic.node(uuid).await;
        assert_eq!(n["provision_state"], "active", "{n}");
        let p = &pinned.iter().find(|(d, _)| d == device).unwrap().1;
        assert_eq!(n["instance_uuid"], p["instance_uuid"], "{device}: {n}");
    }

    proxy.abort();
    mesh.stop(ironic, env).await;
}
