//! `fleet bench workflow` (issue 16, "Benchmark"): an impairment cordon and
//! release over N devices against the simulated Keystone and Placement of
//! `fleet dev` (`crate::dev::servers`), with the hub and the workflow
//! service in this process on a fresh database and subject root. The
//! devices are created through the hub's `create_devices` and made `in_use`
//! by one OpenStack snapshot each (so the release restores their trait);
//! then events of `--per-event` devices are created at once and the clock
//! runs until every event is `cordoned`, and again from the clears until
//! every event is `cleared`. Reports devices/s for each half and checks the
//! outcome against the simulated Placement and the hub's rows: every
//! provider without the trait after the cordon and with it after the
//! release, every device quarantined and then back in `in_use`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::FleetConfig;
use anyhow::Context;
use fleet_bus::Subjects;
use fleet_proto::{v1, Message};
use fleet_runtime::Shutdown;
use fleet_workflow_client::WorkflowClient;

#[derive(clap::Args, Debug)]
pub struct WorkflowBench {
    /// Devices to cordon and release.
    #[arg(long, default_value_t = 10_000)]
    pub devices: usize,
    /// Devices per impairment event (the events are created at once).
    #[arg(long, default_value_t = 1000)]
    pub per_event: usize,
    /// Devices the workflow service works on at once.
    #[arg(long, default_value_t = 64)]
    pub workers: usize,
    /// Keep the benchmark database and streams afterwards.
    #[arg(long)]
    pub keep: bool,
}

pub async fn run(base: FleetConfig, args: WorkflowBench) -> anyhow::Result<()> {
    let mut fresh = crate::bench::Fresh::new(&base, "workflow").await?;
    let config = &mut fresh.config;
    config.hub.listen = "127.0.0.1:0".into();
    config.workflow.listen = "127.0.0.1:0".into();
    config.workflow.workers = args.workers.max(1);
    config.workflow.max_devices_per_job = args.per_event.max(1);
    let result = bench(config, &args).await;
    if !args.keep {
        fresh.remove(&[]).await;
    }
    println!("{}", result?);
    Ok(())
}

/// Waits until `check` answers `Some`, for at most `within`.
async fn until<T, F, Fut>(what: &str, within: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what}: not done within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn bench(config: &mut FleetConfig, args: &WorkflowBench) -> anyhow::Result<String> {
    let n = args.devices.max(1);
    let db = fleet_store::connect(&config.database.url, 4).await?;
    sqlx::query("INSERT INTO sites (id, name) VALUES ('s1', 'bench site')")
        .execute(&db)
        .await?;

    // The simulated systems, every provider carrying the trait.
    let mut scenario = crate::dev::engine::Scenario::new(n, &["s1".to_string()], 7);
    for d in &mut scenario.devices {
        d.customer_ready = true;
    }
    let scenario: crate::dev::servers::Shared = Arc::new(Mutex::new(scenario));
    let (endpoints, sim_tasks) = crate::dev::servers::start(scenario.clone()).await?;
    let os = fleet_openstack::SiteConfig {
        auth_url: format!("{}/s1/identity/v3", endpoints.openstack),
        username: crate::dev::servers::OPENSTACK_USER.into(),
        password: fleet_runtime::Credential {
            value: fleet_runtime::config::Secret::new(crate::dev::servers::OPENSTACK_PASSWORD),
            ..Default::default()
        },
        project_name: crate::dev::servers::OPENSTACK_PROJECT.into(),
        ironic_url: format!("{}/s1/ironic", endpoints.openstack),
        placement_url: format!("{}/s1/placement", endpoints.openstack),
        placement_enabled: true,
        ..Default::default()
    };
    config.workflow.customer_ready_trait = crate::dev::engine::CUSTOMER_READY_TRAIT.into();
    config.workflow.sites.insert(
        "s1".into(),
        fleet_workflow::SiteConfig {
            openstack: os,
            ..Default::default()
        },
    );

    let (hub_trigger, hub_shutdown) = Shutdown::new();
    let hub_task = tokio::spawn(fleet_hub::run(
        config.common(),
        config.hub.clone(),
        hub_shutdown,
    ));
    let nats = fleet_bus::connect_now(&config.nats, "fleet-bench").await?;
    let js = async_nats::jetstream::new(nats.clone());
    let subjects = Subjects::new(&config.nats.subject_root, &config.nats.radar_root);
    let hub =
        fleet_hub_client::HubClient::new(nats.clone(), subjects.clone(), Duration::from_secs(60));

    // Devices through the hub, 500 to a command.
    eprintln!("bench: creating {n} devices through the hub");
    let devices: Vec<(String, String)> = {
        let s = scenario.lock().unwrap_or_else(|e| e.into_inner());
        s.devices
            .iter()
            .map(|d| (d.name.clone(), d.uuid.clone()))
            .collect()
    };
    let mut ids = Vec::with_capacity(n);
    for chunk in devices.chunks(500) {
        let c = v1::hub_command::Command::CreateDevices(v1::CreateDevices {
            devices: chunk
                .iter()
                .map(|(name, uuid)| v1::CreateDevice {
                    site: "s1".into(),
                    name: name.clone(),
                    infrastructure_ref: uuid.clone(),
                    ..Default::default()
                })
                .collect(),
        });
        let applied = loop {
            match hub.call("bench", 0, c.clone()).await {
                Ok(a) => break a,
                Err(fleet_hub_client::HubCallError::NotRunning) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => anyhow::bail!("create_devices: {e}"),
            }
        };
        let Some(fleet_hub_client::Record::Created(created)) = applied.record else {
            anyhow::bail!("create_devices answered no results");
        };
        for r in created.results {
            anyhow::ensure!(r.error.is_none(), "create_devices refused: {:?}", r.error);
            ids.push(r.id);
        }
    }

    // One OpenStack snapshot each: active, allocated, customer-ready, so
    // the hub derives in_use (a pre-hold in_use host gets its trait back).
    eprintln!("bench: making them in_use with one snapshot each");
    let now = chrono::Utc::now();
    let mut acks = Vec::with_capacity(n);
    for (name, _) in &devices {
        let c = |t: &str, s: &str, r: &str| v1::Condition {
            r#type: t.into(),
            status: s.into(),
            reason: r.into(),
            message: String::new(),
        };
        let key = v1::DeviceKey {
            site: "s1".into(),
            kind: "name".into(),
            key: name.clone(),
        };
        let snap = v1::ConditionSnapshot {
            resource_bindings: vec![],
            source: "openstack".into(),
            device: Some(key.clone()),
            observed_at: Some(fleet_proto::timestamp(now)),
            conditions: vec![
                c("IronicProvisionHealthy", "True", "Healthy"),
                c("IronicMaintenance", "False", ""),
                c("CustomerReady", "True", ""),
                c("InstanceAllocated", "True", ""),
                c("IronicAvailable", "False", ""),
                c("InMaintenancePool", "False", ""),
            ],
            mirror: None,
        };
        // Acknowledged in windows: the client bounds the acks in flight.
        if acks.len() >= 500 {
            for a in acks.drain(..) {
                let a: async_nats::jetstream::context::PublishAckFuture = a;
                a.await.context("publishing a snapshot")?;
            }
        }
        acks.push(
            fleet_bus::publish_observation(
                &js,
                &subjects,
                config.nats.partitions,
                "openstack",
                &key,
                now.timestamp_nanos_opt().unwrap_or(0),
                &fleet_proto::schema::<v1::ConditionSnapshot>(),
                None,
                snap.encode_to_vec().into(),
            )
            .await?,
        );
    }
    for a in acks {
        a.await.context("publishing a snapshot")?;
    }
    let in_use = |db: sqlx::PgPool| async move {
        let c: i64 =
            sqlx::query_scalar("SELECT count(*) FROM devices WHERE operational_status = 'in_use'")
                .fetch_one(&db)
                .await?;
        Ok::<i64, anyhow::Error>(c)
    };
    if let Err(e) = until("every device in_use", Duration::from_secs(120), || {
        let db = db.clone();
        async move { Ok((in_use(db).await? == n as i64).then_some(())) }
    })
    .await
    {
        let by: Vec<(String, i64)> = sqlx::query_as(
            "SELECT operational_status, count(*) FROM devices GROUP BY 1 ORDER BY 1",
        )
        .fetch_all(&db)
        .await?;
        anyhow::bail!("{e}: operational_status {by:?}");
    }

    let (w_trigger, w_shutdown) = Shutdown::new();
    let w_task = tokio::spawn(fleet_workflow::run(
        config.common(),
        config.workflow.clone(),
        w_shutdown,
    ));
    let client = WorkflowClient::new(nats.clone(), subjects.clone(), Duration::from_secs(60));

    let events_in = |db: sqlx::PgPool, statuses: &'static [&'static str]| async move {
        let c: i64 =
            sqlx::query_scalar("SELECT count(*) FROM impairment_events WHERE status = ANY($1)")
                .bind(statuses)
                .fetch_one(&db)
                .await?;
        Ok::<i64, anyhow::Error>(c)
    };

    eprintln!(
        "bench: cordoning {n} devices in {} event(s) of up to {}",
        n.div_ceil(args.per_event.max(1)),
        args.per_event
    );
    let started = Instant::now();
    let mut events = vec![];
    for chunk in ids.chunks(args.per_event.max(1)) {
        let r = v1::CreateImpairmentRequest {
            device_ids: chunk.to_vec(),
            reason: "bench".into(),
            ticket_url: String::new(),
            created_by: "bench".into(),
        };
        let a = loop {
            match client.create_impairment(&r).await {
                Ok(a) => break a,
                Err(fleet_workflow_client::WorkflowError::NotRunning) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => anyhow::bail!("create_impairment: {e}"),
            }
        };
        // A cordon over more than the storm guard's share of the site
        // waits for an operator: the benchmark confirms it, as one would.
        if a.storm_guard.is_some_and(|g| g.awaiting_confirmation) {
            client
                .confirm_impairment(&v1::ConfirmRequest {
                    id: a.event_id.clone(),
                    confirmed_by: "bench".into(),
                    reason: "fleet bench workflow".into(),
                })
                .await
                .map_err(|e| anyhow::anyhow!("confirm_impairment: {e}"))?;
        }
        events.push(a.event_id);
    }
    let accepted = started.elapsed();
    let k = events.len() as i64;
    until("every event cordoned", Duration::from_secs(1800), || {
        let db = db.clone();
        async move {
            Ok(
                (events_in(db, &["cordoned", "partially_failed", "failed"]).await? == k)
                    .then_some(()),
            )
        }
    })
    .await?;
    let cordon = started.elapsed();
    let cordoned = events_in(db.clone(), &["cordoned"]).await?;
    let quarantined: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM devices WHERE operational_status = 'quarantine' AND impairment_hold IS NOT NULL",
    )
    .fetch_one(&db)
    .await?;
    let without_trait = {
        let s = scenario.lock().unwrap_or_else(|e| e.into_inner());
        s.devices.iter().filter(|d| !d.customer_ready).count()
    };

    eprintln!("bench: releasing");
    let started = Instant::now();
    for e in &events {
        client
            .clear_impairment(e, "bench")
            .await
            .map_err(|x| anyhow::anyhow!("clear_impairment {e}: {x}"))?;
    }
    until("every event cleared", Duration::from_secs(1800), || {
        let db = db.clone();
        async move { Ok((events_in(db, &["cleared", "release_failed"]).await? == k).then_some(())) }
    })
    .await?;
    let release = started.elapsed();
    let cleared = events_in(db.clone(), &["cleared"]).await?;
    let back_in_use = in_use(db.clone()).await?;
    let with_trait = {
        let s = scenario.lock().unwrap_or_else(|e| e.into_inner());
        s.devices.iter().filter(|d| d.customer_ready).count()
    };
    let failed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM impairment_event_devices WHERE status NOT IN ('cleared')",
    )
    .fetch_one(&db)
    .await?;

    w_trigger.trigger();
    let _ = w_task.await;
    hub_trigger.trigger();
    let _ = hub_task.await;
    for t in sim_tasks {
        t.abort();
    }
    anyhow::ensure!(
        cordoned == k && cleared == k && failed == 0,
        "events cordoned {cordoned}/{k}, cleared {cleared}/{k}, devices not cleared {failed}"
    );
    let rate = |d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    Ok(format!(
        "workflow bench: {n} devices, {k} impairment event(s) of up to {per}, {workers} workers\n\
         cordon:  {c:.2} s until every event cordoned ({cr:.0} devices/s; the {k} create(s) answered in {acc:.2} s); \
         quarantined with the hold {quarantined}/{n}, providers without the trait {without_trait}/{n}\n\
         release: {r:.2} s until every event cleared ({rr:.0} devices/s); back in_use {back_in_use}/{n}, providers with the trait {with_trait}/{n}\n\
         each device: its hold in a batched impairment_holds hub command, one Placement read and one write, per half",
        per = args.per_event,
        workers = args.workers,
        c = cordon.as_secs_f64(),
        cr = rate(cordon),
        acc = accepted.as_secs_f64(),
        r = release.as_secs_f64(),
        rr = rate(release),
    ))
}
