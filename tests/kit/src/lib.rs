//! Test support: a fresh database and a unique subject root and stream
//! prefix per test, against the real PostgreSQL and NATS of the machine
//! (`DATABASE_URL`, `NATS_URL` override 127.0.0.1). Everything is removed
//! when the environment is dropped.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use fleet_bus::{StreamNames, Subjects};
use fleet_proto::{timestamp, v1, Message};
use fleet_runtime::Common;
use sqlx::PgPool;

pub fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// The device a hub command left (a device command's reply).
pub fn device_of(reply: &v1::HubReply) -> v1::DeviceChange {
    match &reply.record {
        Some(v1::hub_reply::Record::Device(d)) => d.clone(),
        other => panic!("expected a device in the hub's reply, got {other:?}"),
    }
}

/// The condition row a hub condition write left.
pub fn condition_of(reply: &v1::HubReply) -> v1::ConditionRow {
    match &reply.record {
        Some(v1::hub_reply::Record::Condition(c)) => c.clone(),
        other => panic!("expected a condition row in the hub's reply, got {other:?}"),
    }
}

/// A path in the repository (this crate is `tests/kit`).
pub fn repo(path: &str) -> String {
    format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"))
}

pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

pub struct TestEnv {
    /// The shared sections: this test's database and subject root.
    pub common: Common,
    /// The hub's section, quick for tests (linger 2 ms, sweep 200 ms).
    pub hub: fleet_hub::Config,
    pub db_name: String,
    pub pool: PgPool,
    pub nats: async_nats::Client,
    pub js: async_nats::jetstream::Context,
    pub subjects: Subjects,
    pub streams: StreamNames,
    /// Set once `cleanup` ran; otherwise `Drop` (a failed test) removes
    /// the database and streams, so nothing is left behind either way.
    cleaned: bool,
}

/// Deletes every stream with the test's prefix and drops its database.
async fn remove(db_name: &str, stream_prefix: &str, nats: &str) {
    let addrs: Vec<async_nats::ServerAddr> = nats
        .split(',')
        .filter_map(|u| u.trim().parse().ok())
        .collect();
    if let Ok(client) = async_nats::connect(addrs).await {
        let js = async_nats::jetstream::new(client);
        let mut names = js.stream_names();
        let mut mine = vec![];
        while let Some(Ok(name)) = futures::StreamExt::next(&mut names).await {
            if name.starts_with(stream_prefix) {
                mine.push(name);
            }
        }
        for name in mine {
            let _ = js.delete_stream(&name).await;
        }
    }
    if let Ok(mut conn) = sqlx::postgres::PgConnection::connect_admin(&admin_url()).await {
        let _ = sqlx::query(&format!(
            "DROP DATABASE IF EXISTS \"{db_name}\" WITH (FORCE)"
        ))
        .execute(&mut conn)
        .await;
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        let (db, prefix, nats) = (
            self.db_name.clone(),
            self.common.nats.stream_prefix.clone(),
            self.common.nats.url.clone(),
        );
        // Dropped while a test unwinds inside its runtime: clean up from a
        // thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(remove(&db, &prefix, &nats));
            }
        })
        .join();
    }
}

impl TestEnv {
    pub async fn new() -> TestEnv {
        quiet_global_subscriber();
        Self::with_nats(&nats_url()).await
    }

    /// A test environment against a NATS server of the test's own.
    pub async fn with_nats(nats: &str) -> TestEnv {
        let nats = nats.to_string();
        Self::with_nats_config(move |n| n.url = nats).await
    }

    /// A test environment whose NATS settings `f` adjusts after the
    /// per-test defaults (a server of the test's own, its credentials, the
    /// shipped subject root).
    pub async fn with_nats_config(f: impl FnOnce(&mut fleet_bus::NatsConfig)) -> TestEnv {
        let id = ulid::Ulid::new().to_string().to_lowercase();
        let db_name = format!("fleet_test_{id}");
        let mut config = Common::default();
        let admin = admin_url();
        let base = admin
            .rsplit_once('/')
            .map(|(b, _)| b.to_string())
            .unwrap_or(admin.clone());
        config.database.url = format!("{base}/{db_name}");
        config.database.max_connections = 8;
        config.nats.url = nats_url();
        config.nats.subject_root = format!("t{id}.fleet");
        config.nats.radar_root = format!("t{id}.radar");
        config.nats.stream_prefix = format!("T{}_", id.to_uppercase());
        config.nats.partitions = 4;
        f(&mut config.nats);
        let hub = fleet_hub::Config {
            listen: "127.0.0.1:0".into(),
            linger: Duration::from_millis(2),
            sweep_interval: Duration::from_millis(200),
            ..Default::default()
        };
        fleet_store::ensure_database(&config.database.url).await.unwrap_or_else(|e| {
            panic!("PostgreSQL is needed at {admin}: {e:#}\nstart it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start")
        });
        let pool = fleet_store::connect(&config.database.url, 4)
            .await
            .expect("connect test database");
        fleet_store::migrate(&pool)
            .await
            .expect("migrate test database");
        let nats = fleet_bus::connect_now(&config.nats, "fleet-test")
            .await
            .unwrap_or_else(|e| {
                panic!("NATS with JetStream is needed at {}: {e}", config.nats.url)
            });
        let js = async_nats::jetstream::new(nats.clone());
        let subjects = Subjects::new(&config.nats.subject_root, &config.nats.radar_root);
        let streams = StreamNames::new(&config.nats.stream_prefix);
        fleet_bus::ensure_streams(&js, &config.nats)
            .await
            .expect("create streams");
        sqlx::query("INSERT INTO sites (id, name) VALUES ('s1', 'site one'), ('s2', 'site two')")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO sites (id, name, inventory_only) VALUES ('inv', 'inventory only', true)",
        )
        .execute(&pool)
        .await
        .unwrap();
        TestEnv {
            common: config,
            hub,
            db_name,
            pool,
            nats,
            js,
            subjects,
            streams,
            cleaned: false,
        }
    }

    /// Points a `fleet` process at this environment: its database, NATS,
    /// subject roots, stream prefix and partition count.
    pub fn fleet_env<'c>(&self, c: &'c mut std::process::Command) -> &'c mut std::process::Command {
        let n = &self.common.nats;
        c.env("FLEET__DATABASE__URL", &self.common.database.url)
            .env("FLEET__NATS__URL", &n.url)
            .env("FLEET__NATS__SUBJECT_ROOT", &n.subject_root)
            .env("FLEET__NATS__RADAR_ROOT", &n.radar_root)
            .env("FLEET__NATS__STREAM_PREFIX", &n.stream_prefix)
            .env("FLEET__NATS__PARTITIONS", n.partitions.to_string())
    }

    /// Removes the database and the streams.
    pub async fn cleanup(mut self) {
        self.pool.close().await;
        remove(
            &self.db_name,
            &self.common.nats.stream_prefix,
            &self.common.nats.url,
        )
        .await;
        self.cleaned = true;
    }

    /// Sends a hub command and returns the reply.
    pub async fn command(
        &self,
        verb: &str,
        version: i64,
        command: v1::hub_command::Command,
    ) -> v1::HubReply {
        let c = v1::HubCommand {
            actor: "test".into(),
            expected_version: version,
            command: Some(command),
        };
        let payload: bytes::Bytes = c.encode_to_vec().into();
        // The hub may still be subscribing when a test starts.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let reply = loop {
            let r = tokio::time::timeout(
                Duration::from_secs(10),
                self.nats
                    .request(self.subjects.hub_cmd(verb), payload.clone()),
            )
            .await
            .expect("hub answers in time");
            match r {
                Ok(reply) => break reply,
                Err(e)
                    if e.kind() == async_nats::RequestErrorKind::NoResponders
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("hub command {verb}: {e}"),
            }
        };
        v1::HubReply::decode(reply.payload.as_ref()).expect("reply decodes")
    }

    /// Creates a device through the hub; returns its id.
    pub async fn create_device(&self, site: &str, name: &str) -> String {
        self.create_device_with(v1::CreateDevice {
            site: site.into(),
            name: name.into(),
            ..Default::default()
        })
        .await
    }

    /// Creates a device with these fields (a serial, an infrastructure
    /// reference, a pool) through the hub; returns its id.
    pub async fn create_device_with(&self, device: v1::CreateDevice) -> String {
        let reply = self
            .command(
                "create_device",
                0,
                v1::hub_command::Command::CreateDevice(device),
            )
            .await;
        assert!(reply.error.is_none(), "create_device: {:?}", reply.error);
        device_of(&reply).id
    }

    /// Writes a `device_conditions` row directly (no hub): reason `R`, its
    /// times all `at`, for tests of the queries that read them.
    #[allow(clippy::too_many_arguments)]
    pub async fn insert_condition(
        &self,
        device: &str,
        t: &str,
        status: &str,
        message: &str,
        source: &str,
        durable: bool,
        at: DateTime<Utc>,
    ) {
        sqlx::query(
            "INSERT INTO device_conditions (device_id, type, status, reason, message, source, condition_of, durable, observed_at, received_at, last_transition_at) \
             VALUES ($1, $2, $3, 'R', $4, $5, 'none', $6, $7, $7, $7)",
        )
        .bind(device)
        .bind(t)
        .bind(status)
        .bind(message)
        .bind(source)
        .bind(durable)
        .bind(at)
        .execute(&self.pool)
        .await
        .unwrap();
    }

    /// Publishes the gateway's connectivity observation `event` of
    /// session `epoch` for device `id` at `s1`, as the gateway would.
    pub async fn publish_connectivity(
        &self,
        id: &str,
        epoch: i64,
        event: &str,
        at: chrono::DateTime<Utc>,
    ) {
        let obs = v1::ConnectivityObservation {
            device_id: id.into(),
            epoch,
            gateway_id: "gw-test".into(),
            event: event.into(),
            observed_at: Some(fleet_proto::timestamp(at)),
            ..Default::default()
        };
        let key = v1::DeviceKey {
            site: "s1".into(),
            kind: "device_id".into(),
            key: id.into(),
        };
        let at = at.timestamp_nanos_opt().unwrap_or_default();
        self.publish_observation("gateway", &key, at, &obs).await;
    }

    pub async fn publish_snapshot(&self, snap: &v1::ConditionSnapshot) {
        let key = snap.device.clone().unwrap();
        let at = fleet_connector::snapshot::observed_nanos(snap);
        self.publish_observation(&snap.source, &key, at, snap).await;
    }

    /// Publishes `message` as `source`'s observation of `key` (the
    /// publisher's dedupe time `at_nanos`) and waits for its PubAck.
    async fn publish_observation<M: Message + fleet_proto::Name>(
        &self,
        source: &str,
        key: &v1::DeviceKey,
        at_nanos: i64,
        message: &M,
    ) {
        fleet_bus::publish_observation(
            &self.js,
            &self.subjects,
            self.common.nats.partitions,
            source,
            key,
            at_nanos,
            &fleet_proto::schema::<M>(),
            None,
            message.encode_to_vec().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }

    /// Takes the test database away (no new connections, every open one
    /// terminated) or gives it back: a PostgreSQL outage for this test only.
    pub async fn database_reachable(&self, reachable: bool) {
        let admin = fleet_store::connect(&admin_url(), 1).await.unwrap();
        sqlx::query(&format!(
            "ALTER DATABASE \"{}\" ALLOW_CONNECTIONS {reachable}",
            self.db_name
        ))
        .execute(&admin)
        .await
        .unwrap();
        if !reachable {
            sqlx::query(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{}' AND pid <> pg_backend_pid()",
                self.db_name
            ))
            .execute(&admin)
            .await
            .unwrap();
        }
        admin.close().await;
    }

    /// Every message in `DLQ` so far.
    pub async fn dead_letters(&self) -> Vec<async_nats::jetstream::Message> {
        let stream = self.js.get_stream(self.streams.dlq()).await.unwrap();
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::Config::default())
            .await
            .unwrap();
        let mut out = vec![];
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .unwrap();
        while let Some(Ok(m)) = futures::StreamExt::next(&mut batch).await {
            out.push(m);
        }
        out
    }

    pub async fn device_field(&self, id: &str, column: &str) -> String {
        sqlx::query_scalar(&format!("SELECT {column}::text FROM devices WHERE id = $1"))
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

trait ConnectAdmin {
    fn connect_admin(
        url: &str,
    ) -> impl Future<Output = Result<sqlx::postgres::PgConnection, sqlx::Error>>;
}

impl ConnectAdmin for sqlx::postgres::PgConnection {
    async fn connect_admin(url: &str) -> Result<sqlx::postgres::PgConnection, sqlx::Error> {
        use sqlx::Connection;
        sqlx::postgres::PgConnection::connect(url).await
    }
}

/// Polls `check` every 50 ms until it returns `Some` or 20 s have passed.
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(
        what,
        Duration::from_secs(20),
        Duration::from_millis(50),
        check,
    )
    .await
}

/// Polls `check` every `every` until it returns `Some` or `within` has
/// passed (a thousand agents on 2 cores want longer than `eventually`).
pub async fn eventually_within<T, F, Fut>(
    what: &str,
    within: Duration,
    every: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

pub fn cond(t: &str, status: &str, reason: &str) -> v1::Condition {
    v1::Condition {
        r#type: t.into(),
        status: status.into(),
        reason: reason.into(),
        message: String::new(),
    }
}

pub fn snapshot(
    source: &str,
    site: &str,
    kind: &str,
    key: &str,
    at: DateTime<Utc>,
    conditions: Vec<v1::Condition>,
) -> v1::ConditionSnapshot {
    v1::ConditionSnapshot {
        resource_bindings: vec![],
        source: source.into(),
        device: Some(v1::DeviceKey {
            site: site.into(),
            kind: kind.into(),
            key: key.into(),
        }),
        observed_at: Some(timestamp(at)),
        conditions,
        mirror: None,
    }
}

/// Ironic conditions for a device the way connector-openstack maps them.
pub fn openstack(
    site: &str,
    name: &str,
    at: DateTime<Utc>,
    healthy: bool,
    maintenance: bool,
    ready: bool,
    allocated: bool,
    available: bool,
    maint_pool: bool,
) -> v1::ConditionSnapshot {
    let b = |v: bool| if v { "True" } else { "False" };
    snapshot(
        "openstack",
        site,
        "name",
        name,
        at,
        vec![
            cond(
                "IronicProvisionHealthy",
                b(healthy),
                if healthy { "Healthy" } else { "DeployFailed" },
            ),
            cond("IronicMaintenance", b(maintenance), ""),
            cond("CustomerReady", b(ready), ""),
            cond("InstanceAllocated", b(allocated), ""),
            cond("IronicAvailable", b(available), ""),
            cond("InMaintenancePool", b(maint_pool), ""),
        ],
    )
}

/// The states of an Ironic node the tests publish, each as the six
/// conditions connector-openstack maps it to ([`openstack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    /// Healthy, allocated and customer-ready.
    InUse,
    /// Healthy, in Ironic maintenance.
    Maintenance,
    /// Healthy, ready and available, not allocated.
    Available,
    /// Deploy failed, nothing else.
    Failed,
    /// Healthy, leased to the maintenance project.
    MaintenancePool,
    /// Deploy failed and in Ironic maintenance.
    FailedInMaintenance,
}

/// [`openstack`] for a node in one of the usual states.
pub fn openstack_as(
    site: &str,
    name: &str,
    at: DateTime<Utc>,
    node: Node,
) -> v1::ConditionSnapshot {
    let [healthy, maintenance, ready, allocated, available, maint_pool] = match node {
        Node::InUse => [true, false, true, true, false, false],
        Node::Maintenance => [true, true, false, false, false, false],
        Node::Available => [true, false, true, false, true, false],
        Node::Failed => [false; 6],
        Node::MaintenancePool => [true, false, false, false, false, true],
        Node::FailedInMaintenance => [false, true, false, false, false, false],
    };
    openstack(
        site,
        name,
        at,
        healthy,
        maintenance,
        ready,
        allocated,
        available,
        maint_pool,
    )
}

/// A time at the microsecond precision PostgreSQL stores.
pub fn micros(t: DateTime<Utc>) -> DateTime<Utc> {
    fleet_proto::datetime(Some(&timestamp(t))).unwrap()
}

/// A global subscriber that records nothing but keeps every callsite's
/// interest at "sometimes". Without one, a callsite first hit on a thread
/// with no subscriber is cached as "never" for the whole process, and a
/// test that captures logs with `set_default` on its own thread (the
/// Borneo secrets test) misses lines now and then when tests run in
/// parallel.
pub fn quiet_global_subscriber() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing::subscriber::set_global_default(Quiet);
    });
}

struct Quiet;

impl tracing::Subscriber for Quiet {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Waits until every outbox row has been published and deleted.
pub async fn outbox_drained(env: &TestEnv) {
    eventually("outbox drained", || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(&env.pool)
            .await
            .unwrap();
        (n == 0).then_some(())
    })
    .await;
}

/// A child process that is killed and reaped when the test ends, whether it
/// passes or fails: a failing test leaves no process behind.
pub struct Reaped(std::process::Child);

impl Reaped {
    pub fn new(child: std::process::Child) -> Self {
        Reaped(child)
    }

    /// Sends `signal` (`INT`, `TERM`) and waits up to `timeout` for the exit.
    pub async fn stop(&mut self, signal: &str, timeout: Duration) -> std::process::ExitStatus {
        let _ = std::process::Command::new("kill")
            .args([format!("-{signal}"), self.0.id().to_string()])
            .status();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait().expect("wait for the child") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "process {} did not stop within {timeout:?} of SIG{signal}",
                self.0.id()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs a service's `run_with(shutdown)` as a task until the returned
/// trigger fires; the task panics (failing the test) when `what` fails.
pub fn spawn_service<F, E>(
    what: &'static str,
    run: impl FnOnce(fleet_runtime::Shutdown) -> F,
) -> ServiceTask
where
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Debug,
{
    let (trigger, shutdown) = fleet_runtime::Shutdown::new();
    let running = run(shutdown);
    let task = tokio::spawn(async move {
        if let Err(e) = running.await {
            panic!("{what} failed: {e:?}");
        }
    });
    (trigger, task)
}

/// Stops a service a `start_*` function started: fires its trigger and
/// waits for its task to end (a panic in it fails the test).
pub async fn stop(
    trigger: fleet_runtime::shutdown::ShutdownTrigger,
    task: tokio::task::JoinHandle<()>,
) {
    trigger.trigger();
    task.await.expect("the service stops cleanly");
}

/// A service a test runs: the trigger that stops it and its task.
pub type ServiceTask = (
    fleet_runtime::shutdown::ShutdownTrigger,
    tokio::task::JoinHandle<()>,
);

/// A service a `start_*` function started: the service itself, the trigger
/// that stops it and its task.
pub type Started<S> = (
    std::sync::Arc<S>,
    fleet_runtime::shutdown::ShutdownTrigger,
    tokio::task::JoinHandle<()>,
);

/// The services a test started, stopped in the order they were given
/// (the service that depends on the others first).
pub struct Services(Vec<ServiceTask>);

impl From<Vec<ServiceTask>> for Services {
    fn from(v: Vec<ServiceTask>) -> Self {
        Services(v)
    }
}

impl Services {
    pub async fn stop(self) {
        for (trigger, task) in self.0 {
            stop(trigger, task).await;
        }
    }
}

/// Runs a hub against the environment until its trigger fires.
pub async fn start_hub(env: &TestEnv) -> Started<fleet_hub::Hub> {
    let hub = fleet_hub::Hub::connect(env.common.clone(), env.hub.clone())
        .await
        .expect("hub connects");
    let h = hub.clone();
    let (trigger, task) = spawn_service("the hub", |s| fleet_hub::run_with(h, s));
    (hub, trigger, task)
}

/// A hub running against a test environment until it is stopped; it reads
/// as the hub itself (its metrics, its ops address).
pub struct RunningHub {
    hub: std::sync::Arc<fleet_hub::Hub>,
    trigger: fleet_runtime::shutdown::ShutdownTrigger,
    task: tokio::task::JoinHandle<()>,
}

impl RunningHub {
    pub async fn start(env: &TestEnv) -> RunningHub {
        let (hub, trigger, task) = start_hub(env).await;
        RunningHub { hub, trigger, task }
    }

    /// Stops the hub, which must end cleanly, and removes the environment.
    pub async fn stop(self, env: TestEnv) {
        stop(self.trigger, self.task).await;
        env.cleanup().await;
    }

    /// Stops the hub without looking at how its task ended, and removes
    /// the environment.
    pub async fn stop_unchecked(self, env: TestEnv) {
        self.trigger.trigger();
        let _ = self.task.await;
        env.cleanup().await;
    }
}

impl std::ops::Deref for RunningHub {
    type Target = fleet_hub::Hub;

    fn deref(&self) -> &fleet_hub::Hub {
        &self.hub
    }
}

/// When `source` last observed the device `id`, as its freshness row says.
pub async fn observed_at(env: &TestEnv, id: &str, source: &str) -> Option<DateTime<Utc>> {
    sqlx::query_scalar(
        "SELECT observed_at FROM device_source_freshness WHERE device_id = $1 AND source = $2",
    )
    .bind(id)
    .bind(source)
    .fetch_optional(&env.pool)
    .await
    .unwrap()
}

/// Collects every `StatusChanged` on STATUS for a device.
pub async fn status_events(env: &TestEnv, device: &str) -> Vec<v1::StatusChanged> {
    read_status(
        env,
        &format!("{}.status.*.*.{}", env.common.nats.subject_root, device),
    )
    .await
}

/// Every `StatusChanged` on `STATUS` under `filter`, from the beginning,
/// as a consumer would read them: retried while a lost NATS server's
/// streams elect their leaders, never acked (nothing holds delivery back
/// at max_ack_pending or delivers a message twice), and fetched until the
/// consumer has nothing pending (a cluster answers a pull in parts).
pub async fn read_status(env: &TestEnv, filter: &str) -> Vec<v1::StatusChanged> {
    // Up to a minute: after a server is lost, a create can time out until
    // the cluster counts that server out (the 20 s of `eventually` was
    // once too short in the cluster test).
    let consumer = eventually_within(
        "a consumer of STATUS",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let stream = env.js.get_stream(env.streams.status()).await;
            let stream = stream.map_err(|e| eprintln!("get STATUS: {e}")).ok()?;
            stream
                .create_consumer(async_nats::jetstream::consumer::pull::Config {
                    filter_subject: filter.to_string(),
                    ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
                    ..Default::default()
                })
                .await
                .map_err(|e| eprintln!("a consumer of STATUS: {e}"))
                .ok()
        },
    )
    .await;
    let mut out = vec![];
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(10_000)
            .messages()
            .await
            .unwrap();
        let mut fetched = 0;
        while let Some(Ok(m)) = futures::StreamExt::next(&mut batch).await {
            fetched += 1;
            out.push(v1::StatusChanged::decode(m.payload.as_ref()).unwrap());
        }
        let pending = match consumer.clone().info().await {
            Ok(i) => i.num_pending,
            Err(e) => {
                eprintln!("STATUS consumer info: {e}");
                1
            }
        };
        if pending == 0 {
            return out;
        }
        if fetched == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Runs a placer against the environment until its trigger fires; returns
/// once it answers requests.
pub async fn start_placer(env: &TestEnv) -> Started<fleet_placer::Placer> {
    let config = fleet_placer::Config {
        listen: "127.0.0.1:0".into(),
        resync_interval: Duration::from_secs(2),
        ..Default::default()
    };
    let placer = fleet_placer::Placer::connect(env.common.clone(), config)
        .await
        .expect("placer connects");
    let p = placer.clone();
    let (trigger, task) = spawn_service("the placer", |s| fleet_placer::run_with(p, s));
    // Answering (even NOT_FOUND) means the request subscription is live.
    let c = client(env);
    eventually("the placer answers", || async {
        (!matches!(
            c.capacity("no-such-pool").await,
            Err(fleet_placer_client::PlacerError::Unavailable(_)
                | fleet_placer_client::PlacerError::NotRunning)
        ))
        .then_some(())
    })
    .await;
    (placer, trigger, task)
}

/// A placer client on the environment's bus.
pub fn client(env: &TestEnv) -> fleet_placer_client::PlacerClient {
    fleet_placer_client::PlacerClient::new(
        env.nats.clone(),
        env.subjects.clone(),
        Duration::from_secs(30),
    )
}

/// `n` schedulable hosts in pool `pool` (site s1, tenant t1 exists), GPUs
/// from the pool's hardware profile, racks r0..r5, NVLink domains of 4.
pub async fn seed_pool(env: &TestEnv, pool: &str, n: i32, gpus: i32) {
    sqlx::query("INSERT INTO tenants (id, name) VALUES ('t1', 'tenant one'), ('t2', 'tenant two') ON CONFLICT DO NOTHING")
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO pools (id, site_id, kind) VALUES ($1, 's1', 'metal-host')")
        .bind(pool)
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO pool_hardware_profiles (pool_id, gpu_count) VALUES ($1, $2)")
        .bind(pool)
        .bind(gpus)
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO devices (id, name, site_id, pool_id, rack, role, trust, provision_state, observed_generation, \
         connectivity, capacity_bucket, labels) \
         SELECT 'dev_' || $1 || '_' || lpad(i::text, 5, '0'), $1 || '-gpu-' || i, 's1', $1, 'r' || (i % 6), 'host', \
         'platform', 'deployed', 1, 'connected', 'schedulable', \
         jsonb_build_object('nvlink_domain', 'nvl-' || (i / 4)) \
         FROM generate_series(0, $2 - 1) i",
    )
    .bind(pool)
    .bind(n)
    .execute(&env.pool)
    .await
    .unwrap();
}

pub mod api;
pub mod connector;
pub mod gateway;
pub mod ironic;
pub mod nats_cluster;
pub mod nova;
pub mod placement;
pub mod slurm;

/// Runs a workflow service against the environment (with `f`'s settings)
/// until its trigger fires; returns once it answers requests.
pub async fn start_workflow(
    env: &TestEnv,
    f: impl FnOnce(&mut fleet_workflow::Config),
) -> Started<fleet_workflow::Workflow> {
    let mut config = fleet_workflow::Config {
        listen: "127.0.0.1:0".into(),
        poll_interval: Duration::from_millis(100),
        retry_initial: Duration::from_millis(100),
        retry_max: Duration::from_secs(1),
        ack_wait: Duration::from_secs(3),
        ..Default::default()
    };
    f(&mut config);
    let w = fleet_workflow::Workflow::connect(env.common.clone(), config)
        .await
        .expect("workflow service connects");
    let x = w.clone();
    let (trigger, task) = spawn_service("the workflow service", |s| fleet_workflow::run_with(x, s));
    let c = workflow_client(env);
    eventually("the workflow service answers", || async {
        (!matches!(
            c.get_job("job_none").await,
            Err(fleet_workflow_client::WorkflowError::Unavailable(_)
                | fleet_workflow_client::WorkflowError::NotRunning)
        ))
        .then_some(())
    })
    .await;
    (w, trigger, task)
}

/// A workflow client on the environment's bus.
pub fn workflow_client(env: &TestEnv) -> fleet_workflow_client::WorkflowClient {
    fleet_workflow_client::WorkflowClient::new(
        env.nats.clone(),
        env.subjects.clone(),
        Duration::from_secs(30),
    )
}

/// Waits until job `id` is terminal; returns it.
pub async fn job_terminal(env: &TestEnv, id: &str, within: Duration) -> v1::Job {
    let c = workflow_client(env);
    let deadline = tokio::time::Instant::now() + within;
    loop {
        // A workflow service that is restarting answers nothing for a moment.
        match c.get_job(id).await {
            Ok(j) if !matches!(j.status.as_str(), "pending" | "running") => return j,
            Ok(j) => assert!(
                tokio::time::Instant::now() < deadline,
                "job {id} is still {} after {within:?}: {:?}",
                j.status,
                j.devices
            ),
            Err(
                e @ (fleet_workflow_client::WorkflowError::NotRunning
                | fleet_workflow_client::WorkflowError::Unavailable(_)),
            ) => assert!(
                tokio::time::Instant::now() < deadline,
                "job {id}: the workflow service is away: {e}"
            ),
            Err(e) => panic!("get_job {id}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One impairment event as the tests read it: its status and, per device,
/// `(device_id, status, placement_action, placement_status, error_code)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImpairmentRead {
    pub status: String,
    pub devices: Vec<(
        String,
        String,
        Option<String>,
        Option<String>,
        Option<String>,
    )>,
}

pub async fn impairment(env: &TestEnv, id: &str) -> ImpairmentRead {
    let status: String = sqlx::query_scalar("SELECT status FROM impairment_events WHERE id = $1")
        .bind(id)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let devices = sqlx::query_as(
        "SELECT device_id, status, placement_action, placement_status, error_code \
         FROM impairment_event_devices WHERE event_id = $1 ORDER BY device_id",
    )
    .bind(id)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    ImpairmentRead { status, devices }
}

/// Waits until impairment event `id` has one of `statuses`; returns it.
pub async fn impairment_in(
    env: &TestEnv,
    id: &str,
    statuses: &[&str],
    within: Duration,
) -> ImpairmentRead {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let e = impairment(env, id).await;
        if statuses.contains(&e.status.as_str()) {
            return e;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "impairment event {id} is still {} after {within:?}, not one of {statuses:?}: {:?}",
            e.status,
            e.devices
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
