//! Streams and consumers, created idempotently at start-up with the
//! configuration in code (create-or-update).

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};

use crate::{BusError, Queue, Subjects};

/// Stream names with the configured prefix.
#[derive(Debug, Clone)]
pub struct StreamNames {
    pub prefix: String,
}

impl StreamNames {
    pub fn new(prefix: &str) -> Self {
        StreamNames {
            prefix: prefix.to_string(),
        }
    }
    /// The stream of one queue of one partition: `OBSERVATIONS_P<N>`
    /// (the reads) and `OBSERVATIONS_S<N>` (the sessions), each holding
    /// exactly the subjects its hub consumer takes.
    pub fn observations(&self, queue: Queue, partition: u32) -> String {
        let mark = match queue {
            Queue::Reads => 'P',
            Queue::Sessions => 'S',
        };
        format!("{}OBSERVATIONS_{mark}{partition}", self.prefix)
    }
    /// Every observation stream of `partitions` partitions, with its queue
    /// and partition, reads first.
    pub fn observations_all(&self, partitions: u32) -> Vec<(Queue, u32, String)> {
        Queue::ALL
            .iter()
            .flat_map(|q| (0..partitions).map(move |p| (*q, p)))
            .map(|(q, p)| (q, p, self.observations(q, p)))
            .collect()
    }
    /// The one stream of every observation until 2026-12-07: its filtered
    /// consumers cost nats-server 2.9 a scan of the others' messages
    /// (`docs/benchmarks.md`, "Streams per partition").
    pub fn legacy_observations(&self) -> String {
        format!("{}OBSERVATIONS", self.prefix)
    }
    pub fn status(&self) -> String {
        format!("{}STATUS", self.prefix)
    }
    pub fn radar(&self) -> String {
        format!("{}RADAR", self.prefix)
    }
    pub fn jobs(&self) -> String {
        format!("{}JOBS", self.prefix)
    }
    pub fn dlq(&self) -> String {
        format!("{}DLQ", self.prefix)
    }
    /// Every stream of the mesh's core (not the placer's): the observation
    /// streams of `partitions` partitions, `STATUS`, `RADAR`, `JOBS`, `DLQ`.
    pub fn mesh(&self, partitions: u32) -> Vec<String> {
        let mut names: Vec<String> = self
            .observations_all(partitions)
            .into_iter()
            .map(|(_, _, n)| n)
            .collect();
        names.extend([self.status(), self.radar(), self.jobs(), self.dlq()]);
        names
    }
}

const DAY: Duration = Duration::from_secs(24 * 3600);

/// How much the observation streams may hold, and how many copies every
/// stream keeps. Past either limit a publish is refused (the connector
/// retries and its publish-failure metric rises): nothing already in a
/// stream is dropped to make room.
#[derive(Debug, Clone, Copy)]
pub struct ObservationLimits {
    pub max_age: Duration,
    /// For each queue's P streams together: each stream may hold a P-th
    /// of it (partitions are balanced by the hash), so the reads hold at
    /// most this much, and so do the sessions.
    pub max_bytes: i64,
    /// The partition count P: one stream per queue and partition, each
    /// recording P in its description so every publisher can check it
    /// agrees with the hub.
    pub partitions: u32,
    /// `nats.num_replicas`, for every stream (consumers inherit it).
    pub num_replicas: usize,
}

impl ObservationLimits {
    pub fn of(config: &crate::NatsConfig) -> Self {
        ObservationLimits {
            max_age: config.observations_max_age.max(Duration::from_secs(60)),
            max_bytes: config.observations_max_bytes,
            partitions: config.partitions.max(1),
            num_replicas: config.num_replicas.max(1),
        }
    }
}

const PARTITIONS_MARK: &str = "partitions=";

/// The description that records the partition count.
pub fn observations_description(partitions: u32) -> String {
    format!("fleet condition observations, {PARTITIONS_MARK}{partitions}")
}

/// The partition count a stream description records, if any.
pub fn partitions_in(description: Option<&str>) -> Option<u32> {
    let d = description?;
    let at = d.find(PARTITIONS_MARK)? + PARTITIONS_MARK.len();
    let digits: String = d[at..].chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Who creates and updates which stream; everyone else only reads its
/// info (`nats.conf` grants exactly that).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// `OBSERVATIONS`, `STATUS`, `JOBS`, `DLQ`.
    Hub,
    /// `RADAR`.
    Radar,
}

/// The stream configurations of `spec/mesh.md`, with the configured limits
/// of the observation streams and every stream's replicas.
pub fn stream_configs_with(
    names: &StreamNames,
    subjects: &Subjects,
    limits: ObservationLimits,
) -> Vec<stream::Config> {
    let max_bytes = if limits.max_bytes > 0 {
        (limits.max_bytes / i64::from(limits.partitions)).max(1)
    } else {
        limits.max_bytes
    };
    let observations =
        names
            .observations_all(limits.partitions)
            .into_iter()
            .map(|(queue, partition, name)| stream::Config {
                name,
                description: Some(observations_description(limits.partitions)),
                subjects: vec![subjects.obs_partition(queue, partition)],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                num_replicas: limits.num_replicas,
                duplicate_window: Duration::from_secs(120),
                max_age: limits.max_age,
                max_bytes,
                discard: stream::DiscardPolicy::New,
                ..Default::default()
            });
    observations
        .chain([
            stream::Config {
                name: names.status(),
                subjects: vec![subjects.status_all()],
                retention: stream::RetentionPolicy::Limits,
                storage: stream::StorageType::File,
                num_replicas: limits.num_replicas,
                max_age: 7 * DAY,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            },
            stream::Config {
                name: names.radar(),
                subjects: vec![subjects.radar_all()],
                retention: stream::RetentionPolicy::Limits,
                storage: stream::StorageType::File,
                num_replicas: limits.num_replicas,
                max_messages_per_subject: 1,
                ..Default::default()
            },
            stream::Config {
                name: names.jobs(),
                subjects: vec![subjects.job_all()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                num_replicas: limits.num_replicas,
                ..Default::default()
            },
            stream::Config {
                name: names.dlq(),
                subjects: vec![subjects.dlq_all()],
                retention: stream::RetentionPolicy::Limits,
                storage: stream::StorageType::File,
                num_replicas: limits.num_replicas,
                max_age: 14 * DAY,
                ..Default::default()
            },
        ])
        .collect()
}

/// Creates or updates the streams `owner` owns, with the configured
/// limits. The hub first checks that existing observation streams were
/// made for the same partition count, and removes the one stream of every
/// observation of earlier versions once it is empty (it refuses to start
/// while that stream holds messages: their order comes before anything
/// the new streams would take).
pub async fn ensure_owned(
    js: &jetstream::Context,
    config: &crate::NatsConfig,
    owner: Owner,
) -> Result<(), BusError> {
    let names = StreamNames::new(&config.stream_prefix);
    let subjects = Subjects::new(&config.subject_root, &config.radar_root);
    let limits = ObservationLimits::of(config);
    let mut mine: Vec<String> = match owner {
        Owner::Hub => vec![names.status(), names.jobs(), names.dlq()],
        Owner::Radar => vec![names.radar()],
    };
    if owner == Owner::Hub {
        retire_legacy(js, &names).await?;
        let first = names.observations(Queue::Reads, 0);
        if let Some(info) = stream_info(js, &first).await? {
            check_partitions(
                &first,
                info.config.description.as_deref(),
                config.partitions,
            )?;
        }
        mine.extend(
            names
                .observations_all(limits.partitions)
                .into_iter()
                .map(|(_, _, n)| n),
        );
    }
    for c in stream_configs_with(&names, &subjects, limits) {
        if !mine.contains(&c.name) {
            continue;
        }
        let name = c.name.clone();
        js.create_or_update_stream(c)
            .await
            .map_err(|e| BusError::js(format!("create stream {name}"), e))?;
    }
    Ok(())
}

/// Removes the single observation stream of earlier versions when it is
/// empty; its subjects overlap every new stream's, so none could be made
/// beside it. Holding messages, it is left as it is and the start refused.
async fn retire_legacy(js: &jetstream::Context, names: &StreamNames) -> Result<(), BusError> {
    let legacy = names.legacy_observations();
    let Some(info) = stream_info(js, &legacy).await? else {
        return Ok(());
    };
    if info.state.messages > 0 {
        return Err(BusError::LegacyObservations {
            stream: legacy,
            messages: info.state.messages,
        });
    }
    js.delete_stream(&legacy)
        .await
        .map_err(|e| BusError::js(format!("delete stream {legacy}"), e))?;
    tracing::info!(stream = %legacy, "removed the empty single observation stream of an earlier version");
    Ok(())
}

/// One observation stream's state, as its info tells it.
#[derive(Debug, Clone)]
pub struct ObservationStream {
    pub name: String,
    pub queue: Queue,
    pub partition: u32,
    pub messages: u64,
    /// Consumers bound to it: 0 means no hub has ever taken it, or its
    /// consumer is being re-created.
    pub consumers: usize,
    /// How long its oldest message has waited; zero when it is empty.
    pub oldest: Duration,
}

/// The state of every observation stream of `config.partitions`
/// partitions (one cheap info request each; a stream not made yet counts
/// as empty).
pub async fn observation_streams(
    js: &jetstream::Context,
    config: &crate::NatsConfig,
) -> Result<Vec<ObservationStream>, BusError> {
    let names = StreamNames::new(&config.stream_prefix);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    // All at once: a poll of the backlog costs one round trip, not 2P.
    let reads = names
        .observations_all(config.partitions.max(1))
        .into_iter()
        .map(|(queue, partition, name)| async move {
            let (messages, consumers, oldest) = match stream_info(js, &name).await? {
                None => (0, 0, Duration::ZERO),
                Some(info) => {
                    let state = &info.state;
                    let age = now - state.first_timestamp.unix_timestamp_nanos();
                    let oldest = if state.messages == 0 {
                        Duration::ZERO
                    } else {
                        Duration::from_nanos(u64::try_from(age).unwrap_or(0))
                    };
                    (state.messages, state.consumer_count, oldest)
                }
            };
            Ok(ObservationStream {
                name,
                queue,
                partition,
                messages,
                consumers,
                oldest,
            })
        });
    futures::future::try_join_all(reads).await
}

/// A stream's info, from the one `STREAM.INFO` request `get_stream`
/// makes (its `info()` would ask again); `None` when there is no such
/// stream.
async fn stream_info(
    js: &jetstream::Context,
    name: &str,
) -> Result<Option<stream::Info>, BusError> {
    use jetstream::context::GetStreamErrorKind;
    match js.get_stream(name).await {
        Ok(s) => Ok(Some(s.cached_info().clone())),
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                Ok(None)
            }
            _ => Err(BusError::js(format!("stream info {name}"), e)),
        },
    }
}

/// How many observations every observation stream holds together.
pub async fn observations_held(
    js: &jetstream::Context,
    config: &crate::NatsConfig,
) -> Result<u64, BusError> {
    Ok(observation_streams(js, config)
        .await?
        .iter()
        .map(|s| s.messages)
        .sum())
}

fn check_partitions(
    stream: &str,
    description: Option<&str>,
    partitions: u32,
) -> Result<(), BusError> {
    match partitions_in(description) {
        Some(p) if p != partitions => Err(BusError::Partitions {
            stream: stream.to_string(),
            configured: partitions,
            recorded: p,
        }),
        _ => Ok(()),
    }
}

/// Waits, without end, for the hub's STATUS and DLQ streams: for a
/// service that consumes STATUS and dead-letters but owns neither.
pub async fn await_hub_streams(js: &jetstream::Context, streams: &StreamNames) {
    await_streams(
        js,
        &[streams.status(), streams.dlq()],
        std::future::pending(),
    )
    .await;
}

/// Waits until every stream named exists (another service owns them),
/// logging while it waits; `false` when `stop` fired first.
pub async fn await_streams(
    js: &jetstream::Context,
    streams: &[String],
    stop: impl std::future::Future<Output = ()>,
) -> bool {
    tokio::pin!(stop);
    let mut waited = Duration::ZERO;
    for name in streams {
        loop {
            match js.get_stream(name).await {
                Ok(_) => break,
                Err(e) => {
                    if waited.as_secs().is_multiple_of(10) {
                        tracing::warn!(stream = %name, error = %e, "waiting for the stream (the hub creates it)");
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => waited += Duration::from_secs(1),
                _ = &mut stop => return false,
            }
        }
    }
    true
}

/// Waits for the observation streams and checks that they were made for
/// this publisher's partition count: a publisher with another P would put
/// messages on partitions no hub consumes. `Ok(false)`: `stop` fired.
pub async fn check_observations(
    js: &jetstream::Context,
    config: &crate::NatsConfig,
    stop: impl std::future::Future<Output = ()>,
) -> Result<bool, BusError> {
    // Every observation stream records P; the first stands for them all.
    let name = StreamNames::new(&config.stream_prefix).observations(Queue::Reads, 0);
    if !await_streams(js, std::slice::from_ref(&name), stop).await {
        return Ok(false);
    }
    let s = js
        .get_stream(&name)
        .await
        .map_err(|e| BusError::js(format!("get stream {name}"), e))?;
    check_partitions(
        &name,
        s.cached_info().config.description.as_deref(),
        config.partitions,
    )?;
    Ok(true)
}

/// Creates or updates every stream, with the configured limits and
/// replicas (tests and benchmarks, which play every owner).
pub async fn ensure_streams(
    js: &jetstream::Context,
    config: &crate::NatsConfig,
) -> Result<(), BusError> {
    let names = StreamNames::new(&config.stream_prefix);
    let subjects = Subjects::new(&config.subject_root, &config.radar_root);
    for config in stream_configs_with(&names, &subjects, ObservationLimits::of(config)) {
        let name = config.name.clone();
        js.create_or_update_stream(config)
            .await
            .map_err(|e| BusError::js(format!("create stream {name}"), e))?;
    }
    Ok(())
}

/// Creates (or binds to) a durable pull consumer with one filter subject
/// (empty: every message of the stream).
pub async fn pull_consumer(
    js: &jetstream::Context,
    stream: &str,
    durable: &str,
    filter_subject: String,
    ack_wait: Duration,
) -> Result<consumer::PullConsumer, BusError> {
    let s = js
        .get_stream(stream)
        .await
        .map_err(|e| BusError::js(format!("get stream {stream}"), e))?;
    let config = consumer::pull::Config {
        durable_name: Some(durable.to_string()),
        filter_subject,
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait,
        max_ack_pending: 20_000,
        ..Default::default()
    };
    s.get_or_create_consumer(durable, config)
        .await
        .map_err(|e| BusError::js(format!("consumer {durable}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_records_the_partition_count() {
        assert_eq!(partitions_in(Some(&observations_description(16))), Some(16));
        assert_eq!(partitions_in(Some("something else")), None);
        assert_eq!(partitions_in(None), None);
        assert!(check_partitions("O", Some(&observations_description(8)), 16).is_err());
        assert!(check_partitions("O", Some(&observations_description(16)), 16).is_ok());
        // A stream made before the description existed is not refused.
        assert!(check_partitions("O", None, 16).is_ok());
    }

    #[test]
    fn each_queue_of_each_partition_is_a_stream_of_its_own() {
        let names = StreamNames::new("t1");
        let subjects = Subjects::new("t1.fleet", "t1.radar");
        let limits = ObservationLimits {
            max_age: DAY,
            max_bytes: 1600,
            partitions: 4,
            num_replicas: 1,
        };
        let configs = stream_configs_with(&names, &subjects, limits);
        let observations: Vec<&stream::Config> = configs
            .iter()
            .filter(|c| c.name.starts_with("t1OBSERVATIONS_"))
            .collect();
        assert_eq!(observations.len(), 8);
        for (queue, p, name) in names.observations_all(4) {
            let c = observations.iter().find(|c| c.name == name).expect("made");
            // Exactly what its one consumer takes: no filter needed.
            assert_eq!(c.subjects, vec![subjects.obs_partition(queue, p)]);
            assert_eq!(partitions_in(c.description.as_deref()), Some(4));
            assert_eq!(c.max_bytes, 400, "a P-th of the queue's whole");
        }
        assert_eq!(names.observations(Queue::Reads, 3), "t1OBSERVATIONS_P3");
        assert_eq!(names.observations(Queue::Sessions, 0), "t1OBSERVATIONS_S0");
        // No two streams share a subject, and no stream takes everything.
        assert!(configs
            .iter()
            .all(|c| c.subjects != vec![subjects.obs_all()]));
        assert_eq!(names.mesh(4).len(), 8 + 4);
    }
}
