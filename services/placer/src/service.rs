//! The placer as a service: requests over core NATS request/reply
//! (`<root>.placer.cmd.<verb>`), three durable STATUS consumers
//! (`schedulable` feeds the capacity view; `operational` and `connectivity`
//! impair allocations), a periodic rebuild of the view from PostgreSQL, the
//! allocation-event relay, and `/healthz` `/readyz` `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, stream};
use chrono::Utc;
use fleet_bus::{StreamNames, Subjects};
use fleet_consume::{StatusConsumer, StatusEvent};
use fleet_domain::{Axis, CapacityBucket};
use fleet_proto::{datetime, timestamp, v1, Message, SchemaName};
use fleet_runtime::http;
use fleet_runtime::{FleetConfig, Shutdown};
use futures::StreamExt;

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

fn reply_err(e: &PlacerError) -> v1::PlacerReply {
    v1::PlacerReply {
        error: Some(e.to_proto()),
        result: None,
    }
}

fn decode<M: Message + Default>(payload: &[u8], what: &str) -> Result<M, PlacerError> {
    M::decode(payload).map_err(|e| PlacerError::InvalidArgument(format!("undecodable {what}: {e}")))
}

impl Placer {
    /// Decodes and answers one request; never panics on input.
    pub async fn request_bytes(&self, verb: &str, payload: &[u8]) -> v1::PlacerReply {
        use v1::placer_reply::Result as R;
        let result = match verb {
            "allocate" => match decode::<v1::AllocateRequest>(payload, "AllocateRequest") {
                Ok(r) => self
                    .allocate(AllocateRequest::from_proto(&r))
                    .await
                    .map(|a| R::Allocation(a.to_proto())),
                Err(e) => Err(e),
            },
            "release" => match decode::<v1::ReleaseRequest>(payload, "ReleaseRequest") {
                Ok(r) => self
                    .release(&r.allocation_id, Some(r.tenant_id.as_str()))
                    .await
                    .map(|a| R::Allocation(a.to_proto())),
                Err(e) => Err(e),
            },
            "get" => match decode::<v1::GetAllocationRequest>(payload, "GetAllocationRequest") {
                Ok(r) => self
                    .get(&r.allocation_id)
                    .await
                    .map(|a| R::Allocation(a.to_proto())),
                Err(e) => Err(e),
            },
            "capacity" => match decode::<v1::CapacityRequest>(payload, "CapacityRequest") {
                Ok(r) => self
                    .capacity(&r.pool_id)
                    .await
                    .map(|c| R::Capacity(c.to_proto())),
                Err(e) => Err(e),
            },
            other => Err(PlacerError::InvalidArgument(format!(
                "unknown placer verb {other:?}"
            ))),
        };
        match result {
            Ok(r) => v1::PlacerReply {
                error: None,
                result: Some(r),
            },
            Err(e) => {
                if matches!(e, PlacerError::Db(_)) {
                    tracing::error!(verb, error = %e, "placer request failed in the store");
                }
                reply_err(&e)
            }
        }
    }

    async fn serve_requests(self: Arc<Self>, mut shutdown: Shutdown) {
        let mut sub = loop {
            match self
                .nats
                .queue_subscribe(self.subjects.placer_cmd_all(), "placer".into())
                .await
            {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot subscribe to placer requests; retrying");
                    tokio::select! { _ = tokio::time::sleep(Duration::from_secs(1)) => {}, _ = shutdown.wait() => return }
                }
            }
        };
        let limit = Arc::new(tokio::sync::Semaphore::new(
            self.config.placer.concurrency.max(1),
        ));
        loop {
            let msg = tokio::select! { m = sub.next() => m, _ = shutdown.wait() => None };
            let Some(msg) = msg else { break };
            let Some(reply_to) = msg.reply.clone() else {
                continue;
            };
            let Ok(permit) = limit.clone().acquire_owned().await else {
                break;
            };
            let placer = self.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let verb = msg
                    .subject
                    .as_str()
                    .rsplit('.')
                    .next()
                    .unwrap_or("")
                    .to_string();
                let reply = placer.request_bytes(&verb, &msg.payload).await;
                if let Err(e) = placer
                    .nats
                    .publish(reply_to, reply.encode_to_vec().into())
                    .await
                {
                    tracing::warn!(error = %e, "could not send placer reply");
                }
            });
        }
        let _ = sub.unsubscribe().await;
    }

    fn consumer(&self, axis: Axis) -> StatusConsumer {
        StatusConsumer {
            stream: self.streams.status(),
            durable: format!("placer-{axis}"),
            filter: self.subjects.status_axis(axis.as_str()),
            ack_wait: Duration::from_secs(self.config.placer.ack_wait_secs.max(1)),
            batch: 256,
            fetch_wait: Duration::from_millis(200),
        }
    }

    /// `schedulable` events into the capacity view.
    async fn on_schedulable(&self, events: Vec<StatusEvent>) -> Result<(), PlacerError> {
        for e in events {
            self.metrics.status_event("schedulable");
            let Ok(bucket) = CapacityBucket::parse(&e.event.to) else {
                tracing::warn!(device_id = %e.event.device_id, to = %e.event.to, "schedulable event names no bucket; ignored");
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
        let mut tx = self.pool.begin().await?;
        let mut impaired = 0;
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
                let subject = self
                    .subjects
                    .placer_event("impaired", &a.pool_id, &a.allocation_id);
                store::outbox_insert(
                    &mut tx,
                    &subject,
                    v1::AllocationEvent::NAME,
                    &event.encode_to_vec(),
                )
                .await?;
                tracing::warn!(allocation_id = %a.allocation_id, device_id = %e.device_id, %reason, "allocation impaired");
                impaired += 1;
            }
        }
        tx.commit().await?;
        if impaired > 0 {
            self.metrics.impaired.inc_by(impaired as u64);
            self.relay_wake.notify_one();
        }
        Ok(impaired)
    }

    /// Publishes pending allocation events; returns how many were acked.
    pub async fn relay_once(&self) -> anyhow::Result<usize> {
        let mut tx = self.pool.begin().await?;
        let rows = store::outbox_pending(&mut tx, 500).await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let mut inflight = Vec::with_capacity(rows.len());
        for (id, subject, schema, payload) in &rows {
            let headers = fleet_bus::headers(schema, None);
            match fleet_bus::publish(
                &self.js,
                subject.clone(),
                &format!("placer-{id}"),
                headers,
                payload.clone().into(),
            )
            .await
            {
                Ok(ack) => inflight.push((*id, ack)),
                Err(e) => {
                    tracing::warn!(error = %e, outbox_id = id, "publish failed");
                    break;
                }
            }
        }
        let mut acked = Vec::with_capacity(inflight.len());
        for (id, ack) in inflight {
            match ack.await {
                Ok(_) => acked.push(id),
                Err(e) => {
                    tracing::warn!(error = %e, outbox_id = id, "no PubAck");
                    break;
                }
            }
        }
        store::outbox_delete(&mut tx, &acked).await?;
        tx.commit().await?;
        self.metrics.events_published.inc_by(acked.len() as u64);
        Ok(acked.len())
    }

    async fn relay_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        loop {
            match self.relay_once().await {
                Ok(n) if n > 0 => continue,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "placer relay round failed; retrying"),
            }
            if shutdown.is_triggered() {
                return;
            }
            tokio::select! {
                _ = self.relay_wake.notified() => {},
                _ = tokio::time::sleep(Duration::from_secs(1)) => {},
                _ = shutdown.wait() => {
                    // Flush what is left, then stop.
                    let _ = self.relay_once().await;
                    return;
                }
            }
        }
    }

    async fn resync_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        let every = Duration::from_secs(self.config.placer.resync_secs.max(1));
        loop {
            tokio::select! { _ = tokio::time::sleep(every) => {}, _ = shutdown.wait() => return }
            if let Err(e) = self.rebuild(None).await {
                tracing::warn!(error = %e, "capacity view rebuild failed; next interval retries");
            }
        }
    }
}

/// Runs the placer until shutdown.
pub async fn run(config: FleetConfig, shutdown: Shutdown) -> anyhow::Result<()> {
    let placer = Placer::connect(config).await?;
    run_with(placer, shutdown).await
}

pub async fn run_with(placer: Arc<Placer>, mut shutdown: Shutdown) -> anyhow::Result<()> {
    let addr = http::serve_ops(
        &placer.config.placer.listen,
        "placer.listen",
        placer.metrics.registry.clone(),
        placer.nats.clone(),
        placer.pool.clone(),
        shutdown.clone(),
    )
    .await?;
    tracing::info!(%addr, devices = placer.view().len(), "placer running");

    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(placer.clone().serve_requests(shutdown.clone()));
    {
        let p = placer.clone();
        let c = p.consumer(Axis::Schedulable);
        let (js, subjects) = (p.js.clone(), p.subjects.clone());
        tasks.spawn(c.run(js, subjects, shutdown.clone(), move |events| {
            let p = p.clone();
            async move { p.on_schedulable(events).await }
        }));
    }
    for axis in [Axis::Operational, Axis::Connectivity] {
        let p = placer.clone();
        let c = p.consumer(axis);
        let (js, subjects) = (p.js.clone(), p.subjects.clone());
        tasks.spawn(c.run(js, subjects, shutdown.clone(), move |events| {
            let p = p.clone();
            async move {
                let events: Vec<v1::StatusChanged> = events.into_iter().map(|e| e.event).collect();
                p.on_health_events(&events).await.map(|_| ())
            }
        }));
    }
    tasks.spawn(placer.clone().resync_loop(shutdown.clone()));
    let relay = tokio::spawn(placer.clone().relay_loop(shutdown.clone()));

    shutdown.wait().await;
    while tasks.join_next().await.is_some() {}
    let _ = relay.await;
    placer.nats.flush().await.ok();
    tracing::info!("placer stopped");
    Ok(())
}
