//! The placer (`spec/consumers.md`, "placer"): books GPU atoms (one GPU
//! index on one device) for allocation requests. Candidates come from a
//! capacity view kept from `<root>.status.schedulable.>`; every booking
//! locks the device rows through the schedulable predicate in SQL, re-checks
//! them in Rust under the lock and recounts their booked atoms, so a device
//! cordoned in one transaction cannot receive an allocation in another; a
//! unique index on booked `(device_id, atom)` makes double booking
//! impossible even if a bug got past the lock. A device that becomes
//! operational `failed` or connectivity `lost` marks the allocations on it
//! `impaired` and publishes an event; nothing is moved silently.
//!
//! The API calls this service through `fleet_placer_client::PlacerClient`;
//! tests and benchmarks may call [`Placer`] directly.

mod config;
pub(crate) mod error;
pub(crate) mod metrics;
pub(crate) mod packing;
pub mod service;
pub(crate) mod store;
pub(crate) mod view;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_bus::StreamNames;
use fleet_domain::CapacityBucket;
use fleet_runtime::Common;
use sqlx::PgPool;
use tokio::sync::Notify;

pub use config::Config;
pub use error::PlacerError;
pub use fleet_placer_client::model::{self, AllocateRequest, Allocation, Atom, Capacity};
pub use service::{run, run_with};

use metrics::PlacerMetrics;
use packing::{Domain, Take};
use store::LockMode;
use view::View;

pub struct Placer {
    pub common: Common,
    pub config: Config,
    /// PostgreSQL, NATS, JetStream, the subjects and stream names.
    pub deps: fleet_store::Deps,
    pub metrics: PlacerMetrics,
    view: Mutex<View>,
    relay_wake: Notify,
}

/// The placer's own stream: allocation events.
pub fn events_stream(names: &StreamNames) -> String {
    format!("{}PLACER", names.prefix)
}

/// Why one booking attempt did not book.
enum Miss {
    /// The device was locked elsewhere, failed the re-check, or had fewer
    /// free atoms than planned: plan again without it.
    Device(String),
    /// The idempotency key was taken meanwhile.
    Replay(Box<Allocation>),
    Failed(PlacerError),
}

impl From<sqlx::Error> for Miss {
    fn from(e: sqlx::Error) -> Self {
        Miss::Failed(PlacerError::Db(e))
    }
}

impl From<PlacerError> for Miss {
    fn from(e: PlacerError) -> Self {
        Miss::Failed(e)
    }
}

struct Checked {
    req: AllocateRequest,
    packing: packing::Request,
}

impl Placer {
    /// Connects, checks the schema, creates the streams and builds the
    /// capacity view from PostgreSQL.
    pub async fn connect(common: Common, config: Config) -> anyhow::Result<Arc<Placer>> {
        let deps = fleet_store::Deps::connect(&common, fleet_store::Role::Placer).await?;
        // STATUS and DLQ are the hub's; the placer owns only its events.
        fleet_bus::await_hub_streams(&deps.js, &deps.streams).await;
        service::ensure_events_stream(&deps.js, &deps.streams, &deps.subjects).await?;
        let placer = Arc::new(Placer {
            common,
            config,
            deps,
            metrics: PlacerMetrics::new(),
            view: Mutex::new(View::default()),
            relay_wake: Notify::new(),
        });
        placer.rebuild(None).await?;
        Ok(placer)
    }

    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rebuilds the capacity view (one pool, or all) from PostgreSQL.
    pub async fn rebuild(&self, pool_id: Option<&str>) -> Result<(), PlacerError> {
        let started = self.view().seq();
        let rows = store::load_rows(&self.deps.pool, pool_id).await?;
        let mut v = self.view();
        v.replace(pool_id, rows, started);
        self.metrics.view_devices.set(v.len() as i64);
        Ok(())
    }

    /// A `schedulable` event: the view takes the bucket when it is newer;
    /// a device it does not know is loaded from PostgreSQL.
    pub async fn apply_bucket(
        &self,
        device_id: &str,
        bucket: CapacityBucket,
        version: i64,
    ) -> Result<(), PlacerError> {
        let outcome = self.view().apply_bucket(device_id, bucket, version);
        if outcome == view::BucketUpdate::Unknown {
            let started = self.view().seq();
            if let Some(row) = store::load_row(&self.deps.pool, device_id).await? {
                let mut v = self.view();
                v.upsert(row, started);
                self.metrics.view_devices.set(v.len() as i64);
            }
        }
        Ok(())
    }

    fn check(&self, req: AllocateRequest) -> Result<Checked, PlacerError> {
        let bad = |m: &str| Err(PlacerError::invalid_argument(m.to_string()));
        if req.tenant_id.trim().is_empty() {
            return bad("tenant_id is required");
        }
        if req.pool_id.trim().is_empty() {
            return bad("pool_id is required");
        }
        let max = self.config.max_gpus_per_request;
        if req.gpus == 0 || req.gpus > max {
            return Err(PlacerError::invalid_argument(format!(
                "gpus must be between 1 and {max}"
            )));
        }
        if req.request_id.as_deref().is_some_and(|r| r.len() > 200) {
            return bad("request_id is longer than 200 characters");
        }
        let domain = Domain::parse(req.nvlink_domain.as_deref().unwrap_or(""));
        let packing = packing::Request {
            gpus: req.gpus,
            same_device: req.same_device,
            domain,
            spread_racks: self.config.spread_racks,
        };
        let req = AllocateRequest {
            nvlink_domain: req.nvlink_domain.filter(|d| !d.trim().is_empty()),
            request_id: req.request_id.filter(|r| !r.trim().is_empty()),
            ..req
        };
        Ok(Checked { req, packing })
    }

    /// Books `req.gpus` atoms, or answers why not.
    pub async fn allocate(&self, req: AllocateRequest) -> Result<Allocation, PlacerError> {
        let started = std::time::Instant::now();
        let result = self.allocate_inner(req).await;
        self.metrics.allocation(
            result
                .as_ref()
                .map(|_| "OK")
                .unwrap_or_else(|e| e.code().as_str_name()),
            started.elapsed(),
        );
        result
    }

    async fn allocate_inner(&self, req: AllocateRequest) -> Result<Allocation, PlacerError> {
        let Checked { req, packing } = self.check(req)?;
        if let Some(rid) = &req.request_id {
            if let Some(a) = store::find_by_request(&self.deps.pool, &req.tenant_id, rid).await? {
                return Ok(a);
            }
        }
        match store::pool_and_tenant(&self.deps.pool, &req.pool_id, &req.tenant_id).await? {
            None => return Err(PlacerError::not_found(format!("pool {}", req.pool_id))),
            Some((_, false)) => {
                return Err(PlacerError::not_found(format!("tenant {}", req.tenant_id)))
            }
            Some((Some(owner), _)) if owner != req.tenant_id => {
                return Err(PlacerError::forbidden(format!(
                    "pool {} belongs to another tenant",
                    req.pool_id
                )))
            }
            Some(_) => {}
        }

        // Fast path: plan on the view, lock with SKIP LOCKED; devices this
        // process is booking are left to their bookers.
        let mut excluded: HashSet<String> = HashSet::new();
        for _ in 0..self.config.max_attempts.max(1) {
            let plan = {
                let mut v = self.view();
                // A single device through the best-fit index; the whole
                // pool is listed only for split or domain-bound requests.
                let single = match packing.domain {
                    Domain::Any | Domain::One => v
                        .best_single(&req.pool_id, req.gpus, &excluded)
                        .map(|t| vec![t]),
                    Domain::Named(_) => None,
                };
                let plan = match single {
                    Some(p) => Some(p),
                    None if req.same_device && !matches!(packing.domain, Domain::Named(_)) => None,
                    None => {
                        let cands = v.candidates(&req.pool_id, &excluded, false);
                        packing::plan(&packing, &cands)
                    }
                };
                if let Some(p) = &plan {
                    v.claim(p);
                }
                plan
            };
            let Some(plan) = plan else { break };
            self.metrics.attempts.inc();
            let result = self.book(&req, &plan, LockMode::Skip).await;
            self.view().unclaim(&plan);
            match result {
                Ok(a) => return Ok(a),
                Err(Miss::Device(d)) => {
                    excluded.insert(d);
                }
                Err(Miss::Replay(a)) => return Ok(*a),
                Err(Miss::Failed(e)) => return Err(e),
            }
        }

        // Slow path: the view may be behind (another replica booked, a
        // device came back): rebuild this pool from PostgreSQL, then lock in
        // device-id order and wait for holders, so contention alone never
        // reads as exhaustion.
        self.metrics.slow_path.inc();
        self.rebuild(Some(&req.pool_id)).await?;
        let mut excluded: HashSet<String> = HashSet::new();
        for _ in 0..self.config.max_attempts.max(1) {
            let plan = {
                let v = self.view();
                let cands = v.candidates(&req.pool_id, &excluded, true);
                packing::plan(&packing, &cands)
            };
            let Some(mut plan) = plan else { break };
            plan.sort_by(|a, b| a.device_id.cmp(&b.device_id));
            self.metrics.attempts.inc();
            match self.book(&req, &plan, LockMode::Wait).await {
                Ok(a) => return Ok(a),
                Err(Miss::Device(d)) => {
                    excluded.insert(d);
                }
                Err(Miss::Replay(a)) => return Ok(*a),
                Err(Miss::Failed(e)) => return Err(e),
            }
        }
        Err(PlacerError::insufficient_capacity(format!(
            "pool {} has no {}{} free GPUs that are schedulable",
            req.pool_id,
            req.gpus,
            match (&packing.domain, req.same_device) {
                (_, true) => " (on one device)",
                (Domain::Named(_), _) => " (in that NVLink domain)",
                (Domain::One, _) => " (in one NVLink domain)",
                (Domain::Any, _) => "",
            }
        )))
    }

    /// One transaction: lock each planned device (re-checked), pick its
    /// lowest free atoms, insert the allocation, commit.
    async fn book(
        &self,
        req: &AllocateRequest,
        plan: &[Take],
        mode: LockMode,
    ) -> Result<Allocation, Miss> {
        let mut tx = self.deps.pool.begin().await?;
        if mode == LockMode::Wait {
            sqlx::query("SET LOCAL lock_timeout = '5s'")
                .execute(&mut *tx)
                .await?;
        }
        let mut atoms: Vec<(String, u32, i64)> = Vec::with_capacity(req.gpus as usize);
        let mut domain: Option<Option<String>> = None;
        for take in plan {
            let locked =
                match store::lock_device(&mut tx, &take.device_id, &req.pool_id, mode).await {
                    Ok(l) => l,
                    // lock_timeout: treat as held elsewhere.
                    Err(PlacerError::Db(sqlx::Error::Database(e)))
                        if e.code().as_deref() == Some("55P03") =>
                    {
                        None
                    }
                    Err(e) => return Err(e.into()),
                };
            let Some(locked) = locked else {
                return Err(Miss::Device(take.device_id.clone()));
            };
            if locked.bucket != CapacityBucket::Schedulable {
                // SQL and Rust disagree: the predicate pair is broken.
                tracing::error!(device_id = %locked.id, bucket = %locked.bucket,
                    "the SQL schedulable predicate passed a device the Rust predicate refuses");
                return Err(Miss::Device(take.device_id.clone()));
            }
            let domain_ok = match &req.nvlink_domain {
                None => true,
                Some(d) if d == "*" => {
                    let same = domain
                        .as_ref()
                        .is_none_or(|prev| *prev == locked.nvlink_domain);
                    domain = Some(locked.nvlink_domain.clone());
                    same && (plan.len() == 1 || locked.nvlink_domain.is_some())
                }
                Some(d) => locked.nvlink_domain.as_deref() == Some(d.as_str()),
            };
            let picked = packing::pick_atoms(locked.gpus, &locked.booked, take.atoms);
            self.view()
                .observed(&locked.id, locked.version, locked.bucket, locked.gpus);
            let (true, Some(picked)) = (domain_ok, picked) else {
                return Err(Miss::Device(take.device_id.clone()));
            };
            atoms.extend(
                picked
                    .into_iter()
                    .map(|a| (locked.id.clone(), a, locked.version)),
            );
        }
        let id = format!("alloc_{}", ulid::Ulid::new());
        let new = store::NewAllocation {
            id: &id,
            tenant_id: &req.tenant_id,
            pool_id: &req.pool_id,
            gpus: req.gpus,
            same_device: req.same_device,
            nvlink_domain: req.nvlink_domain.as_deref(),
            request_id: req.request_id.as_deref(),
            atoms,
        };
        let created_at = match store::insert_allocation(&mut tx, &new).await {
            Ok(at) => at,
            Err(sqlx::Error::Database(e))
                if e.code().as_deref() == Some("23505")
                    && e.constraint() == Some("allocations_request") =>
            {
                drop(tx);
                let rid = req.request_id.as_deref().unwrap_or_default();
                return match store::find_by_request(&self.deps.pool, &req.tenant_id, rid).await {
                    Ok(Some(a)) => Err(Miss::Replay(Box::new(a))),
                    Ok(None) => Err(PlacerError::unavailable("request_id race").into()),
                    Err(e) => Err(e.into()),
                };
            }
            Err(sqlx::Error::Database(e))
                if e.code().as_deref() == Some("23505")
                    && e.constraint() == Some("allocation_atoms_booked") =>
            {
                // The lock should make this impossible: count it and retry.
                self.metrics.double_booking_refused.inc();
                tracing::error!(allocation_id = %id, "the booked-atom index refused a double booking");
                return Err(Miss::Device(plan[0].device_id.clone()));
            }
            Err(e) => return Err(e.into()),
        };
        tx.commit().await?;
        {
            let mut v = self.view();
            for (device, n) in count_by_device(&new.atoms) {
                v.add_booked(&device, n);
            }
        }
        let mut atoms: Vec<Atom> = new
            .atoms
            .iter()
            .map(|(d, a, _)| Atom {
                device_id: d.clone(),
                atom: *a,
            })
            .collect();
        atoms.sort_by(|a, b| (&a.device_id, a.atom).cmp(&(&b.device_id, b.atom)));
        Ok(Allocation {
            id,
            tenant_id: req.tenant_id.clone(),
            pool_id: req.pool_id.clone(),
            gpus: req.gpus,
            same_device: req.same_device,
            nvlink_domain: req.nvlink_domain.clone(),
            status: "active".into(),
            atoms,
            impaired_reason: None,
            created_at,
            impaired_at: None,
            released_at: None,
            request_id: req.request_id.clone(),
        })
    }

    /// Releases an allocation; releasing twice answers the released record.
    pub async fn release(
        &self,
        allocation_id: &str,
        tenant_id: Option<&str>,
    ) -> Result<Allocation, PlacerError> {
        if allocation_id.trim().is_empty() {
            return Err(PlacerError::invalid_argument("allocation_id is required"));
        }
        let tenant = tenant_id.filter(|t| !t.trim().is_empty());
        let freed = store::release(&self.deps.pool, allocation_id, tenant)
            .await?
            .ok_or_else(|| PlacerError::not_found(format!("allocation {allocation_id}")))?;
        {
            let mut v = self.view();
            for (device, n) in freed {
                v.add_booked(&device, -n);
            }
        }
        self.metrics.released.inc();
        self.get(allocation_id).await
    }

    pub async fn get(&self, allocation_id: &str) -> Result<Allocation, PlacerError> {
        store::get_allocation(&self.deps.pool, allocation_id)
            .await?
            .ok_or_else(|| PlacerError::not_found(format!("allocation {allocation_id}")))
    }

    /// GPUs per bucket from the capacity view.
    pub async fn capacity(&self, pool_id: &str) -> Result<Capacity, PlacerError> {
        if let Some(c) = self.view().capacity(pool_id) {
            return Ok(c);
        }
        match store::pool_owner(&self.deps.pool, pool_id).await? {
            None => Err(PlacerError::not_found(format!("pool {pool_id}"))),
            Some(_) => Ok(Capacity {
                pool_id: pool_id.to_string(),
                ..Default::default()
            }),
        }
    }

    /// GPUs per bucket straight from PostgreSQL (what the view converges to).
    pub async fn capacity_from_db(&self, pool_id: &str) -> Result<Capacity, PlacerError> {
        capacity_from_db(&self.deps.pool, pool_id).await
    }
}

/// GPUs per bucket of a pool straight from PostgreSQL; usable without a
/// running placer (the API may answer from it when the placer is away).
pub async fn capacity_from_db(pool: &PgPool, pool_id: &str) -> Result<Capacity, PlacerError> {
    if store::pool_owner(pool, pool_id).await?.is_none() {
        return Err(PlacerError::not_found(format!("pool {pool_id}")));
    }
    let rows = store::load_rows(pool, Some(pool_id)).await?;
    Ok(view::capacity_of(pool_id, rows.iter()))
}

fn count_by_device(atoms: &[(String, u32, i64)]) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = Vec::new();
    for (d, _, _) in atoms {
        match out.iter_mut().find(|(x, _)| x == d) {
            Some((_, n)) => *n += 1,
            None => out.push((d.clone(), 1)),
        }
    }
    out
}

/// How long a request waits for the placer before the caller says 503.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
