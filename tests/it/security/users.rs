//! Issue 14, items 2 and 3: every service logs in with the configuration
//! compose gives it, and every NATS user may do exactly what it needs.
//! Both against a real nats-server running the shipped `nats.conf`.

use std::time::Duration;

use fleet_domain::Source;
use fleet_proto::{v1, Message};
use fleet_runtime::Shutdown;

use super::shipped::*;
use crate::support::device_of;

#[derive(Clone, Copy)]
enum Check {
    Pub(&'static str, bool),
    Sub(&'static str, bool),
}
use Check::*;

fn matrix() -> Vec<(&'static str, Vec<Check>)> {
    vec![
        (
            "hub",
            vec![
                Pub("fleet.status.operational.s1.d1", true),
                Pub("fleet.dlq.observations.invalid_subject", true),
                Pub("$JS.API.STREAM.UPDATE.OBSERVATIONS_P0", true),
                Pub("$JS.API.STREAM.CREATE.OBSERVATIONS_S15", true),
                Pub("$JS.API.CONSUMER.DELETE.OBSERVATIONS_P15.hub-p15", true),
                Pub("$JS.API.CONSUMER.MSG.NEXT.OBSERVATIONS_S3.hub-s3", true),
                Pub("$JS.ACK.OBSERVATIONS_P0.hub-p0.1.2.3.4.5", true),
                // The single stream of earlier versions, removed once empty.
                Pub("$JS.API.STREAM.DELETE.OBSERVATIONS", true),
                Pub("fleet.obs.slurm.0.d1", false),
                Pub("$JS.API.STREAM.DELETE.OBSERVATIONS_P0", false),
                Pub("$JS.API.STREAM.PURGE.OBSERVATIONS_P0", false),
                Pub("$JS.API.STREAM.CREATE.OBSERVATIONS_P16", false),
                Pub("$JS.API.STREAM.UPDATE.RADAR", false),
                Pub("$JS.API.CONSUMER.DELETE.STATUS.placer-schedulable", false),
                Pub("_INBOX.api.abc", false),
                Pub("fleet.placer.cmd.allocate", false),
                Sub("fleet.hub.cmd.create_device", true),
                Sub("_INBOX.hub.abc", true),
                Sub("_INBOX.>", false),
                Sub("_INBOX.api.>", false),
                Sub("fleet.obs.>", false),
            ],
        ),
        (
            "connector-slurm",
            vec![
                Pub("fleet.obs.slurm.3.name-gpu01", true),
                Pub("$JS.API.STREAM.INFO.OBSERVATIONS_P0", true),
                Pub("fleet.obs.slurm.3.openstack.0.name-gpu01", false),
                Pub("fleet.obs.openstack.3.name-gpu01", false),
                Pub("fleet.status.operational.s1.d1", false),
                Pub("$JS.API.STREAM.UPDATE.OBSERVATIONS_P0", false),
                Pub("$JS.API.STREAM.CREATE.OBSERVATIONS_P0", false),
                Pub("$JS.API.CONSUMER.DELETE.OBSERVATIONS_P15.hub-p15", false),
                Pub("fleet.hub.cmd.create_device", false),
                Pub("_INBOX.api.abc", false),
                Sub("_INBOX.connector-slurm.abc", true),
                Sub("_INBOX.>", false),
                Sub("_INBOX.hub.>", false),
                Sub("fleet.obs.>", false),
                Sub("fleet.agent.join", false),
            ],
        ),
        (
            "connector-netbox",
            vec![
                Pub("fleet.obs.netbox.0.name-a", true),
                Pub("fleet.hub.cmd.create_devices", true),
                Pub("fleet.hub.cmd.create_device", true),
                Pub("fleet.hub.cmd.create_site", true),
                Pub("fleet.hub.cmd.create_pool", false),
                Pub("fleet.hub.cmd.cordon", false),
                Pub("fleet.obs.slurm.0.name-a", false),
                Sub("_INBOX.connector-netbox.x", true),
                Sub("_INBOX.>", false),
            ],
        ),
        (
            "connector-openstack",
            vec![
                Pub("fleet.obs.openstack.1.name-a", true),
                Pub("fleet.obs.netbox.1.name-a", false),
                Pub("$JS.API.STREAM.UPDATE.OBSERVATIONS_P0", false),
            ],
        ),
        (
            "connector-health",
            vec![
                Pub("fleet.obs.health-status.1.name-a", true),
                Pub("fleet.obs.borneo.1.name-a", false),
            ],
        ),
        (
            "connector-borneo",
            vec![
                Pub("fleet.obs.borneo.1.serial-a", true),
                Pub("fleet.obs.netbox.1.serial-a", false),
                Pub("fleet.hub.cmd.write_condition", false),
            ],
        ),
        (
            "connector-fabric",
            vec![
                Pub("fleet.obs.frontend-fabric.1.name-a", true),
                Pub("fleet.obs.backend-fabric.1.name-a", true),
                Pub("fleet.obs.nvlink-fabric.1.name-a", true),
                Pub("fleet.obs.netbox.1.name-a", false),
                Pub("fleet.obs.gateway.s1.name-a", false),
            ],
        ),
        (
            "gateway",
            vec![
                Pub("fleet.obs.gateway.0.device_id-d1", true),
                Pub("fleet.obs.gateway.s0.device_id-d1", true),
                Pub("fleet.hub.cmd.join", true),
                Pub("fleet.hub.cmd.adopt", true),
                Pub("fleet.agent.d1.cmd", true),
                Pub("fleet.hub.cmd.cordon", false),
                Pub("fleet.obs.slurm.0.name-a", false),
                Pub("$JS.API.STREAM.UPDATE.OBSERVATIONS_P0", false),
                Sub("fleet.agent.join", true),
                Sub("fleet.agent.*.heartbeat", true),
                Sub("fleet.gateway.cmd.relay", true),
                Sub("_INBOX.gateway.x", true),
                Sub("_INBOX.>", false),
                Sub("fleet.agent.>", false),
            ],
        ),
        (
            "agent",
            vec![
                Pub("fleet.agent.join", true),
                Pub("fleet.agent.d1.open", true),
                Pub("fleet.agent.d1.heartbeat", true),
                Pub("fleet.agent.d1.close", true),
                Pub("fleet.agent.d1.cmd", false),
                Pub("fleet.obs.gateway.0.device_id-d1", false),
                Pub("fleet.obs.gateway.s0.device_id-d1", false),
                Pub("fleet.hub.cmd.join", false),
                Sub("fleet.agent.d1.cmd", true),
                Sub("_INBOX.agent.x", true),
                Sub("fleet.agent.join", false),
                Sub("_INBOX.>", false),
                Sub("_INBOX.gateway.>", false),
            ],
        ),
        (
            "placer",
            vec![
                Pub("fleet.placer.event.allocated.p1.a1", true),
                Pub("fleet.dlq.status.undecodable", true),
                Pub("$JS.API.STREAM.UPDATE.PLACER", true),
                Pub("$JS.API.CONSUMER.INFO.STATUS.placer-schedulable", true),
                Pub("$JS.ACK.STATUS.placer-operational.1.2.3.4.5", true),
                Pub("$JS.API.STREAM.UPDATE.STATUS", false),
                Pub("$JS.API.STREAM.UPDATE.OBSERVATIONS_P0", false),
                Pub("$JS.API.CONSUMER.DELETE.OBSERVATIONS_P15.hub-p15", false),
                Pub("$JS.API.CONSUMER.DURABLE.CREATE.STATUS.radar-health", false),
                Pub("fleet.status.operational.s1.d1", false),
                Pub("fleet.dlq.observations.x", false),
                Sub("fleet.placer.cmd.allocate", true),
                Sub("_INBOX.>", false),
            ],
        ),
        (
            "radar",
            vec![
                Pub("radar.projection.v1.s1.d1", true),
                Pub("fleet.dlq.status.undecodable", true),
                Pub("$JS.API.STREAM.UPDATE.RADAR", true),
                Pub("$JS.API.CONSUMER.INFO.STATUS.radar-health", true),
                Pub("$JS.API.STREAM.UPDATE.STATUS", false),
                Pub("$JS.API.CONSUMER.DELETE.OBSERVATIONS_P15.hub-p15", false),
                Pub("$JS.API.CONSUMER.INFO.STATUS.placer-schedulable", false),
                Pub("fleet.placer.event.allocated.p1.a1", false),
                Sub("fleet.radar.cmd.resync", true),
                Sub("_INBOX.>", false),
            ],
        ),
        (
            "reader",
            vec![
                Sub("fleet.status.>", true),
                Sub("radar.projection.v1.>", true),
                Sub("_INBOX.reader.x", true),
                Pub("$JS.API.CONSUMER.CREATE.STATUS", true),
                Pub("fleet.status.operational.s1.d1", false),
                Pub("fleet.hub.cmd.cordon", false),
                Pub("$JS.API.STREAM.UPDATE.STATUS", false),
                Pub("$JS.API.CONSUMER.DELETE.STATUS.placer-schedulable", false),
                Sub("fleet.hub.cmd.>", false),
                Sub("fleet.obs.>", false),
                Sub("_INBOX.>", false),
            ],
        ),
        (
            "workflow",
            vec![
                Pub("fleet.hub.cmd.write_condition", true),
                Pub("fleet.job.image.j1", true),
                Pub("$JS.API.CONSUMER.INFO.JOBS.workflow", true),
                Pub(
                    "$JS.API.CONSUMER.MSG.NEXT.STATUS.workflow-operational",
                    true,
                ),
                Pub("$JS.API.CONSUMER.DELETE.STATUS.workflow-operational", false),
                Pub("$JS.API.CONSUMER.MSG.NEXT.STATUS.placer-operational", false),
                Pub("fleet.status.operational.s1.d1", false),
                Pub("fleet.obs.slurm.0.name-a", false),
                Pub("$JS.API.STREAM.UPDATE.JOBS", false),
                Sub("fleet.workflow.cmd.create", true),
                Sub("_INBOX.workflow.x", true),
                Sub("_INBOX.>", false),
            ],
        ),
        (
            "api",
            vec![
                Pub("fleet.hub.cmd.cordon", true),
                Pub("fleet.placer.cmd.allocate", true),
                Pub("fleet.gateway.cmd.relay", true),
                Pub("fleet.radar.cmd.resync", true),
                Pub("fleet.obs.slurm.0.name-a", false),
                Pub("fleet.status.operational.s1.d1", false),
                Pub("$JS.API.STREAM.INFO.OBSERVATIONS_P0", false),
                Sub("_INBOX.api.x", true),
                // The console's live feed (GET /api/v1/events/status/).
                Sub("fleet.status.operational.s1.d1", true),
                Sub("_INBOX.>", false),
                Sub("fleet.hub.cmd.>", false),
            ],
        ),
    ]
}

fn password(user: &str) -> String {
    if user == "agent" {
        return AGENT_PASSWORD.into();
    }
    let key = format!(
        "FLEET_NATS_{}_PASSWORD",
        user.to_uppercase().replace('-', "_")
    );
    compose()
        .nats_passwords
        .get(&key)
        .cloned()
        .unwrap_or_else(|| panic!("compose.yaml gives nats-server no {key}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_nats_user_may_do_exactly_what_its_service_needs() {
    let nats = ShippedNats::start().await;
    let mut wrong = vec![];
    for (user, checks) in matrix() {
        let (client, mut errors) = nats.client(user, &password(user)).await;
        let mut subs = vec![];
        for c in &checks {
            match *c {
                Pub(s, _) => client.publish(s, "x".into()).await.unwrap(),
                Sub(s, _) => subs.push(client.subscribe(s).await.unwrap()),
            }
        }
        client.flush().await.unwrap();
        let errors = errors_within(&mut errors, Duration::from_millis(1500)).await;
        let refused = |kind: &str, s: &str| {
            errors.iter().any(|e| {
                let e = e.to_lowercase();
                e.contains("permissions violation")
                    && e.contains(kind)
                    && e.contains(&format!("\"{}\"", s.to_lowercase()))
            })
        };
        for c in &checks {
            let (what, s, allowed, was_refused) = match *c {
                Pub(s, a) => ("publish", s, a, refused("publish", s)),
                Sub(s, a) => ("subscription", s, a, refused("subscription", s)),
            };
            if allowed == was_refused {
                wrong.push(format!(
                    "{user}: {what} {s} should be {}",
                    if allowed { "allowed" } else { "refused" }
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Responders answer through `allow_responses`; nobody else can write to
/// another user's inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responders_answer_and_nobody_reads_another_users_replies() {
    let nats = ShippedNats::start().await;
    let (gateway, _) = nats.client("gateway", &password("gateway")).await;
    let (agent, _) = nats.client("agent", &password("agent")).await;
    let (slurm, mut slurm_errors) = nats
        .client("connector-slurm", &password("connector-slurm"))
        .await;
    let mut joins = gateway.subscribe("fleet.agent.join").await.unwrap();
    gateway.flush().await.unwrap();
    // connector-slurm tries to listen in on every inbox: refused.
    let _spy = slurm.subscribe("_INBOX.>").await.unwrap();
    slurm.flush().await.unwrap();
    let responder = tokio::spawn(async move {
        let m = futures::StreamExt::next(&mut joins).await.unwrap();
        gateway
            .publish(m.reply.unwrap(), "welcome".into())
            .await
            .unwrap();
        gateway.flush().await.unwrap();
    });
    // On a loaded machine the server may not route to the new
    // subscription at once: "no responders" (nothing delivered) is asked
    // again, anything else is the answer.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let reply = loop {
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            agent.request("fleet.agent.join", "join me".into()),
        )
        .await
        .expect("the gateway answers in time");
        match r {
            Err(e)
                if e.kind() == async_nats::RequestErrorKind::NoResponders
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other.expect("the agent gets the gateway's answer"),
        }
    };
    assert_eq!(reply.payload.as_ref(), b"welcome");
    responder.await.unwrap();
    let errors = errors_within(&mut slurm_errors, Duration::from_millis(500)).await;
    assert!(
        errors
            .iter()
            .any(|e| e.to_lowercase().contains("subscription") && e.contains("_INBOX.>")),
        "{errors:?}"
    );
}

/// Starts every service from its configuration and shows each did its
/// real start-up under the shipped permissions: the hubs create the
/// streams and answer the API, the placer, radar and gateway answer, each
/// connector finds the observation streams with its partition count and publishes an
/// observation a hub applies.
async fn every_service_starts(
    nats: &ShippedNats,
    env: &crate::support::TestEnv,
    hubs: Vec<fleet::config::FleetConfig>,
    services: std::collections::BTreeMap<String, fleet::config::FleetConfig>,
) {
    let (trigger, shutdown) = Shutdown::new();
    let mut tasks = tokio::task::JoinSet::new();
    let mut replicas = vec![];
    for (i, mut hub) in hubs.into_iter().enumerate() {
        assert_eq!(hub.nats.user, "hub");
        // Two live replicas never share a name (a StatefulSet's pods).
        hub.hub.replica = format!("{}-{i}", hub.hub.replica_name());
        let hub = fleet_hub::Hub::connect(hub.common(), hub.hub)
            .await
            .expect("a hub starts as user hub");
        replicas.push(hub.clone());
        tasks.spawn(fleet_hub::run_with(hub, shutdown.clone()));
    }
    // The replicas share the partitions through their leases.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut partitions: Vec<u32> = replicas.iter().flat_map(|h| h.partitions()).collect();
        partitions.sort();
        let spread = replicas.iter().all(|h| !h.partitions().is_empty());
        if partitions == (0..env.common.nats.partitions).collect::<Vec<u32>>() && spread {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the hubs consume every partition once, each some: {:?}",
            replicas.iter().map(|h| h.partitions()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let config = |s: &str| {
        services
            .get(s)
            .unwrap_or_else(|| panic!("no configuration for {s}"))
            .clone()
    };

    // The API's client: a hub answers it.
    let api = config("api");
    assert_eq!(api.nats.user, "api");
    let api_nats = fleet_bus::connect_now(&api.nats, "fleet-api")
        .await
        .expect("the api logs in");
    let name = format!(
        "gpu-deploy-{}",
        ulid::Ulid::new().to_string().to_lowercase()
    );
    let create = v1::HubCommand {
        actor: "test".into(),
        expected_version: 0,
        command: Some(v1::hub_command::Command::CreateDevice(v1::CreateDevice {
            site: "s1".into(),
            name: name.clone(),
            ..Default::default()
        })),
    };
    let reply = crate::support::eventually("a hub answers the api", || {
        let (api_nats, body) = (api_nats.clone(), create.encode_to_vec());
        async move {
            api_nats
                .request("fleet.hub.cmd.create_device", body.into())
                .await
                .ok()
        }
    })
    .await;
    let reply = v1::HubReply::decode(reply.payload.as_ref()).unwrap();
    assert!(reply.error.is_none(), "{:?}", reply.error);
    let id = device_of(&reply).id;

    let placer = config("placer");
    tasks.spawn(fleet_placer::service::run(
        placer.common(),
        placer.placer,
        shutdown.clone(),
    ));
    let radar = config("radar");
    tasks.spawn(fleet_radar::run(
        radar.common(),
        radar.radar,
        shutdown.clone(),
    ));
    let gateway = config("gateway");
    tasks.spawn(fleet_gateway::run(
        gateway.common(),
        gateway.gateway,
        shutdown.clone(),
    ));

    // Each responder answers (an error reply to a verb it does not know
    // is an answer: it is subscribed and may respond).
    for subject in ["fleet.placer.cmd.nothing", "fleet.radar.cmd.nothing"] {
        crate::support::eventually(subject, || {
            let api_nats = api_nats.clone();
            async move { api_nats.request(subject, "x".into()).await.ok() }
        })
        .await;
    }
    let (agent, _) = nats.client("agent", AGENT_PASSWORD).await;
    crate::support::eventually("the gateway answers an agent", || {
        let agent = agent.clone();
        async move { agent.request("fleet.agent.join", "x".into()).await.ok() }
    })
    .await;

    // Each connector's start-up: log in, find the observation streams and check its
    // partition count, then publish an observation a hub applies.
    let key = v1::DeviceKey {
        site: "s1".into(),
        kind: "name".into(),
        key: name.clone(),
    };
    for (service, source, condition) in [
        ("connector-netbox", Source::Netbox, None),
        (
            "connector-openstack",
            Source::Openstack,
            Some("IronicMaintenance"),
        ),
        ("connector-slurm", Source::Slurm, Some("SlurmRegistered")),
        ("connector-health", Source::HealthStatus, None),
        ("connector-borneo", Source::Borneo, None),
        ("connector-fabric", Source::FrontendFabric, None),
    ] {
        let config = config(service);
        assert_eq!(config.nats.user, service);
        let name = service.trim_start_matches("connector-");
        let rt = fleet_connector::Runtime::start_named(
            &config.common(),
            source,
            name,
            "127.0.0.1:0",
            shutdown.clone(),
        )
        .await
        .unwrap_or_else(|e| panic!("{service} starts: {e:#}"));
        let snap = v1::ConditionSnapshot {
            resource_bindings: vec![],
            source: source.as_str().into(),
            device: Some(key.clone()),
            observed_at: Some(fleet_proto::timestamp(chrono::Utc::now())),
            conditions: condition
                .map(|c| v1::Condition {
                    r#type: c.into(),
                    status: "True".into(),
                    reason: "Test".into(),
                    message: String::new(),
                })
                .into_iter()
                .collect(),
            mirror: None,
        };
        fleet_bus::publish_observation(
            &rt.bus.js,
            &rt.bus.subjects,
            rt.bus.partitions,
            source.subject_token(),
            &key,
            1,
            "fleet.v1.ConditionSnapshot",
            None,
            snap.encode_to_vec().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap_or_else(|e| panic!("{service} publishes its own observations: {e}"));
    }
    crate::support::eventually("a hub applied each connector's observation", || {
        let (pool, id) = (env.pool.clone(), id.clone());
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM device_source_freshness WHERE device_id = $1",
            )
            .bind(&id)
            .fetch_one(&pool)
            .await
            .ok()?;
            (n == 6).then_some(())
        }
    })
    .await;
    trigger.trigger();
    while let Some(r) = tokio::time::timeout(Duration::from_secs(30), tasks.join_next())
        .await
        .expect("services stop")
    {
        r.unwrap().expect("a service ran cleanly");
    }
}

/// Item 2: each fleet service in compose.yaml logs in with the
/// configuration compose gives it and does its real start-up work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_starts_with_the_configuration_compose_gives_it() {
    let nats = ShippedNats::cluster().await;
    let env = nats.env().await;
    let compose = compose();
    let mut services = std::collections::BTreeMap::new();
    for (s, vars) in &compose.services {
        assert!(
            !vars["FLEET__NATS__URL"].contains('@'),
            "{s}: credentials in FLEET__NATS__URL are ignored by the client"
        );
        services.insert(s.clone(), nats.service_config(s, &env));
    }
    let hub = services.remove("hub").expect("compose runs a hub");
    every_service_starts(&nats, &env, vec![hub.clone(), hub], services).await;
    env.cleanup().await;
}

/// Item 2, for Helm: helm/fleet rendered with Helm's own library; every
/// workload's environment (Secrets resolved) starts its service, the two
/// hub StatefulSets each on their partition set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_starts_with_the_configuration_helm_gives_it() {
    let nats = ShippedNats::cluster().await;
    let rendered = helm();
    let partitions: u32 = rendered
        .values()
        .find_map(|(_, vars)| vars.get("FLEET__NATS__PARTITIONS"))
        .expect("helm gives the services nats.partitions")
        .parse()
        .expect("a number");
    let env = nats.env_with(partitions).await;
    let mut hubs = vec![];
    let mut services = std::collections::BTreeMap::new();
    for (workload, (args, vars)) in rendered {
        if workload.starts_with("Job/") {
            continue;
        }
        assert!(
            !vars["FLEET__NATS__URL"].contains('@'),
            "{workload}: credentials in FLEET__NATS__URL are ignored by the client"
        );
        let config = nats.config_from(&workload, &vars, &env);
        match args
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["hub"] => hubs.push(config),
            ["connector", name] => {
                services.insert(format!("connector-{name}"), config);
            }
            [name] => {
                services.insert(name.to_string(), config);
            }
            other => panic!("{workload}: unexpected args {other:?}"),
        }
    }
    assert_eq!(hubs.len(), 1, "one hub StatefulSet");
    every_service_starts(
        &nats,
        &env,
        vec![hubs[0].clone(), hubs[0].clone()],
        services,
    )
    .await;
    env.cleanup().await;
}
