//! Streams and consumers, created idempotently at start-up with the
//! configuration in code (create-or-update).

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};

use crate::{BusError, Subjects};

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
    pub fn observations(&self) -> String {
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
}

const DAY: Duration = Duration::from_secs(24 * 3600);

/// How much `OBSERVATIONS` may hold, and how many copies every stream
/// keeps. Past either limit a publish is refused (the connector retries and
/// its publish-failure metric rises): nothing already in the stream is
/// dropped to make room.
#[derive(Debug, Clone, Copy)]
pub struct ObservationLimits {
    pub max_age: Duration,
    pub max_bytes: i64,
    /// The partition count P, recorded in the stream's description so
    /// every publisher can check it agrees with the hub; 0 records none.
    pub partitions: u32,
    /// `nats.num_replicas`, for every stream (consumers inherit it).
    pub num_replicas: usize,
}

impl ObservationLimits {
    pub fn of(config: &crate::NatsConfig) -> Self {
        ObservationLimits {
            max_age: config.observations_max_age.max(Duration::from_secs(60)),
            max_bytes: config.observations_max_bytes,
            partitions: config.partitions,
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
/// of `OBSERVATIONS` and every stream's replicas.
pub fn stream_configs_with(
    names: &StreamNames,
    subjects: &Subjects,
    limits: ObservationLimits,
) -> Vec<stream::Config> {
    vec![
        stream::Config {
            name: names.observations(),
            description: (limits.partitions > 0)
                .then(|| observations_description(limits.partitions)),
            subjects: vec![subjects.obs_all()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            num_replicas: limits.num_replicas,
            duplicate_window: Duration::from_secs(120),
            max_age: limits.max_age,
            max_bytes: limits.max_bytes,
            discard: stream::DiscardPolicy::New,
            ..Default::default()
        },
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
    ]
}

/// Creates or updates the streams `owner` owns, with the configured
/// limits. The hub first checks that an existing `OBSERVATIONS` was made
/// for the same partition count.
pub async fn ensure_owned(
    js: &jetstream::Context,
    config: &crate::NatsConfig,
    owner: Owner,
) -> Result<(), BusError> {
    let names = StreamNames::new(&config.stream_prefix);
    let subjects = Subjects::new(&config.subject_root, &config.radar_root);
    let mine: Vec<String> = match owner {
        Owner::Hub => vec![
            names.observations(),
            names.status(),
            names.jobs(),
            names.dlq(),
        ],
        Owner::Radar => vec![names.radar()],
    };
    if owner == Owner::Hub {
        if let Ok(mut s) = js.get_stream(names.observations()).await {
            let info = s
                .info()
                .await
                .map_err(|e| BusError::js(format!("stream info {}", names.observations()), e))?;
            check_partitions(
                &names.observations(),
                info.config.description.as_deref(),
                config.partitions,
            )?;
        }
    }
    for c in stream_configs_with(&names, &subjects, ObservationLimits::of(config)) {
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

/// Waits for `OBSERVATIONS` and checks that it was made for this
/// publisher's partition count: a publisher with another P would put
/// messages on partitions no hub consumes. `Ok(false)`: `stop` fired.
pub async fn check_observations(
    js: &jetstream::Context,
    config: &crate::NatsConfig,
    stop: impl std::future::Future<Output = ()>,
) -> Result<bool, BusError> {
    let name = StreamNames::new(&config.stream_prefix).observations();
    if !await_streams(js, std::slice::from_ref(&name), stop).await {
        return Ok(false);
    }
    let mut s = js
        .get_stream(&name)
        .await
        .map_err(|e| BusError::js(format!("get stream {name}"), e))?;
    let info = s
        .info()
        .await
        .map_err(|e| BusError::js(format!("stream info {name}"), e))?;
    check_partitions(&name, info.config.description.as_deref(), config.partitions)?;
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

/// Creates (or binds to) a durable pull consumer with one filter subject.
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
}
