//! The `join` command: a node agent's join, sent by the gateway after it
//! normalised the hardware identifiers (`fleet_domain::hardware`). A
//! trusted hardware key already on a live device re-joins that device in
//! place, bumping `identity_generation` so every earlier credential dies;
//! otherwise a device imported without a key (NetBox) of the same site,
//! name and serial is claimed: the key is recorded on it; otherwise the
//! device is created in `adopting`, its role from the pool kind. The devices table's unique index on trusted keys settles two
//! concurrent joins of one machine: the loser retries as a re-join.

use crate::store::devices::{self, AgentFacts, NewDevice};
use chrono::Utc;
use fleet_domain::state::DeviceRecord;
use fleet_domain::*;
use fleet_proto::v1;
use fleet_store::StoreError;

use crate::commands::CommandError;
use crate::reply;
use crate::work::Work;
use crate::Hub;
use fleet_outbox::Pending;
use fleet_proto::v1::hub_reply::Record;

fn invalid(m: impl Into<String>) -> CommandError {
    CommandError::Domain(DomainError::InvalidArgument(m.into()))
}

fn opt(s: &str) -> Option<String> {
    (!s.trim().is_empty()).then(|| s.trim().to_string())
}

/// The checked fields of a join.
struct Join {
    site: String,
    pool_id: Option<String>,
    name: String,
    hardware_key: String,
    trusted: bool,
    serial: Option<String>,
    trust: Trust,
    owner_tenant_id: Option<String>,
    gpu_count: i32,
    adopt: bool,
}

fn check(j: v1::JoinDevice) -> Result<Join, CommandError> {
    let site = opt(&j.site).ok_or_else(|| invalid("site is required"))?;
    let name = opt(&j.name).ok_or_else(|| invalid("name is required"))?;
    let key = j.hardware_key.trim().to_ascii_lowercase();
    if key.len() != 64 || !key.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(invalid("hardware_key must be a hex SHA-256"));
    }
    if !(0..=256).contains(&j.gpu_count) {
        return Err(invalid(format!(
            "gpu_count {} is out of range",
            j.gpu_count
        )));
    }
    let trust = match opt(&j.trust) {
        None => Trust::Platform,
        Some(t) => Trust::parse(&t)?,
    };
    Ok(Join {
        site,
        pool_id: opt(&j.pool_id),
        name,
        hardware_key: key,
        trusted: j.hardware_key_trusted,
        serial: opt(&j.serial),
        trust,
        owner_tenant_id: opt(&j.owner_tenant_id),
        gpu_count: j.gpu_count,
        adopt: j.adopt,
    })
}

/// A unique-violation on the named index.
fn violates(e: &CommandError, index: &str) -> bool {
    match e {
        CommandError::Store(StoreError::Db(sqlx::Error::Database(db))) => {
            db.code().as_deref() == Some("23505") && db.constraint() == Some(index)
        }
        _ => false,
    }
}

/// Acceptance passed at the gateway: a device still `adopting` is adopted
/// with the join, in its transaction (one hub command an agent instead of
/// two, and no second lock of the device behind the observations its join
/// set off).
fn adopt_with(r: &mut DeviceRecord, j: &Join) -> Result<(), CommandError> {
    if j.adopt && r.provision_state == ProvisionState::Adopting {
        fleet_domain::commands::adopt(r)?;
    }
    Ok(())
}

/// How a join found its device.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Found {
    Created,
    Rejoined,
    Claimed,
}

fn joined(
    t: &fleet_domain::state::DeviceState,
    found: Found,
    hardware_key_trusted: bool,
) -> v1::Joined {
    v1::Joined {
        device: Some(reply::device(t)),
        rejoined: found == Found::Rejoined,
        hardware_key_trusted,
        claimed: found == Found::Claimed,
    }
}

impl Hub {
    pub(crate) async fn join(
        &self,
        j: v1::JoinDevice,
        cause: &str,
    ) -> Result<v1::HubReply, CommandError> {
        let j = self.join_checked(&check(j)?, cause).await?;
        let version = j.device.as_ref().map_or(0, |d| d.version);
        Ok(reply::ok(Record::Joined(j), version))
    }

    async fn join_checked(&self, j: &Join, cause: &str) -> Result<v1::Joined, CommandError> {
        match self.join_once(j, cause).await {
            // Another join of the same machine created the device first.
            Err(e) if violates(&e, "devices_hardware_key") => self.join_once(j, cause).await,
            other => other,
        }
    }

    async fn join_once(&self, j: &Join, cause: &str) -> Result<v1::Joined, CommandError> {
        let now = Utc::now();
        let mut tx = self.deps.pool.begin().await?;
        if j.trusted {
            let mut keyed = devices::trusted_by_key(&mut tx, &[&j.hardware_key]).await?;
            if let Some((id, site)) = keyed.remove(&j.hardware_key) {
                if site != j.site {
                    return Err(DomainError::AlreadyExists(format!(
                        "the hardware key belongs to device {id} of site {site}"
                    ))
                    .into());
                }
                let mut work = Work::lock(&mut tx, std::slice::from_ref(&id)).await?;
                let s = work
                    .device(&id, cause, None)
                    .ok_or_else(|| DomainError::NotFound(format!("device {id}")))?;
                // Re-join in place: credentials of the earlier generation die.
                s.record.identity_generation += 1;
                adopt_with(&mut s.record, j)?;
                let (_, mut work) = work
                    .finish(&mut tx, now, &self.deadlines, &self.deps.subjects)
                    .await?;
                devices::set_gpu_counts(&mut tx, &[(&id, j.gpu_count)]).await?;
                self.commit_and_publish(tx, std::mem::take(&mut work.outbox))
                    .await?;
                let t = &work.devices[&id];
                return Ok(joined(&t.after, Found::Rejoined, true));
            }
        }

        if let Some((reply, outbox)) = self.claim_imported(&mut tx, j, now, cause).await? {
            self.commit_and_publish(tx, outbox).await?;
            return Ok(reply);
        }

        // Better Compute: the pool kind decides the role.
        let role = match &j.pool_id {
            None => Role::Unassigned,
            Some(p) => {
                let pool: Option<(String, String)> =
                    sqlx::query_as("SELECT kind, site_id FROM pools WHERE id = $1")
                        .bind(p)
                        .fetch_optional(&mut *tx)
                        .await?;
                match pool {
                    None => return Err(DomainError::NotFound(format!("pool {p}")).into()),
                    Some((_, site)) if site != j.site => {
                        return Err(invalid(format!("pool {p} is not in site {}", j.site)))
                    }
                    Some((kind, _)) => fleet_domain::inventory::PoolKind::parse(&kind)?.role(),
                }
            }
        };
        let id = format!("dev_{}", ulid::Ulid::new());
        let new = NewDevice {
            id: id.clone(),
            site_id: j.site.clone(),
            name: j.name.clone(),
            serial: j.serial.clone(),
            netbox_id: None,
            bmc_address: None,
            infrastructure_ref: None,
            pool_id: j.pool_id.clone(),
            owner_tenant_id: j.owner_tenant_id.clone(),
            rack: None,
            device_class: if j.gpu_count > 0 {
                DeviceClass::GpuCompute
            } else {
                DeviceClass::CpuBaremetal
            },
            role,
            trust: j.trust,
            inventory_status: InventoryStatus::Unknown,
            provision_state: ProvisionState::Adopting,
            labels: serde_json::json!({}),
            agent: Some(AgentFacts {
                hardware_key: j.hardware_key.clone(),
                hardware_key_trusted: j.trusted,
                gpu_count: j.gpu_count,
            }),
        };
        crate::commands::insert_device(&mut tx, &new, || {
            format!(
                "a device named {} already exists in site {} and the hardware key does not name it",
                j.name, j.site
            )
        })
        .await?;
        let mut work = Work::lock(&mut tx, std::slice::from_ref(&id)).await?;
        if let Some(t) = work.devices.get_mut(&id) {
            t.born = true;
        }
        if let Some(s) = work.device(&id, cause, None) {
            adopt_with(&mut s.record, j)?;
        }
        let work = self.commit_work(tx, work, now).await?;
        let t = &work.devices[&id];
        Ok(joined(&t.after, Found::Created, j.trusted))
    }

    /// The first trusted join of a device NetBox imported: the live device
    /// of the join's site and name that has no key yet, when its serial
    /// names the agent's machine (`hardware::claims`). The device keeps its
    /// identity generation (no credential was ever issued for it) and
    /// everything NetBox set; the agent's key and GPUs are recorded on it.
    async fn claim_imported(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        j: &Join,
        now: chrono::DateTime<Utc>,
        cause: &str,
    ) -> Result<Option<(v1::Joined, Vec<Pending>)>, CommandError> {
        if !j.trusted {
            return Ok(None);
        }
        let mut imported = devices::imported_by_name(tx, &[(&j.site, &j.name)]).await?;
        let Some((id, serial)) = imported.remove(&(j.site.clone(), j.name.clone())) else {
            return Ok(None);
        };
        if !fleet_domain::hardware::claims(serial.as_deref(), j.serial.as_deref()) {
            return Ok(None);
        }
        let mut work = Work::lock(tx, std::slice::from_ref(&id)).await?;
        let Some(s) = work.device(&id, cause, None) else {
            return Ok(None);
        };
        adopt_with(&mut s.record, j)?;
        let agent = AgentFacts {
            hardware_key: j.hardware_key.clone(),
            hardware_key_trusted: true,
            gpu_count: j.gpu_count,
        };
        if !devices::claim_many(tx, &[(&id, &agent)])
            .await?
            .contains(&id)
        {
            // Claimed by another key between the read and the lock.
            return Ok(None);
        }
        let (_, mut work) = work
            .finish(tx, now, &self.deadlines, &self.deps.subjects)
            .await?;
        let outbox = std::mem::take(&mut work.outbox);
        let t = &work.devices[&id];
        Ok(Some((joined(&t.after, Found::Claimed, true), outbox)))
    }
}

/// How a join of a batch found its device.
enum Plan {
    Rejoin(String),
    Claim(String),
}

/// The answer to one join of `join_devices`.
fn join_result(r: Result<v1::Joined, CommandError>) -> v1::JoinResult {
    match r {
        Ok(j) => v1::JoinResult {
            joined: Some(j),
            error: None,
        },
        Err(e) => v1::JoinResult {
            joined: None,
            error: Some(e.item_error()),
        },
    }
}

impl Hub {
    /// `join_devices`: many joins, answered one by one exactly as `join`
    /// answers each. The re-joins and claims of trusted keys (an agent
    /// coming back, a device NetBox imported) go in one transaction: one
    /// read of the keys, one of the imported names, one lock of every
    /// device (without waiting), one claim, one unit of work. What that
    /// transaction does not settle (a new device, a key twice in the batch,
    /// a device claimed by another key meanwhile, a device another
    /// transaction holds), and every join when the transaction fails as a
    /// whole, is joined on its own afterwards, in request order.
    pub(crate) async fn join_devices(
        &self,
        joins: Vec<v1::JoinDevice>,
        cause: &str,
    ) -> Result<v1::HubReply, CommandError> {
        if joins.is_empty() || joins.len() > 1000 {
            return Err(invalid("joins must hold 1 to 1000 joins"));
        }
        let mut results: Vec<Option<Result<v1::Joined, CommandError>>> =
            joins.iter().map(|_| None).collect();
        let mut batch: Vec<(usize, Join)> = vec![];
        let mut alone: Vec<(usize, Join)> = vec![];
        let mut keys = std::collections::HashSet::new();
        for (i, j) in joins.into_iter().enumerate() {
            match check(j) {
                Err(e) => results[i] = Some(Err(e)),
                Ok(j) if j.trusted && keys.insert(j.hardware_key.clone()) => batch.push((i, j)),
                Ok(j) => alone.push((i, j)),
            }
        }
        if !batch.is_empty() {
            match self.join_batch(&batch, cause).await {
                Ok(done) => {
                    for (i, r) in done {
                        results[i] = Some(r);
                    }
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    joins = batch.len(),
                    "a batch of joins failed as a whole; each is joined on its own"
                ),
            }
        }
        alone.extend(batch.into_iter().filter(|(i, _)| results[*i].is_none()));
        alone.sort_by_key(|(i, _)| *i);
        for (i, j) in alone {
            results[i] = Some(self.join_checked(&j, cause).await);
        }
        let results = results
            .into_iter()
            .map(|r| join_result(r.unwrap_or_else(|| Err(invalid("the join was not answered")))))
            .collect();
        Ok(reply::ok(Record::Joins(v1::JoinResults { results }), 0))
    }

    /// The re-joins and claims of `batch` (trusted keys, each once) in one
    /// transaction; the joins it leaves out are not in the answer.
    async fn join_batch(
        &self,
        batch: &[(usize, Join)],
        cause: &str,
    ) -> Result<Vec<(usize, Result<v1::Joined, CommandError>)>, CommandError> {
        let now = Utc::now();
        let mut tx = self.deps.pool.begin().await?;
        let keys: Vec<&str> = batch.iter().map(|(_, j)| j.hardware_key.as_str()).collect();
        let keyed = devices::trusted_by_key(&mut tx, &keys).await?;
        let unkeyed: Vec<(&str, &str)> = batch
            .iter()
            .filter(|(_, j)| !keyed.contains_key(&j.hardware_key))
            .map(|(_, j)| (j.site.as_str(), j.name.as_str()))
            .collect();
        let imported = devices::imported_by_name(&mut tx, &unkeyed).await?;

        let mut done = vec![];
        let mut plans: Vec<(usize, &Join, Plan)> = vec![];
        let mut planned = std::collections::HashSet::new();
        for (i, j) in batch {
            let plan = if let Some((id, site)) = keyed.get(&j.hardware_key) {
                if *site != j.site {
                    done.push((
                        *i,
                        Err(DomainError::AlreadyExists(format!(
                            "the hardware key belongs to device {id} of site {site}"
                        ))
                        .into()),
                    ));
                    continue;
                }
                Plan::Rejoin(id.clone())
            } else {
                match imported.get(&(j.site.clone(), j.name.clone())) {
                    Some((id, serial))
                        if fleet_domain::hardware::claims(
                            serial.as_deref(),
                            j.serial.as_deref(),
                        ) =>
                    {
                        Plan::Claim(id.clone())
                    }
                    // A new device: joined on its own.
                    _ => continue,
                }
            };
            let id = match &plan {
                Plan::Rejoin(id) | Plan::Claim(id) => id,
            };
            if planned.insert(id.clone()) {
                plans.push((*i, j, plan));
            }
        }

        if plans.is_empty() {
            // Nothing to re-join or claim: the transaction wrote nothing.
            return Ok(done);
        }
        let ids: Vec<String> = planned.into_iter().collect();
        // Without waiting: a device a lane's batch or another command holds
        // is joined on its own, after this transaction let go of the rest.
        let mut work = Work::lock_free(&mut tx, &ids).await?;
        let mut claims: Vec<(usize, String, AgentFacts)> = vec![];
        let mut rejoined: Vec<(usize, String, i32)> = vec![];
        for (i, j, plan) in plans {
            let (id, rejoin) = match plan {
                Plan::Rejoin(id) => (id, true),
                Plan::Claim(id) => (id, false),
            };
            if !work.devices.contains_key(&id) {
                // Held by another transaction: joined on its own.
                continue;
            }
            let Some(s) = work.device(&id, cause, None) else {
                if rejoin {
                    done.push((i, Err(DomainError::NotFound(format!("device {id}")).into())));
                }
                // A claim of a device deleted meanwhile: joined on its own.
                continue;
            };
            // Applied to a copy, kept only when it passes: a refused join
            // leaves its device exactly as it was.
            let mut r = s.record.clone();
            if rejoin {
                // Re-join in place: credentials of the earlier generation die.
                r.identity_generation += 1;
            }
            if let Err(e) = adopt_with(&mut r, j) {
                done.push((i, Err(e)));
                continue;
            }
            s.record = r;
            if rejoin {
                rejoined.push((i, id, j.gpu_count));
            } else {
                let agent = AgentFacts {
                    hardware_key: j.hardware_key.clone(),
                    hardware_key_trusted: true,
                    gpu_count: j.gpu_count,
                };
                claims.push((i, id, agent));
            }
        }

        let claimed = devices::claim_many(
            &mut tx,
            &claims
                .iter()
                .map(|(_, id, a)| (id.as_str(), a))
                .collect::<Vec<_>>(),
        )
        .await?;
        let mut found: Vec<(usize, String, Found)> = vec![];
        for (i, id, _) in claims {
            if claimed.contains(&id) {
                found.push((i, id, Found::Claimed));
            } else if let Some(t) = work.devices.get_mut(&id) {
                // Claimed by another key between the read and the lock:
                // untouched here, joined on its own.
                t.after = t.stored.clone();
            }
        }
        let (_, mut work) = work
            .finish(&mut tx, now, &self.deadlines, &self.deps.subjects)
            .await?;
        devices::set_gpu_counts(
            &mut tx,
            &rejoined
                .iter()
                .map(|(_, id, n)| (id.as_str(), *n))
                .collect::<Vec<_>>(),
        )
        .await?;
        self.commit_and_publish(tx, std::mem::take(&mut work.outbox))
            .await?;
        found.extend(
            rejoined
                .into_iter()
                .map(|(i, id, _)| (i, id, Found::Rejoined)),
        );
        for (i, id, how) in found {
            let t = &work.devices[&id];
            done.push((i, Ok(joined(&t.after, how, true))));
        }
        Ok(done)
    }
}
