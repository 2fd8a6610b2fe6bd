//! Partitioned publishing to the observation streams (one per partition): every PubAck is awaited (a
//! dropped ack future loses the ack silently), a failed publish is retried
//! with the same `Nats-Msg-Id`, so JetStream drops a duplicate within its
//! two-minute window.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use fleet_bus::Subjects;
use fleet_proto::{v1, Message};

use crate::metrics::ConnectorMetrics;
use crate::snapshot::observed_nanos;

/// What a connector publishes through.
#[derive(Clone)]
pub struct Bus {
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub subjects: Subjects,
    pub partitions: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishReport {
    pub acked: u64,
    pub failed: u64,
}

const ATTEMPTS: u32 = 3;

impl Bus {
    async fn publish_one(
        &self,
        metrics: &ConnectorMetrics,
        source: &str,
        snap: &v1::ConditionSnapshot,
    ) -> Result<(), String> {
        let Some(key) = snap.device.as_ref() else {
            return Err("snapshot without a device key".into());
        };
        let payload: bytes::Bytes = snap.encode_to_vec().into();
        let at = observed_nanos(snap);
        let traceparent = fleet_runtime::telemetry::traceparent_of(&tracing::Span::current());
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
            let started = Instant::now();
            let ack = fleet_bus::publish_observation(
                &self.js,
                &self.subjects,
                self.partitions,
                source,
                key,
                at,
                &fleet_proto::schema::<v1::ConditionSnapshot>(),
                traceparent.as_deref(),
                payload.clone(),
            )
            .await;
            let result = match ack {
                Ok(fut) => fut.await.map(|_| ()).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match result {
                Ok(()) => {
                    metrics.publish_latency(source, started.elapsed());
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Publishes `snapshots` evenly over `budget`: small groups (at most
    /// `in_flight`, about ten a second), each started on its schedule.
    /// With no budget, as [`Bus::publish_all`].
    pub async fn publish_spread(
        &self,
        metrics: &ConnectorMetrics,
        source: &str,
        site: &str,
        snapshots: &[v1::ConditionSnapshot],
        in_flight: usize,
        budget: Duration,
    ) -> PublishReport {
        let n = snapshots.len();
        let ticks = (budget.as_secs_f64() * 10.0).floor() as usize;
        if n == 0 || ticks <= 1 {
            return self
                .publish_all(metrics, source, site, "observed", snapshots, in_flight)
                .await;
        }
        let group = n.div_ceil(ticks).clamp(1, in_flight.max(1));
        let groups = n.div_ceil(group);
        let start = tokio::time::Instant::now();
        let mut report = PublishReport::default();
        for (i, chunk) in snapshots.chunks(group).enumerate() {
            tokio::time::sleep_until(start + budget.mul_f64(i as f64 / groups as f64)).await;
            let r = self
                .publish_all(metrics, source, site, "observed", chunk, in_flight)
                .await;
            report.acked += r.acked;
            report.failed += r.failed;
        }
        report
    }

    /// Publishes every snapshot, `in_flight` at a time, and awaits each
    /// PubAck. Failures are logged and counted, never fatal: the next poll
    /// publishes again.
    pub async fn publish_all(
        &self,
        metrics: &ConnectorMetrics,
        source: &str,
        site: &str,
        kind: &str,
        snapshots: &[v1::ConditionSnapshot],
        in_flight: usize,
    ) -> PublishReport {
        let mut report = PublishReport::default();
        for chunk in snapshots.chunks(in_flight.max(1)) {
            let results = futures::future::join_all(
                chunk.iter().map(|s| self.publish_one(metrics, source, s)),
            )
            .await;
            for (snap, r) in chunk.iter().zip(results) {
                match r {
                    Ok(()) => report.acked += 1,
                    Err(e) => {
                        report.failed += 1;
                        let key = snap.device.clone().unwrap_or_default();
                        tracing::error!(
                            source,
                            site,
                            device_key = %key.key,
                            key_kind = %key.kind,
                            error = %e,
                            "could not publish observation"
                        );
                        metrics.error(source, site, "publish");
                    }
                }
            }
        }
        metrics.published(source, site, kind, report.acked);
        report
    }
}
