//! Radar (`spec/consumers.md`, "radar"): the Radar outbound projection.
//! It reads `inventory`, `operational`, `health` and `triage` changes from
//! `STATUS` and publishes one `RadarProjection` per device on
//! `<radar root>.projection.v1.<site>.<device>` to the `RADAR` stream,
//! which keeps the last message per subject, so a new reader gets the whole
//! fleet. Devices of a tenant that opted out (`annotations.radar_ignore`
//! with a reason) get one tombstone each; inventory-only devices are
//! projected for inventory only. At start, every projection is recomputed
//! from PostgreSQL and compared with what the stream holds; only
//! differences are published. Radar never writes a device field.

mod config;
pub(crate) mod mapping;
pub(crate) mod metrics;
pub(crate) mod store;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::consumer;
use chrono::Utc;
use fleet_bus::{Limits, Refusal, Responder};
use fleet_consume::{StatusConsumer, StatusEvent};
use fleet_domain::Axis;
use fleet_proto::ErrorCode;
use fleet_proto::{timestamp, v1, Message};
use fleet_runtime::{Common, Shutdown};
use fleet_store::Shell;
use futures::StreamExt;
use sha2::{Digest, Sha256};

pub use config::Config;
use mapping::Decision;
pub use metrics::RadarMetrics;

/// What a projection says, without its version and time: two projections
/// with the same key are the same to a Radar reader.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    site: String,
    name: String,
    availability: String,
    health: String,
    inventory_only: bool,
    inventory_status: String,
    tombstone: bool,
    tombstone_reason: String,
}

impl Key {
    fn of(p: &v1::RadarProjection) -> Key {
        Key {
            site: p.site.clone(),
            name: p.name.clone(),
            availability: p.availability.clone(),
            health: p.health.clone(),
            inventory_only: p.inventory_only,
            inventory_status: p.inventory_status.clone(),
            tombstone: p.tombstone,
            tombstone_reason: p.tombstone_reason.clone(),
        }
    }

    fn digest(&self) -> String {
        let s = format!("{self:?}");
        hex::encode(&Sha256::digest(s.as_bytes())[..6])
    }
}

#[derive(Debug, Clone)]
struct Published {
    key: Key,
    version: i64,
}

pub struct Radar {
    pub common: Common,
    pub config: Config,
    /// PostgreSQL, NATS, JetStream, the subjects and stream names.
    pub deps: fleet_store::Deps,
    pub metrics: RadarMetrics,
    /// What the stream holds per device; the lock also serialises
    /// publishing, so an older read never overwrites a newer projection.
    published: tokio::sync::Mutex<HashMap<String, Published>>,
}

/// The projection of one device row.
pub fn projection(row: &store::Row, at: chrono::DateTime<Utc>) -> v1::RadarProjection {
    let mut p = v1::RadarProjection {
        device_id: row.id.clone(),
        site: row.site.clone(),
        name: row.name.clone(),
        availability: String::new(),
        health: String::new(),
        inventory_only: row.device.inventory_only,
        inventory_status: row.device.inventory.as_str().into(),
        tombstone: false,
        tombstone_reason: String::new(),
        version: row.version,
        at: Some(timestamp(at)),
    };
    match mapping::decide(&row.device) {
        Decision::Project {
            availability,
            health,
        } => {
            p.availability = availability.as_str().into();
            p.health = health.as_str().into();
        }
        Decision::InventoryOnly => {}
        Decision::Tombstone(reason) => {
            p.tombstone = true;
            p.tombstone_reason = reason.as_str().into();
        }
    }
    p
}

impl Radar {
    pub async fn connect(common: Common, config: Config) -> anyhow::Result<Arc<Radar>> {
        let deps = fleet_store::Deps::connect(&common, fleet_store::Role::Radar).await?;
        fleet_bus::ensure_owned(&deps.js, &common.nats, fleet_bus::Owner::Radar).await?;
        fleet_bus::await_hub_streams(&deps.js, &deps.streams).await;
        Ok(Arc::new(Radar {
            common,
            config,
            deps,
            metrics: RadarMetrics::new(),
            published: tokio::sync::Mutex::new(HashMap::new()),
        }))
    }

    /// Reads what the stream holds (its last message per subject).
    pub async fn load_published(&self) -> anyhow::Result<usize> {
        let stream = self.deps.js.get_stream(self.deps.streams.radar()).await?;
        let c = stream
            .create_consumer(consumer::pull::Config {
                deliver_policy: consumer::DeliverPolicy::LastPerSubject,
                filter_subject: self.deps.subjects.radar_all(),
                ack_policy: consumer::AckPolicy::None,
                inactive_threshold: Duration::from_secs(60),
                ..Default::default()
            })
            .await
            .context("radar reader")?;
        let name = c.cached_info().name.clone();
        let mut pending = c.cached_info().num_pending;
        let mut seen = HashMap::new();
        while pending > 0 {
            let mut batch = c
                .fetch()
                .max_messages(pending.min(1000) as usize)
                .expires(Duration::from_secs(2))
                .messages()
                .await?;
            let mut n = 0;
            while let Some(m) = batch.next().await {
                let m = m.map_err(|e| anyhow::anyhow!("radar read: {e}"))?;
                n += 1;
                match v1::RadarProjection::decode(m.payload.as_ref()) {
                    Ok(p) => {
                        seen.insert(
                            p.device_id.clone(),
                            Published {
                                key: Key::of(&p),
                                version: p.version,
                            },
                        );
                    }
                    Err(e) => {
                        tracing::warn!(subject = %m.subject, error = %e, "undecodable projection on RADAR; it will be replaced")
                    }
                }
            }
            if n == 0 {
                break;
            }
            pending = pending.saturating_sub(n);
        }
        let _ = stream.delete_consumer(&name).await;
        let n = seen.len();
        *self.published.lock().await = seen;
        Ok(n)
    }

    /// Publishes the projections of `rows` that differ from what the
    /// stream holds; returns how many were published.
    pub async fn project(&self, rows: Vec<store::Row>) -> anyhow::Result<usize> {
        let now = Utc::now();
        let mut published = self.published.lock().await;
        let mut inflight = Vec::new();
        for row in &rows {
            let p = projection(row, now);
            let key = Key::of(&p);
            let before = published.get(&row.id);
            match before {
                // An older read than what is out there.
                Some(b) if row.version < b.version => continue,
                Some(b) if b.key == key => continue,
                // A deleted device that was never projected needs nothing.
                None if row.device.deleted => continue,
                _ => {}
            }
            if let Some(b) = before.filter(|b| b.key.site != key.site && !b.key.tombstone) {
                // Moved to another site: the old subject is retired.
                let mut t = p.clone();
                t.site = b.key.site.clone();
                t.tombstone = true;
                t.tombstone_reason = "moved".into();
                t.availability.clear();
                t.health.clear();
                inflight.push((None, self.send(&t).await?));
            }
            inflight.push((
                Some((row.id.clone(), key, row.version)),
                self.send(&p).await?,
            ));
        }
        let mut n = 0;
        for (done, ack) in inflight {
            ack.await
                .map_err(|e| anyhow::anyhow!("radar PubAck: {e}"))?;
            if let Some((id, key, version)) = done {
                self.metrics.published(if key.tombstone {
                    "tombstone"
                } else {
                    "projection"
                });
                published.insert(id, Published { key, version });
                n += 1;
            }
        }
        Ok(n)
    }

    async fn send(
        &self,
        p: &v1::RadarProjection,
    ) -> anyhow::Result<async_nats::jetstream::context::PublishAckFuture> {
        let subject = self.deps.subjects.radar(&p.site, &p.device_id);
        let msg_id = format!(
            "radar-{}-{}-{}",
            p.device_id,
            p.version,
            Key::of(p).digest()
        );
        let headers = fleet_bus::headers(&fleet_proto::schema::<v1::RadarProjection>(), None);
        Ok(fleet_bus::publish(
            &self.deps.js,
            subject,
            &msg_id,
            headers,
            p.encode_to_vec().into(),
        )
        .await?)
    }

    /// Every device from PostgreSQL; publishes the differences.
    pub async fn rebuild(&self) -> anyhow::Result<usize> {
        let rows = store::all(&self.deps.pool).await?;
        self.metrics.devices.set(rows.len() as i64);
        self.project(rows).await
    }

    async fn on_events(&self, events: Vec<StatusEvent>) -> anyhow::Result<()> {
        let mut ids: Vec<String> = events.iter().map(|e| e.event.device_id.clone()).collect();
        ids.sort();
        ids.dedup();
        self.metrics.status_events.inc_by(events.len() as u64);
        let rows = store::by_ids(&self.deps.pool, &ids).await?;
        self.project(rows).await?;
        Ok(())
    }

    /// Sets or clears a tenant's opt-out (a reason is required to set it)
    /// and re-projects the tenant's devices at once.
    pub async fn radar_ignore(
        &self,
        req: &v1::RadarIgnore,
    ) -> Result<(serde_json::Value, usize), Refusal> {
        if req.tenant_id.trim().is_empty() {
            return Err(Refusal::invalid("tenant_id is required"));
        }
        let reason = req.reason.trim();
        if req.ignore {
            let candidate = serde_json::json!({mapping::RADAR_IGNORE: true, mapping::RADAR_IGNORE_REASON: reason});
            if let Err(e) = mapping::validate_annotations(&candidate) {
                return Err(Refusal::invalid(e.0));
            }
        }
        let unavailable = |e: &dyn std::fmt::Display| {
            Refusal::unavailable("the radar service cannot reach its database or NATS", e)
        };
        let annotations =
            store::set_radar_ignore(&self.deps.pool, &req.tenant_id, req.ignore, reason)
                .await
                .map_err(|e| unavailable(&e))?
                .ok_or_else(|| {
                    Refusal::new(ErrorCode::NotFound, format!("tenant {}", req.tenant_id))
                })?;
        tracing::info!(tenant_id = %req.tenant_id, ignore = req.ignore, actor = %req.actor, "radar opt-out changed");
        let rows = store::of_tenant(&self.deps.pool, &req.tenant_id)
            .await
            .map_err(|e| unavailable(&e))?;
        let n = self.project(rows).await.map_err(|e| unavailable(&e))?;
        Ok((annotations, n))
    }

    async fn resync_loop(self: Arc<Self>, mut shutdown: Shutdown) {
        let every = self.config.resync_interval.max(Duration::from_secs(1));
        loop {
            tokio::select! { _ = tokio::time::sleep(every) => {}, _ = shutdown.wait() => return }
            // A rebuild at 100,000 devices outlasts the shutdown grace; one
            // cut short is safe to drop: projections are last-per-subject
            // and the next start rebuilds from PostgreSQL again.
            let rebuilt = tokio::select! {
                r = self.rebuild() => r,
                _ = shutdown.wait() => return,
            };
            match rebuilt {
                Ok(n) if n > 0 => {
                    tracing::info!(published = n, "radar resync published differences")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "radar resync failed; next interval retries"),
            }
        }
    }
}

/// `<root>.radar.cmd.<verb>`: `radar_ignore`.
impl Responder for Radar {
    const SERVICE: &'static str = "radar";

    async fn respond(
        self: Arc<Self>,
        _route: &'static str,
        subject: String,
        payload: bytes::Bytes,
    ) -> Result<bytes::Bytes, Refusal> {
        let verb = fleet_bus::subjects::command_verb(&subject);
        let (annotations, n) = match verb {
            "radar_ignore" => {
                let r = v1::RadarIgnore::decode(payload.as_ref())
                    .map_err(|e| Refusal::invalid(format!("undecodable RadarIgnore: {e}")))?;
                self.radar_ignore(&r).await?
            }
            other => return Err(Refusal::invalid(format!("unknown radar verb {other:?}"))),
        };
        Ok(v1::RadarReply {
            error: None,
            annotations_json: serde_json::to_vec(&annotations).unwrap_or_default(),
            devices: n as i64,
        }
        .encode_to_vec()
        .into())
    }

    fn refused(&self, _route: &'static str, code: ErrorCode, message: &str) -> bytes::Bytes {
        v1::RadarReply {
            error: Some(v1::RadarError {
                code: code as i32,
                message: message.to_string(),
            }),
            annotations_json: vec![],
            devices: 0,
        }
        .encode_to_vec()
        .into()
    }
}

/// Runs Radar until shutdown.
pub async fn run(common: Common, config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let radar = Radar::connect(common, config).await?;
    run_with(radar, shutdown).await
}

pub async fn run_with(radar: Arc<Radar>, shutdown: Shutdown) -> anyhow::Result<()> {
    let held = radar.load_published().await?;
    let published = radar.rebuild().await?;
    tracing::info!(held, published, "radar projections rebuilt from PostgreSQL");
    let (mut shell, addr) = Shell::start(
        "radar",
        &radar.config.listen,
        radar.metrics.registry.clone(),
        &radar.deps,
        &shutdown,
    )
    .await?;
    tracing::info!(%addr, "radar running");
    for axis in [
        Axis::Device,
        Axis::Inventory,
        Axis::Operational,
        Axis::Health,
        Axis::Triage,
    ] {
        let c = StatusConsumer::axis(
            &radar.deps.streams,
            &radar.deps.subjects,
            "radar",
            axis.as_str(),
            radar.config.ack_wait.max(Duration::from_secs(1)),
            radar.config.batch_size.max(1),
        );
        let r = radar.clone();
        let (js, subjects) = (r.deps.js.clone(), r.deps.subjects.clone());
        shell.spawn(c.run(js, subjects, shutdown.clone(), move |events| {
            let r = r.clone();
            async move { r.on_events(events).await }
        }));
    }
    shell.respond_commands(
        radar.clone(),
        radar.deps.subjects.radar_cmd_all(),
        Limits {
            concurrency: 16,
            deadline: Duration::from_secs(30),
        },
    );
    shell.spawn(radar.clone().resync_loop(shutdown.clone()));
    shell.run(radar.common.shutdown.grace).await
}
