//! The placer as a service: requests over core NATS request/reply
//! (`<root>.placer.cmd.<verb>`), three durable STATUS consumers
//! (`schedulable` feeds the capacity view; `operational` and `connectivity`
//! impair allocations), a periodic rebuild of the view from PostgreSQL, the
//! allocation-event relay, and `/healthz` `/readyz` `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use chrono::Utc;
use fleet_bus::{Limits, Refusal, Responder, StreamNames, Subjects};
use fleet_consume::{StatusConsumer, StatusEvent};
use fleet_domain::{Axis, CapacityBucket};
use fleet_outbox::PLACER;
use fleet_proto::{datetime, timestamp, v1, ErrorCode, Message};
use fleet_runtime::{Common, Shutdown};
use fleet_store::Shell;

use crate::Config;

use crate::error::PlacerError;
use crate::model::AllocateRequest;
use crate::{store, Placer};

/// Creates or updates the placer's event stream.
pub async fn ensure_events_stream(
    js: &jetstream::Context,
    names: &StreamNames,
    subjects: &Subjects,
) -> anyhow::Result<()> {
    let name = crate::events_stream(names);
    js.create_or_update_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subjects.placer_event_all()],
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        max_age: Duration::from_secs(14 * 24 * 3600),
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .with_context(|| format!("create stream {name}"))?;
    Ok(())
}

fn decode<M: Message + Default>(payload: &[u8], what: &str) -> Result<M, PlacerError> {
    M::decode(payload)
        .map_err(|e| PlacerError::invalid_argument(format!("undecodable {what}: {e}")))
}

impl Placer {
    /// Decodes and answers one request; never panics on input.
    async fn request(
        &self,
        verb: &str,
        payload: &[u8],
    ) -> Result<v1::placer_reply::Result, PlacerError> {
        use v1::placer_reply::Result as R;
        match verb {
            "allocate" => {
                let r = decode::<v1::AllocateRequest>(payload, "AllocateRequest")?;
                let a = self.allocate(AllocateRequest::from_proto(&r)).await?;
                Ok(R::Allocation(a.to_proto()))
            }
            "release" => {
                let r = decode::<v1::ReleaseRequest>(payload, "ReleaseRequest")?;
                let a = self
                    .release(&r.allocation_id, Some(r.tenant_id.as_str()))
                    .await?;
                Ok(R::Allocation(a.to_proto()))
            }
            "get" => {
                let r = decode::<v1::GetAllocationRequest>(payload, "GetAllocationRequest")?;
                Ok(R::Allocation(self.get(&r.allocation_id).await?.to_proto()))
            }
            "capacity" => {
                let r = decode::<v1::CapacityRequest>(payload, "CapacityRequest")?;
                Ok(R::Capacity(self.capacity(&r.pool_id).await?.to_proto()))
            }
            other => Err(PlacerError::invalid_argument(format!(
                "unknown placer verb {other:?}"
            ))),
        }
    }

    fn consumer(&self, axis: Axis) -> StatusConsumer {
        StatusConsumer::axis(
            &self.deps.streams,
            &self.deps.subjects,
            "placer",
            axis.as_str(),
            self.config.ack_wait.max(Duration::from_secs(1)),
            256,
        )
    }

    /// `schedulable` events, and births with their first bucket, into the
    /// capacity view.
    async fn on_schedulable(&self, events: Vec<StatusEvent>) -> Result<(), PlacerError> {
        for e in events {
            self.metrics.status_event(&e.event.axis);
            let Some(to) = e.event.value_of(Axis::Schedulable.as_str()) else {
                tracing::warn!(device_id = %e.event.device_id, axis = %e.event.axis, "event gives no schedulable bucket; ignored");
                continue;
            };
            let Ok(bucket) = CapacityBucket::parse(to) else {
                tracing::warn!(device_id = %e.event.device_id, to = %to, "schedulable event names no bucket; ignored");
                continue;
            };
            self.apply_bucket(&e.event.device_id, bucket, e.event.version)
                .await?;
        }
        Ok(())
    }

    /// `operational -> failed` and `connectivity -> lost`: the allocations
    /// on the device are marked impaired and an event is published, in one
    /// transaction with the outbox row.
    pub async fn on_health_events(
        &self,
        events: &[v1::StatusChanged],
    ) -> Result<usize, PlacerError> {
        let mut tx = self.deps.pool.begin().await?;
        let mut impaired = 0;
        let mut outbox_rows = vec![];
        for e in events {
            self.metrics.status_event(&e.axis);
            let bad = matches!(
                (e.axis.as_str(), e.to.as_str()),
                ("operational", "failed") | ("connectivity", "lost")
            );
            if !bad {
                continue;
            }
            let reason = format!("{}:{}", e.axis, e.to);
            let at = datetime(e.at.as_ref()).unwrap_or_else(Utc::now);
            for a in store::impair(&mut tx, &e.device_id, &reason, at).await? {
                let event = v1::AllocationEvent {
                    kind: "impaired".into(),
                    allocation_id: a.allocation_id.clone(),
                    tenant_id: a.tenant_id.clone(),
                    pool_id: a.pool_id.clone(),
                    device_id: e.device_id.clone(),
                    reason: reason.clone(),
                    at: Some(timestamp(Utc::now())),
                };
                let subject =
                    self.deps
                        .subjects
                        .placer_event("impaired", &a.pool_id, &a.allocation_id);
                outbox_rows.push(fleet_outbox::Row {
                    subject,
                    schema: fleet_proto::schema::<v1::AllocationEvent>(),
                    payload: event.encode_to_vec(),
                    traceparent: fleet_runtime::telemetry::traceparent_of(&tracing::Span::current()),
                });
                tracing::warn!(allocation_id = %a.allocation_id, device_id = %e.device_id, %reason, "allocation impaired");
                impaired += 1;
            }
        }
        PLACER.insert(&mut tx, outbox_rows).await?;
        tx.commit().await?;
        if impaired > 0 {
            self.metrics.impaired.inc_by(impaired as u64);
            self.relay_wake.notify_one();
        }
        Ok(impaired)
    }

    /// Publishes allocation events until shutdown (`fleet_outbox`'s loop).
    async fn relay_loop(self: Arc<Self>, shutdown: Shutdown) {
        PLACER
            .relay_loop(
                &self.deps.pool,
                &self.deps.js,
                &self.relay_wake,
                shutdown,
                |n| {
                    self.metrics.events_published.inc_by(n as u64);
                },
            )
            .await
    }

    async fn resync_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        let every = self.config.resync_interval.max(Duration::from_secs(1));
        loop {
            tokio::select! { _ = tokio::time::sleep(every) => {}, _ = shutdown.wait() => return }
            if let Err(e) = self.rebuild(None).await {
                tracing::warn!(error = %e, "capacity view rebuild failed; next interval retries");
            }
        }
    }
}

/// `<root>.placer.cmd.<verb>`: `allocate`, `release`, `get`, `capacity`.
impl Responder for Placer {
    const SERVICE: &'static str = "placer";

    async fn respond(
        self: Arc<Self>,
        _route: &'static str,
        subject: String,
        payload: Bytes,
    ) -> Result<Bytes, Refusal> {
        let verb = fleet_bus::subjects::command_verb(&subject);
        match self.request(verb, &payload).await {
            Ok(r) => Ok(v1::PlacerReply {
                error: None,
                result: Some(r),
            }
            .encode_to_vec()
            .into()),
            // Database text stays in the placer's log.
            Err(PlacerError::Db(e)) => Err(Refusal::unavailable(
                "the placer's database is unavailable",
                e,
            )),
            Err(e) => Err(Refusal::new(e.code(), e.to_string())),
        }
    }

    fn refused(&self, _route: &'static str, code: ErrorCode, message: &str) -> Bytes {
        v1::PlacerReply {
            error: Some(v1::PlacerError {
                code: code as i32,
                message: message.to_string(),
            }),
            result: None,
        }
        .encode_to_vec()
        .into()
    }
}

/// Runs the placer until shutdown.
pub async fn run(common: Common, config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let placer = Placer::connect(common, config).await?;
    run_with(placer, shutdown).await
}

pub async fn run_with(placer: Arc<Placer>, shutdown: Shutdown) -> anyhow::Result<()> {
    let (mut shell, addr) = Shell::start(
        "placer",
        &placer.config.listen,
        placer.metrics.registry.clone(),
        &placer.deps,
        &shutdown,
    )
    .await?;
    tracing::info!(%addr, devices = placer.view().len(), "placer running");
    shell.respond_commands(
        placer.clone(),
        placer.deps.subjects.placer_cmd_all(),
        Limits {
            concurrency: placer.config.concurrency.max(1),
            deadline: Duration::from_secs(30),
        },
    );
    // A device's first bucket comes with its birth (the `device` event).
    for axis in [Axis::Schedulable, Axis::Device] {
        let p = placer.clone();
        let c = p.consumer(axis);
        let (js, subjects) = (p.deps.js.clone(), p.deps.subjects.clone());
        shell.spawn(c.run(js, subjects, shutdown.clone(), move |events| {
            let p = p.clone();
            async move { p.on_schedulable(events).await }
        }));
    }
    for axis in [Axis::Operational, Axis::Connectivity] {
        let p = placer.clone();
        let c = p.consumer(axis);
        let (js, subjects) = (p.deps.js.clone(), p.deps.subjects.clone());
        shell.spawn(c.run(js, subjects, shutdown.clone(), move |events| {
            let p = p.clone();
            async move {
                let events: Vec<v1::StatusChanged> = events.into_iter().map(|e| e.event).collect();
                p.on_health_events(&events).await.map(|_| ())
            }
        }));
    }
    shell.spawn(placer.clone().resync_loop(shutdown.clone()));
    let wake = placer.clone();
    shell.relay(placer.clone().relay_loop(shutdown.clone()), move || {
        wake.relay_wake.notify_one()
    });
    shell.run(placer.common.shutdown.grace).await
}
