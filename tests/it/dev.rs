//! `fleet dev` smoke test: the whole mesh in-process with 200 simulated
//! devices against this test's database and subject root. Every device is
//! derived; at a quiescent point the API's distribution of operational
//! statuses (custody's `delegated` and `drained` included) equals the
//! scenario engine's ground truth (computed apart from the hub), and so do
//! the custody states, the front-end latches (verified handovers and the
//! scenario's deliberate `HandoverBreach`es) and the three live-fabric
//! observations; a cordon through the CLI's client shows in the API and on
//! STATUS; shutdown joins every task and leaves nothing running.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet::cli::{Api, ListArgs};
use fleet::dev::{DevMesh, DevOptions};
use fleet_proto::{v1, Message};

use crate::support::*;

async fn api_distribution(api: &Api) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for d in api
        .list_devices(&ListArgs::default())
        .await
        .expect("list devices through the API")
    {
        *out.entry(d.operational_status).or_default() += 1;
    }
    out
}

/// The live-fabric observations in PostgreSQL: `(type, status)` counts.
async fn fabric_seen(pool: &sqlx::PgPool) -> BTreeMap<(String, String), i64> {
    sqlx::query_as::<_, (String, String, i64)>(
        "SELECT type, status, count(*) FROM device_conditions \
         WHERE type IN ('FrontendPortsObservedInCustomerVrf', \
                        'BackendPortsObservedInMaintenanceVrf', \
                        'NvLinkGpusObservedInRepairPartition') GROUP BY 1, 2",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(t, st, n)| ((t, st), n))
    .collect()
}

/// The scenario's live-fabric ground truth in the same shape.
fn fabric_truth(mesh: &DevMesh) -> BTreeMap<(String, String), i64> {
    mesh.scenario
        .lock()
        .unwrap()
        .fabric_truth()
        .into_iter()
        .map(|((t, st), v)| ((t.to_string(), st.as_str().to_string()), v as i64))
        .collect()
}

/// A dev mesh of `devices` at `sites` sites (`standalone_sites` of them
/// without Placement) against this test's database, held (no scenario
/// changes), without the consumers or agents, resyncing every second.
async fn held_mesh(
    env: &TestEnv,
    devices: usize,
    sites: usize,
    standalone_sites: usize,
) -> DevMesh {
    let mut opts = DevOptions::new(devices);
    opts.isolate = false;
    opts.sites = sites;
    opts.standalone_sites = standalone_sites;
    opts.consumers = false;
    opts.agents = 0;
    opts.held = true;
    opts.tick = Duration::from_millis(500);
    opts.resync_secs = 1.0;
    DevMesh::start(crate::support::fleet_config(env), opts)
        .await
        .expect("the dev mesh starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dev_mesh_converges_to_the_scenario_ground_truth() {
    let env = TestEnv::new().await;
    let mut opts = DevOptions::new(200);
    opts.isolate = false;
    opts.sites = 2;
    opts.tick = Duration::from_millis(500);
    opts.change_rate = 0.03;
    opts.resync_secs = 1.0;
    // The hub on a thread of its own (`--hub-threads`): the same mesh, and
    // the runtime must be gone after shutdown.
    opts.hub_threads = Some(1);
    let mesh = DevMesh::start(crate::support::fleet_config(&env), opts)
        .await
        .expect("the dev mesh starts");
    let endpoints = mesh.endpoints.clone();

    // Every device imported and derived.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        let p = mesh.progress().await.expect("progress");
        if p.done() {
            assert_eq!(p.imported, 200, "{p:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "fleet not derived in time: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Let custody move (some device comes back from the partner) and every
    // agent connect (and one restart).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    while {
        let s = mesh.scenario.lock().unwrap();
        let unjoined = s
            .devices
            .iter()
            .filter(|d| d.has_agent && d.agent_session.is_none())
            .count();
        s.activity.returns == 0 || s.activity.agent_closes == 0 || unjoined > 0
    } {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no return from the partner, no agent restart or agents not joined: {:?}",
            mesh.scenario.lock().unwrap().activity
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // An agent restart the pause lands in the middle of: closed, and
    // wanted open again. The paused mesh must still reopen it.
    let restarted = {
        let mut s = mesh.scenario.lock().unwrap();
        let d = s
            .devices
            .iter_mut()
            .find(|d| d.has_agent && d.agent_wanted && d.agent_session == Some(true))
            .expect("an open agent");
        d.agent_wanted = false;
        d.name.clone()
    };
    let closed = |mesh: &DevMesh| {
        let s = mesh.scenario.lock().unwrap();
        s.devices
            .iter()
            .any(|d| d.name == restarted && d.agent_session == Some(false))
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !closed(&mesh) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{restarted}: agent not closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    {
        let mut s = mesh.scenario.lock().unwrap();
        if let Some(d) = s.devices.iter_mut().find(|d| d.name == restarted) {
            d.agent_wanted = true;
        }
    }

    // A quiescent point: the engine holds still, the connectors' next reads
    // carry its state to the hub, and the API must then agree with the
    // ground truth exactly.
    mesh.pause().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let a = mesh.agreement().await.unwrap();
        if a.converged() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "paused, but not every device matches with every wanted agent open: {a:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let truth: BTreeMap<String, usize> = mesh
        .ground_truth()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(truth.values().sum::<usize>(), 200);
    assert!(truth.len() >= 4, "a varied fleet: {truth:?}");
    let api = Api::new(&mesh.api_url, Some(&mesh.token)).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut seen;
    loop {
        seen = api_distribution(&api).await;
        if seen == truth || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        seen, truth,
        "API (left) against the scenario's ground truth (right)"
    );

    // Devices joined their site's pool: the placer answers its capacity,
    // so the README's allocation and capacity commands work on `fleet dev`.
    let pool = fleet::dev::dev_pool("s1");
    let in_pool = api
        .list_devices(&ListArgs {
            pool: Some(pool.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .len();
    assert!(in_pool > 0, "no device in {pool}");
    let last = std::sync::Mutex::new(String::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let capacity = loop {
        match api
            .get(&format!("/api/v1/pools/{pool}/capacity"), &[])
            .await
        {
            Ok(c) => break c,
            Err(e) => *last.lock().unwrap() = format!("{e:#}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the placer's capacity of {pool}: {} (a service ended: {:?})",
            last.lock().unwrap(),
            mesh.finished_tasks()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(capacity.is_object(), "{capacity}");

    // The agents joined with a token naming the pool: acceptance passed
    // against its hardware profile and their devices went `adopting` ->
    // `adopted`, so the pool has schedulable capacity to allocate from.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let adopted = api
            .list_devices(&ListArgs {
                pool: Some(pool.clone()),
                ..Default::default()
            })
            .await
            .unwrap()
            .iter()
            .filter(|d| d.provision_state == "adopted")
            .count();
        let c = api
            .get(&format!("/api/v1/pools/{pool}/capacity"), &[])
            .await
            .unwrap();
        let schedulable = c["schedulable_available"].as_i64().unwrap_or(0)
            + c["schedulable_allocated"].as_i64().unwrap_or(0);
        if adopted > 0 && schedulable > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{adopted} of {in_pool} devices of {pool} adopted, capacity {c}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Health from the simulated Prometheus through connector-health.
    let health_truth: BTreeMap<String, usize> = mesh
        .health_truth()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut health_seen;
    loop {
        health_seen = BTreeMap::new();
        for d in api.list_devices(&ListArgs::default()).await.unwrap() {
            *health_seen.entry(d.health_status).or_default() += 1;
        }
        if health_seen == health_truth || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        health_seen, health_truth,
        "health: API (left) against the scenario (right)"
    );

    // Custody, latches and the live fabric, from PostgreSQL, against the
    // simulated Borneo, switches and NMX-M.
    let fabric_expected = fabric_truth(&mesh);
    let (custody_truth, latch_truth) = {
        let s = mesh.scenario.lock().unwrap();
        let c: BTreeMap<String, i64> = s
            .custody_truth()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v as i64))
            .collect();
        let l: BTreeMap<String, i64> = s
            .latch_truth()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v as i64))
            .collect();
        (c, l)
    };
    let verified = latch_truth
        .get("CustomerVrfFlipVerified")
        .copied()
        .unwrap_or(0)
        + latch_truth.get("IsolateFlipVerified").copied().unwrap_or(0);
    assert!(
        verified > 0 && latch_truth.get("HandoverBreach").copied().unwrap_or(0) > 0,
        "verified flips and a deliberate breach: {latch_truth:?}"
    );
    assert!(
        custody_truth.contains_key("PARTNER_OWNED"),
        "a return: {custody_truth:?}"
    );
    assert!(truth.contains_key("delegated"), "{truth:?}");
    eprintln!("ground truth: {truth:?}\ncustody {custody_truth:?}\nlatches {latch_truth:?}\nfabric {fabric_expected:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let custody: BTreeMap<String, i64> = sqlx::query_as(
            "SELECT custody, count(*) FROM devices WHERE custody IS NOT NULL GROUP BY 1",
        )
        .fetch_all(&mesh.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
        let latches: BTreeMap<String, i64> = sqlx::query_as(
            "SELECT reason, count(*) FROM device_conditions \
             WHERE type = 'FrontendPortsInCustomerVrf' GROUP BY 1",
        )
        .fetch_all(&mesh.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
        let fabric = fabric_seen(&mesh.pool).await;
        let agreed =
            custody == custody_truth && latches == latch_truth && fabric == fabric_expected;
        if agreed || tokio::time::Instant::now() > deadline {
            assert_eq!(
                custody, custody_truth,
                "custody: hub (left), Borneo (right)"
            );
            assert_eq!(
                latches, latch_truth,
                "front-end latches: hub (left), scenario (right)"
            );
            assert_eq!(
                fabric, fabric_expected,
                "live fabric: hub (left), switches and NMX-M (right)"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Connectivity from the simulated agents through the gateway: every
    // device with an open session connected, the rest disconnected.
    let connectivity_truth: BTreeMap<String, i64> = mesh
        .connectivity_truth()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v as i64))
        .collect();
    assert!(
        connectivity_truth.get("connected").copied().unwrap_or(0) > 150,
        "most agents have a session: {connectivity_truth:?}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let seen: BTreeMap<String, i64> =
            sqlx::query_as("SELECT connectivity, count(*) FROM devices GROUP BY 1")
                .fetch_all(&mesh.pool)
                .await
                .unwrap()
                .into_iter()
                .collect();
        if seen == connectivity_truth || tokio::time::Instant::now() > deadline {
            assert_eq!(
                seen, connectivity_truth,
                "connectivity: hub (left), simulated agents (right)"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // One front-end leaf and one site's NMX-M out: only the devices behind
    // that leaf lose their front-end view, only that site its NVLink view.
    {
        let mut s = mesh.scenario.lock().unwrap();
        s.outages.switch = Some((0, true));
        s.outages.nmx = Some(1);
    }
    let outage_truth = fabric_truth(&mesh);
    assert_ne!(outage_truth, fabric_expected);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let seen = fabric_seen(&mesh.pool).await;
        if seen == outage_truth || tokio::time::Instant::now() > deadline {
            assert_eq!(
                seen, outage_truth,
                "fabric with a leaf and an NMX-M out: hub (left), scenario (right)"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    mesh.scenario.lock().unwrap().heal();

    // Per device too: the same status for the same name.
    let by_name: BTreeMap<(String, String), String> = api
        .list_devices(&ListArgs::default())
        .await
        .unwrap()
        .into_iter()
        .map(|d| ((d.site_id, d.name), d.operational_status))
        .collect();
    let expected = mesh.scenario.lock().unwrap().ground_truth();
    for (key, status) in &expected {
        assert_eq!(
            by_name.get(key).map(String::as_str),
            Some(*status),
            "device {key:?}"
        );
    }

    // Every device on every axis the engine predicts (operational, health,
    // connectivity), straight from PostgreSQL: what `fleet dev` waits for.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let agreement = loop {
        let a = mesh.agreement().await.expect("agreement");
        if a.matching == a.of || tokio::time::Instant::now() > deadline {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(
        (agreement.matching, agreement.of),
        (200, 200),
        "per-device agreement with the ground truth: {agreement:?}"
    );

    // Cordon through the CLI's code path.
    let devices = api
        .list_devices(&ListArgs {
            operational_status: Some("in_use".into()),
            limit: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    let id = devices[0].id.clone();
    let site = devices[0].site_id.clone();
    let changed = api
        .device_command(&id, "cordon", Some("dev smoke test"))
        .await
        .expect("cordon through the API");
    assert!(changed.cordoned, "{changed:?}");
    let shown = api.device(&id).await.unwrap();
    assert!(shown.summary.cordoned);
    assert_eq!(shown.cordon_reason.as_deref(), Some("dev smoke test"));
    let listed = api
        .list_devices(&ListArgs {
            cordoned: Some(true),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, id);
    // ... and on STATUS.
    let stream = env.js.get_stream(env.streams.status()).await.unwrap();
    let subject = env.subjects.status("cordoned", &site, &id);
    let event = eventually("the cordon on STATUS", || {
        let stream = stream.clone();
        let subject = subject.clone();
        async move {
            let m = stream
                .get_last_raw_message_by_subject(&subject)
                .await
                .ok()?;
            let e = v1::StatusChanged::decode(m.payload.as_ref()).ok()?;
            (e.to == "true").then_some(e)
        }
    })
    .await;
    assert_eq!(event.device_id, id);
    assert!(event.cause.contains("cordon"), "{event:?}");

    // Shutdown: every task joined without error, the simulated systems gone.
    let started = std::time::Instant::now();
    let report = mesh.shutdown().await;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(!report.children_left);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        started.elapsed()
    );
    eventually("the hub's threads have ended", || async {
        let left = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim_end() == fleet::dev::HUB_THREADS)
            })
            .count();
        (left == 0).then_some(())
    })
    .await;
    for url in endpoints.all() {
        let addr = url.trim_start_matches("http://");
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "{url} still answers"
        );
    }
    let _ = env
        .js
        .delete_stream(format!("{}PLACER", env.common.nats.stream_prefix))
        .await;
    env.cleanup().await;
}

/// Issue 18: `fleet dev | tee`, stopped with Ctrl-C, used to exit 101
/// (a write to the closed pipe panicked) and leave its database and
/// streams behind. The pipe closes first, then SIGINT: it exits 0 and
/// removes what it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_dev_cleans_up_when_its_pipe_is_gone_and_it_is_interrupted() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .args(["dev", "--sim", "20", "--no-consumers", "--tick-secs", "1"])
        .env(
            "FLEET__DATABASE__URL",
            format!("{}/fleet", admin_url().rsplit_once('/').unwrap().0),
        )
        .env("FLEET__NATS__URL", nats_url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut child = Reaped::new(child);
    let (db, root, metrics) = tokio::task::spawn_blocking(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        let (mut db, mut root) = (String::new(), String::new());
        loop {
            let line = lines
                .next()
                .expect("fleet dev prints its addresses")
                .unwrap();
            if let Some(rest) = line.strip_prefix("database") {
                let mut parts = rest.split_whitespace();
                let url = parts.next().unwrap().to_string();
                root = parts.nth(1).unwrap().trim_end_matches(".>").to_string();
                db = url.rsplit('/').next().unwrap().to_string();
            }
            if let Some(rest) = line.strip_prefix("metrics") {
                let urls: Vec<String> = rest
                    .split_whitespace()
                    .filter(|w| w.starts_with("http://"))
                    .map(str::to_string)
                    .collect();
                // Dropping the reader closes the pipe, as a killed `tee` does.
                return (db, root, urls);
            }
        }
    })
    .await
    .unwrap();
    assert!(db.starts_with("fleet_dev_"), "{db}");
    // Every service's /metrics address it printed answers (the connectors'
    // once their runtime started).
    // The hub, the API and six connectors (`--no-consumers`).
    assert_eq!(metrics.len(), 8, "{metrics:?}");
    for url in &metrics {
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches("/metrics")
            .to_string();
        eventually(url, || {
            let addr = addr.clone();
            async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut s = tokio::net::TcpStream::connect(&addr).await.ok()?;
                s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.ok()?;
                let mut buf = Vec::new();
                s.read_to_end(&mut buf).await.ok()?;
                let head = String::from_utf8_lossy(&buf);
                (head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200")).then_some(())
            }
        })
        .await;
    }
    // Let it write into the closed pipe for a while.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = child.stop("INT", Duration::from_secs(90)).await;
    assert_eq!(status.code(), Some(0), "{status:?}");
    let admin = fleet_store::connect(&admin_url(), 1).await.unwrap();
    let left: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&db)
            .fetch_one(&admin)
            .await
            .unwrap();
    assert!(!left, "database {db} left behind");
    let prefix = format!(
        "DEV{}_",
        root.trim_start_matches("dev")
            .trim_end_matches(".fleet")
            .to_uppercase()
    );
    let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
    let mut names = js.stream_names();
    while let Some(Ok(name)) = futures::StreamExt::next(&mut names).await {
        assert!(!name.starts_with(&prefix), "stream {name} left behind");
    }
}

/// Issue 16 item 7: jobs run against `fleet dev`'s simulated Ironic and the
/// ground truth follows them. On a site without Placement an idle node is
/// imaged (bound to the site's image, `active`), unimaged (`available`,
/// unbound) and enrolled (managed, inspected, provided, the proof through
/// the hub); at the Nova site s1 Image and Unimage run their Nova arm against
/// the simulated Nova; at the end every device matches the scenario again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_run_against_the_simulated_ironic_and_the_ground_truth_follows() {
    let env = TestEnv::new().await;
    let mesh = held_mesh(&env, 100, 2, 1).await;
    let converged = |what: &'static str| {
        let mesh = &mesh;
        eventually_within(
            what,
            Duration::from_secs(60),
            Duration::from_millis(300),
            move || async move {
                let a = mesh.agreement().await.ok()?;
                a.converged().then_some(a)
            },
        )
    };
    converged("every device derived as the scenario has it").await;

    // An idle node of the standalone site s2, and a device of s1.
    let (name, uuid) = {
        let s = mesh.scenario.lock().unwrap();
        let d = s
            .devices
            .iter()
            .find(|d| {
                d.site == "s2"
                    && d.provision_state == "available"
                    && d.instance_uuid.is_none()
                    && d.maintenance.is_none()
                    && d.custody.is_none()
                    && d.pending.is_none()
            })
            .expect("an idle node at s2");
        (d.name.clone(), d.uuid.clone())
    };
    let id_of = |name: String| {
        let pool = env.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT id FROM devices WHERE name = $1")
                .bind(name)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let id = id_of(name.clone()).await;
    // An idle node of the Nova site s1, which a technician leased to the
    // enrol project (where Image Node's Nova arm starts from).
    let (s1_name, s1_uuid) = {
        let mut s = mesh.scenario.lock().unwrap();
        let d = s
            .devices
            .iter_mut()
            .find(|d| {
                d.site == "s1"
                    && d.provision_state == "available"
                    && d.instance_uuid.is_none()
                    && d.maintenance.is_none()
                    && d.custody.is_none()
                    && d.pending.is_none()
            })
            .expect("an idle node at s1");
        d.lessee = fleet::dev::engine::ENROL_PROJECT;
        d.customer_ready = false;
        d.operated = true;
        (d.name.clone(), d.uuid.clone())
    };
    let at_s1 = id_of(s1_name).await;
    let node = |mesh: &DevMesh| {
        let s = mesh.scenario.lock().unwrap();
        s.devices.iter().find(|d| d.uuid == uuid).unwrap().clone()
    };

    let client = workflow_client(&env);
    let run = |workflow: &'static str, device: String| {
        let client = client.clone();
        let env = &env;
        async move {
            let job = eventually("the workflow service takes the job", || async {
                client
                    .create_job(&v1::CreateJobRequest {
                        workflow: workflow.into(),
                        device_ids: vec![device.clone()],
                        created_by: "dev-jobs-test".into(),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| eprintln!("{workflow}: {e:?}"))
                    .ok()
            })
            .await;
            let done = job_terminal(env, &job.id, Duration::from_secs(60)).await;
            assert_eq!(done.status, "succeeded", "{workflow}: {done:#?}");
        }
    };

    // The Nova site: Image moves the lease to the SLURM project and creates
    // the server on the node (bound, active); Unimage deletes it and
    // returns the lease.
    let s1_node = |mesh: &DevMesh| {
        let s = mesh.scenario.lock().unwrap();
        s.devices
            .iter()
            .find(|d| d.uuid == s1_uuid)
            .unwrap()
            .clone()
    };
    run("image_node", at_s1.clone()).await;
    let n = s1_node(&mesh);
    assert_eq!(n.provision_state, "active");
    assert!(n.instance_uuid.is_some(), "bound to the server");
    assert_eq!(n.lessee, fleet::dev::engine::MAINTENANCE_PROJECT);
    assert_eq!(
        n.instance_info.as_ref().unwrap()["image_source"],
        "5c0ffee0-slurm-gpu-image"
    );
    converged("the Nova-imaged node derived as the scenario has it").await;
    run("unimage_node", at_s1.clone()).await;
    let n = s1_node(&mesh);
    assert_eq!(n.provision_state, "available");
    assert_eq!(n.instance_uuid, None);
    assert_eq!(n.lessee, fleet::dev::engine::ENROL_PROJECT);

    run("image_node", id.clone()).await;
    let n = node(&mesh);
    assert_eq!(n.provision_state, "active");
    assert!(n.operated, "the scenario leaves a node its jobs wrote to");
    let bound = n
        .instance_uuid
        .clone()
        .expect("bound to the run's instance");
    assert!(
        n.instance_info.as_ref().unwrap()["image_source"]
            .as_str()
            .is_some_and(|s| s.ends_with(".qcow2")),
        "{:?}",
        n.instance_info
    );
    converged("the imaged node derived as the scenario has it").await;

    run("unimage_node", id.clone()).await;
    let n = node(&mesh);
    assert_eq!(n.provision_state, "available");
    assert_eq!(n.instance_uuid, None, "unbound (was {bound})");

    run("enrollment", id.clone()).await;
    let n = node(&mesh);
    assert_eq!(n.provision_state, "available");
    assert!(n.inspection_finished_at.is_some(), "inspected by the run");
    let proof: Option<String> =
        sqlx::query_scalar("SELECT enrollment_validated_ref FROM devices WHERE id = $1")
            .bind(&id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(
        proof.as_deref(),
        Some(uuid.as_str()),
        "the proof, bound to the node"
    );
    converged("every device derived as the scenario has it after the jobs").await;

    let report = mesh.shutdown().await;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    env.cleanup().await;
}

/// Burn-in in the dev mesh: `single_node_test` submits to the simulated
/// slurmrestd's job API, which passes a healthy node and fails one whose
/// chassis health is not Ok; the standup matrix shows both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn burn_in_runs_on_the_simulated_slurmrestd_and_the_matrix_moves() {
    let env = TestEnv::new().await;
    let mesh = held_mesh(&env, 64, 1, 0).await;
    let (healthy, faulty) = {
        let s = mesh.scenario.lock().unwrap();
        let pick = |ok: bool| {
            s.devices
                .iter()
                .find(|d| (d.health == 0) == ok)
                .map(|d| d.name.clone())
                .expect("a device of each health")
        };
        (pick(true), pick(false))
    };
    let id_of = |name: String| {
        let pool = env.pool.clone();
        async move {
            eventually("the device is created", || async {
                sqlx::query_scalar::<_, String>("SELECT id FROM devices WHERE name = $1")
                    .bind(&name)
                    .fetch_optional(&pool)
                    .await
                    .unwrap()
            })
            .await
        }
    };
    let (healthy, faulty) = (id_of(healthy).await, id_of(faulty).await);
    let client = workflow_client(&env);
    let mut jobs = vec![];
    for d in [&healthy, &faulty] {
        let job = eventually("the workflow service takes the job", || async {
            client
                .create_job(&v1::CreateJobRequest {
                    workflow: "single_node_test".into(),
                    device_ids: vec![d.clone()],
                    created_by: "dev-burn-in-test".into(),
                    ..Default::default()
                })
                .await
                .map_err(|e| eprintln!("single_node_test: {e:?}"))
                .ok()
        })
        .await;
        jobs.push(job.id);
    }
    let passed = job_terminal(&env, &jobs[0], Duration::from_secs(90)).await;
    assert_eq!(passed.status, "succeeded", "{passed:#?}");
    assert!(
        passed.devices[0].results[0]
            .target
            .starts_with("slurm:job/"),
        "{passed:#?}"
    );
    let failed = job_terminal(&env, &jobs[1], Duration::from_secs(90)).await;
    assert_eq!(failed.status, "failed", "{failed:#?}");
    assert_eq!(failed.devices[0].failure_code, "BURN_IN_FAILED");

    // The matrix's drill-through names the failed burn-in (the cell itself
    // stays where the prefix clamp puts it: the device never enrolled).
    let api = Api::new(&mesh.api_url, Some(&mesh.token)).unwrap();
    let cell = eventually("the faulty device's cell", || async {
        let mut cursor = String::new();
        loop {
            let mut q = vec![("limit", "50".to_string())];
            if !cursor.is_empty() {
                q.push(("cursor", cursor.clone()));
            }
            let page = api
                .get("/api/v1/sites/s1/standup-pipeline/", &q)
                .await
                .ok()?;
            for r in page["racks"].as_array()? {
                for c in r["devices"].as_array()? {
                    if c["device_id"] == faulty.as_str() {
                        return Some(c.clone());
                    }
                }
            }
            cursor = page["next_cursor"].as_str()?.to_string();
        }
    })
    .await;
    let latest = &cell["latest_in_sequence_workflow"];
    assert_eq!(latest["workflow"], "single_node_test", "{cell}");
    assert_eq!(latest["failure_code"], "BURN_IN_FAILED", "{cell}");
    mesh.shutdown().await;
    env.cleanup().await;
}
