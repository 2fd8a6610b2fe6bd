//! Eligibility at job creation through the workflow service: one pass,
//! every refusal typed per device, nothing written when any device is
//! refused.

use fleet_proto::ErrorCode;
use fleet_workflow_client::WorkflowError;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_device_refuses_the_job_and_writes_nothing() {
    let env = TestEnv::new().await;
    standalone_site(&env).await;
    let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
    let (_w, trigger, task) = start_workflow(&env, |_| {}).await;
    let ok = env.create_device("s1", "gpu-elig-01").await;
    let inventory = env.create_device("inv", "gpu-elig-02").await;
    // s2 keeps Nova and Placement: the Nova arm is not run by this build.
    let nova = env.create_device("s2", "gpu-elig-03").await;
    // Image admission: "requires authoritative maintenance=false".
    sqlx::query("UPDATE devices SET ironic_maintenance = true, ironic_provision_state = 'available' WHERE id = $1")
        .bind(&ok)
        .execute(&env.pool)
        .await
        .unwrap();

    let e = create(
        &env,
        "image_node",
        &[ok.clone(), inventory.clone(), nova.clone()],
    )
    .await
    .unwrap_err();
    let WorkflowError::Ineligible { refusals, .. } = &e else {
        panic!("{e:?}")
    };
    let got: Vec<(&str, &str)> = refusals
        .iter()
        .map(|r| (r.device_id.as_str(), r.refusal.as_str()))
        .collect();
    assert!(
        got.contains(&(inventory.as_str(), "DEVICE_INVENTORY_ONLY")),
        "{got:?}"
    );
    assert!(
        got.contains(&(ok.as_str(), "ironic_maintenance_not_false")),
        "{got:?}"
    );
    assert!(got.contains(&(nova.as_str(), "backend_not_run")), "{got:?}");
    assert_eq!(e.code(), ErrorCode::Ineligible);
    let jobs = count(&env, "SELECT count(*) FROM jobs", None).await;
    let outbox = count(&env, "SELECT count(*) FROM workflow_outbox", None).await;
    assert_eq!((jobs, outbox), (0, 0), "nothing written");

    // Bad input: typed, nothing written.
    let e = create(&env, "not_a_workflow", &[ok.clone()])
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e:?}");
    let e = create(&env, "image_node", &[]).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    let e = create(&env, "image_node", &["dev_nope".into()])
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);

    // One workflow per device: a second job on a device whose job is not
    // over is refused as concurrent_workflow_running. (No site config: the
    // first job's device fails SITE_NOT_CONFIGURED, then the device is free.)
    sqlx::query("UPDATE devices SET ironic_maintenance = false WHERE id = $1")
        .bind(&ok)
        .execute(&env.pool)
        .await
        .unwrap();
    let first = create(&env, "image_node", &[ok.clone()])
        .await
        .expect("admitted");
    let done = job_terminal(&env, &first.id, std::time::Duration::from_secs(30)).await;
    assert_eq!(done.status, "failed");
    assert_eq!(done.devices[0].failure_code, "SITE_NOT_CONFIGURED");
    let pending = count(&env, "SELECT count(*) FROM workflow_outbox", None).await;
    assert_eq!(pending, 0, "the relay published the work");

    stop(trigger, task).await;
    stop(hub_trigger, hub_task).await;
    env.cleanup().await;
}
