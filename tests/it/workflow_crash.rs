//! Issue 16: SIGKILL the workflow service three times at random points of
//! a 50-device Image Node job against the real Ironic, restart it each
//! time; every device ends as an uninterrupted run leaves it (imaged, with
//! the instance_uuid its run pinned, so no identity was minted twice), and
//! the job is terminal.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fleet_proto::v1;
use fleet_testkit::ironic::RealIronic;
use rand::Rng;

use crate::support::*;

fn spawn_workflow(config_file: &std::path::Path, log: &std::path::Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(env!("CARGO_BIN_EXE_fleet"))
        .arg("--config")
        .arg(config_file)
        .arg("workflow")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn fleet workflow")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_three_times_mid_job_every_device_ends_as_an_uninterrupted_run() {
    let ironic = RealIronic::connect().await;
    let env = TestEnv::new().await;
    sqlx::query("UPDATE sites SET placement_enabled = false WHERE id = 's1'")
        .execute(&env.pool)
        .await
        .unwrap();
    let (_hub, hub_trigger, hub_task) = start_hub(&env).await;

    // 50 nodes, available, each bound to a device.
    let prefix = format!("kill{}", ulid::Ulid::new().to_string().to_lowercase());
    let mut nodes = vec![];
    for chunk in (0..50).collect::<Vec<_>>().chunks(10) {
        let names: Vec<String> = chunk.iter().map(|i| format!("{prefix}-{i:02}")).collect();
        let made = futures::future::join_all(names.iter().map(|n| ironic.available_node(n))).await;
        nodes.extend(made);
    }
    let mut devices = vec![];
    for (i, uuid) in nodes.iter().enumerate() {
        let reply = env
            .command(
                "create_device",
                0,
                v1::hub_command::Command::CreateDevice(v1::CreateDevice {
                    site: "s1".into(),
                    name: format!("{prefix}-{i:02}"),
                    infrastructure_ref: uuid.clone(),
                    ..Default::default()
                }),
            )
            .await;
        assert!(reply.error.is_none(), "{:?}", reply.error);
        devices.push(device_of(&reply).id);
    }
    // The hub learns each node's Ironic state from connector-openstack.
    let (os_trigger, os_task) =
        fleet_testkit::ironic::start_openstack_connector(&env, &ironic, 0.5);
    eventually("every node mirrored as available", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM devices WHERE ironic_provision_state = 'available' AND ironic_maintenance = false",
        )
        .fetch_one(&env.pool)
        .await
        .unwrap();
        (n == 50).then_some(())
    })
    .await;

    // The workflow service as its own process, with a short ack_wait so a
    // killed worker's devices come back quickly.
    let config_file = std::env::temp_dir().join(format!("{}-workflow.toml", env.db_name));
    let c = &env.common;
    std::fs::write(
        &config_file,
        format!(
            r#"[database]
url = "{db}"
max_connections = 8
[nats]
url = "{nats}"
subject_root = "{root}"
radar_root = "{radar}"
stream_prefix = "{prefix}"
partitions = {partitions}
[workflow]
listen = "127.0.0.1:0"
workers = 8
ack_wait = "2s"
poll_interval = "50ms"
retry_initial = "100ms"
retry_max = "1s"
[workflow.sites.s1]
image_source = "http://images.invalid/ubuntu-22.04.qcow2"
config_drive_public_keys = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAItest fleet@test"]
[workflow.sites.s1.openstack]
ironic_url = "{ironic}"
placement_enabled = false
"#,
            db = c.database.url,
            nats = c.nats.url,
            root = c.nats.subject_root,
            radar = c.nats.radar_root,
            prefix = c.nats.stream_prefix,
            partitions = c.nats.partitions,
            ironic = ironic.url,
        ),
    )
    .unwrap();
    let log = std::env::temp_dir().join(format!("{}-workflow.log", env.db_name));
    let mut workflow = Reaped::new(spawn_workflow(&config_file, &log));
    let client = workflow_client(&env);
    let job = eventually("the workflow service takes the job", || async {
        client
            .create_job(&v1::CreateJobRequest {
                workflow: "image_node".into(),
                device_ids: devices.clone(),
                created_by: "crash-test".into(),
                ..Default::default()
            })
            .await
            .ok()
    })
    .await;

    let mut rng = rand::thread_rng();
    let mut unfinished_at_kill = vec![];
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(200..1500))).await;
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM job_devices WHERE job_id = $1 AND (status IS NULL OR status = 'running')",
        )
        .bind(&job.id)
        .fetch_one(&env.pool)
        .await
        .unwrap();
        unfinished_at_kill.push(open);
        workflow.stop("KILL", Duration::from_secs(10)).await;
        workflow = Reaped::new(spawn_workflow(&config_file, &log));
    }
    assert!(
        unfinished_at_kill[0] > 0,
        "the first kill lands mid-job: {unfinished_at_kill:?}"
    );
    let done = job_terminal(&env, &job.id, Duration::from_secs(240)).await;
    assert_eq!(
        done.status,
        "succeeded",
        "{:#?}",
        done.devices
            .iter()
            .filter(|d| d.status != "succeeded")
            .collect::<Vec<_>>()
    );
    let pinned: Vec<(String, serde_json::Value)> = sqlx::query_as(
        "SELECT device_id, pinned FROM job_devices WHERE job_id = $1 ORDER BY device_id",
    )
    .bind(&job.id)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    for (device, p) in &pinned {
        let i = devices.iter().position(|d| d == device).unwrap();
        let n = ironic.node(&nodes[i]).await;
        assert_eq!(n["provision_state"], "active", "{device}: {n}");
        assert_eq!(
            n["instance_uuid"], p["instance_uuid"],
            "{device}: the node carries the identity its run pinned, minted once"
        );
    }
    let crashed = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!crashed.contains("panicked"), "{crashed}");

    workflow.stop("TERM", Duration::from_secs(30)).await;
    os_trigger.trigger();
    os_task.await.unwrap().unwrap();
    stop(hub_trigger, hub_task).await;
    let _ = std::fs::remove_file(&config_file);
    let _ = std::fs::remove_file(&log);
    ironic.cleanup().await;
    env.cleanup().await;
}
