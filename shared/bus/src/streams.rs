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

/// The stream configurations of `spec/mesh.md`.
pub fn stream_configs(names: &StreamNames, subjects: &Subjects) -> Vec<stream::Config> {
    vec![
        stream::Config {
            name: names.observations(),
            subjects: vec![subjects.obs_all()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        },
        stream::Config {
            name: names.status(),
            subjects: vec![subjects.status_all()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            max_age: 7 * DAY,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        },
        stream::Config {
            name: names.radar(),
            subjects: vec![subjects.radar_all()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            max_messages_per_subject: 1,
            ..Default::default()
        },
        stream::Config {
            name: names.jobs(),
            subjects: vec![subjects.job_all()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            ..Default::default()
        },
        stream::Config {
            name: names.dlq(),
            subjects: vec![subjects.dlq_all()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            max_age: 14 * DAY,
            ..Default::default()
        },
    ]
}

/// Creates or updates every stream.
pub async fn ensure_streams(
    js: &jetstream::Context,
    names: &StreamNames,
    subjects: &Subjects,
) -> Result<(), BusError> {
    for config in stream_configs(names, subjects) {
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
