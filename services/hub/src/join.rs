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
fn adopt_with(s: &mut fleet_domain::state::DeviceState, j: &Join) -> Result<(), CommandError> {
    if j.adopt && s.record.provision_state == ProvisionState::Adopting {
        fleet_domain::commands::adopt(&mut s.record)?;
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
) -> v1::HubReply {
    reply::ok(
        Record::Joined(v1::Joined {
            device: Some(reply::device(t)),
            rejoined: found == Found::Rejoined,
            hardware_key_trusted,
            claimed: found == Found::Claimed,
        }),
        t.record.version,
    )
}

impl Hub {
    pub(crate) async fn join(
        &self,
        j: v1::JoinDevice,
        cause: &str,
    ) -> Result<v1::HubReply, CommandError> {
        let j = check(j)?;
        match self.join_once(&j, cause).await {
            // Another join of the same machine created the device first.
            Err(e) if violates(&e, "devices_hardware_key") => self.join_once(&j, cause).await,
            other => other,
        }
    }

    async fn join_once(&self, j: &Join, cause: &str) -> Result<v1::HubReply, CommandError> {
        let now = Utc::now();
        let mut tx = self.deps.pool.begin().await?;
        if j.trusted {
            let existing: Option<(String, String)> = sqlx::query_as(
                "SELECT id, site_id FROM devices \
                 WHERE hardware_key = $1 AND hardware_key_trusted AND deleted_at IS NULL",
            )
            .bind(&j.hardware_key)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some((id, site)) = existing {
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
                adopt_with(s, j)?;
                let (_, mut work) = work
                    .finish(&mut tx, now, &self.ttls, &self.deps.subjects)
                    .await?;
                devices::set_gpu_count(&mut tx, &id, j.gpu_count).await?;
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
            adopt_with(s, j)?;
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
    ) -> Result<Option<(v1::HubReply, Vec<Pending>)>, CommandError> {
        if !j.trusted {
            return Ok(None);
        }
        let candidate: Option<(String, Option<String>)> = sqlx::query_as(
            "SELECT id, serial FROM devices \
             WHERE site_id = $1 AND name = $2 AND deleted_at IS NULL AND hardware_key IS NULL",
        )
        .bind(&j.site)
        .bind(&j.name)
        .fetch_optional(&mut **tx)
        .await?;
        let Some((id, serial)) = candidate else {
            return Ok(None);
        };
        if !fleet_domain::hardware::claims(serial.as_deref(), j.serial.as_deref()) {
            return Ok(None);
        }
        let mut work = Work::lock(tx, std::slice::from_ref(&id)).await?;
        let Some(s) = work.device(&id, cause, None) else {
            return Ok(None);
        };
        adopt_with(s, j)?;
        let agent = AgentFacts {
            hardware_key: j.hardware_key.clone(),
            hardware_key_trusted: true,
            gpu_count: j.gpu_count,
        };
        if devices::claim(tx, &id, &agent).await?.is_none() {
            // Claimed by another key between the read and the lock.
            return Ok(None);
        }
        let (_, mut work) = work
            .finish(tx, now, &self.ttls, &self.deps.subjects)
            .await?;
        let outbox = std::mem::take(&mut work.outbox);
        let t = &work.devices[&id];
        Ok(Some((joined(&t.after, Found::Claimed, true), outbox)))
    }
}
