//! Hub commands over core NATS request/reply (`<root>.hub.cmd.<verb>`).
//! Each runs in one transaction: lock, check `version`, apply the pure
//! command, re-derive, write the diff with its lifecycle and outbox rows.
//! The reply carries the stored record or a typed error.

use std::sync::Arc;

use crate::store::devices::{self, NewDevice};
use chrono::Utc;
use fleet_bus::{Limits, Refusal, Responder};
use fleet_domain::commands::{self as cmd, ProofOutcome};
use fleet_domain::state::DeviceState;
use fleet_domain::*;
use fleet_proto::ErrorCode;
use fleet_proto::{v1, Message};
use fleet_store::StoreError;
use v1::hub_command::Command as C;
use v1::hub_reply::Record;

use crate::decode;
use crate::reply;
use crate::work::Work;
use crate::Hub;

#[path = "apply_cmd.rs"]
mod apply_cmd;

/// A command failure: the domain's typed errors, or the store's.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Domain(#[from] DomainError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CommandError {
    fn from(e: sqlx::Error) -> Self {
        CommandError::Store(StoreError::from(e))
    }
}

const STORE_FAILED: &str = "the hub could not complete the command; retry later";

impl CommandError {
    fn code(&self) -> ErrorCode {
        match self {
            CommandError::Domain(d) => d.code(),
            CommandError::Store(_) => ErrorCode::Unavailable,
        }
    }

    /// What the caller reads: a store error's text stays in the hub's log.
    fn public(&self) -> String {
        match self {
            CommandError::Domain(d) => d.to_string(),
            CommandError::Store(_) => STORE_FAILED.to_string(),
        }
    }

    /// The refusal of one item of a batched command (a hold, a join); a
    /// store error's text goes to the hub's log only.
    pub(crate) fn item_error(&self) -> v1::HubError {
        if let CommandError::Store(e) = self {
            tracing::error!(error = %e, "an item of a batched command failed in the store");
        }
        v1::HubError {
            code: self.code() as i32,
            message: self.public(),
        }
    }

    fn refusal(self) -> Refusal {
        match self {
            CommandError::Domain(d) => Refusal::new(d.code(), d.to_string()),
            CommandError::Store(e) => Refusal::unavailable(STORE_FAILED, e),
        }
    }
}

/// The verb a command is addressed to: the client's, so the two never
/// disagree.
pub use fleet_hub_client::verb;

fn invalid(m: impl Into<String>) -> CommandError {
    CommandError::Domain(DomainError::InvalidArgument(m.into()))
}

/// A vocabulary field: empty means "the default" (`None`), anything else
/// must parse as sent.
fn vocab<T>(
    s: &str,
    parse: impl FnOnce(&str) -> Result<T, DomainError>,
) -> Result<Option<T>, DomainError> {
    (!s.is_empty()).then(|| parse(s)).transpose()
}

fn opt(s: &str) -> Option<String> {
    (!s.trim().is_empty()).then(|| s.trim().to_string())
}

impl Hub {
    /// How many commands (`<root>.hub.cmd.*`) the hub answers at once, and
    /// how long one may take. Commands share the pool with the lanes, the
    /// relay and the sweeper: a burst of commands (100,000 agents joining)
    /// must not take every connection and stall the observation batches.
    pub(crate) fn command_limits(&self) -> Limits {
        let reserved = self.config.lanes.max(1) + 3;
        let parallel = (self.common.database.max_connections as usize)
            .saturating_sub(reserved)
            .clamp(1, 32);
        Limits {
            concurrency: parallel,
            // The transaction's own timeout, with room for the lock wait.
            deadline: self.config.command_timeout * 2,
        }
    }

    /// Decodes and runs one command; never panics on input.
    pub async fn command_bytes(
        &self,
        subject_verb: &str,
        payload: &[u8],
    ) -> Result<v1::HubReply, Refusal> {
        // The metric label is a known verb or `invalid`, never the subject
        // token a client chose (labels stay a closed set).
        let mut label = "invalid";
        let result = match v1::HubCommand::decode(payload) {
            Err(e) => Err(invalid(format!("undecodable HubCommand: {e}"))),
            Ok(c) if fleet_proto::contains_nul(&c) => {
                Err(invalid("a string holds a NUL character"))
            }
            Ok(c) => match &c.command {
                None => Err(invalid("command is empty")),
                Some(inner) if verb(inner) != subject_verb => Err(invalid(format!(
                    "command {} sent to verb {subject_verb}",
                    verb(inner)
                ))),
                Some(inner) => {
                    label = verb(inner);
                    self.command(c).await
                }
            },
        };
        let v = label;
        match result {
            Ok(reply) => {
                self.metrics.command(v, "OK");
                self.relay_wake.notify_one();
                Ok(reply)
            }
            Err(e) => {
                self.metrics.command(v, e.code().as_str_name());
                Err(e.refusal())
            }
        }
    }

    pub async fn command(&self, c: v1::HubCommand) -> Result<v1::HubReply, CommandError> {
        let command = c.command.ok_or_else(|| invalid("command is empty"))?;
        let verb = match &command {
            // Each device of a batched join keeps the cause a join gives it.
            C::JoinDevices(_) => "join",
            other => verb(other),
        };
        let mut cause = if c.actor.is_empty() {
            format!("command:{verb}")
        } else {
            format!("command:{verb}:{}", c.actor)
        };
        // The audited operation keeps its reason with its lifecycle row.
        if let C::PromoteToManaged(p) = &command {
            cause = format!("{cause}: {}", p.reason.trim());
        }
        let now = Utc::now();
        match command {
            C::CreateDevice(d) => self.create_device(d, &cause).await,
            C::CreateDevices(d) => self.create_devices(d.devices, &cause).await,
            C::ImpairmentHolds(h) => self.impairment_holds(h, &cause, now).await,
            C::Join(j) => self.join(j, &cause).await,
            C::JoinDevices(j) => self.join_devices(j.joins, &cause).await,
            c @ (C::CreateSite(_)
            | C::UpdateSite(_)
            | C::CreateTenant(_)
            | C::UpdateTenant(_)
            | C::CreatePool(_)
            | C::UpdatePool(_)
            | C::DeleteInventory(_)) => self.inventory(c, &cause).await,
            C::ApplySnapshot(s) => self.apply_snapshot_command(s, c.expected_version).await,
            C::Triage(t) => {
                if t.device_ids.is_empty() {
                    return Err(invalid("device_ids is required"));
                }
                let mut tx = self.deps.pool.begin().await?;
                let mut work = Work::lock(&mut tx, &t.device_ids).await?;
                for id in &t.device_ids {
                    let s = work
                        .device(id, &cause, None)
                        .ok_or_else(|| DomainError::NotFound(format!("device {id}")))?;
                    cmd::triage(
                        &mut s.record,
                        t.in_triage,
                        opt(&t.triage_ticket_url).as_deref(),
                        opt(&t.parent_ticket_url).as_deref(),
                        now,
                    );
                }
                let work = self.commit_work(tx, work, now).await?;
                let devices = work
                    .devices
                    .values()
                    .map(|t| reply::device(&t.after))
                    .collect();
                Ok(reply::ok(Record::Devices(v1::DeviceChanges { devices }), 0))
            }
            C::WriteCondition(w) => {
                let (key, write) = decode::write(&w, now)?;
                let mut tx = self.deps.pool.begin().await?;
                let found =
                    devices::resolve(&mut tx, key.kind, &[(key.site.clone(), key.key.clone())])
                        .await?;
                let id = found.into_iter().next().map(|(_, id)| id).ok_or_else(|| {
                    DomainError::NotFound(format!("device {} {}", key.kind, key.key))
                })?;
                let mut work = Work::lock(&mut tx, std::slice::from_ref(&id)).await?;
                let s = work
                    .device(&id, &format!("source:{}", write.source), None)
                    .ok_or_else(|| DomainError::NotFound(format!("device {id}")))?;
                if c.expected_version > 0 {
                    cmd::check_version(&s.record, c.expected_version)?;
                }
                s.apply_condition_write(
                    write.source,
                    &write.input,
                    write.observed_at,
                    write.hub_ordered,
                    now,
                )?;
                let work = self.commit_work(tx, work, now).await?;
                let t = &work.devices[&id];
                // The stored row: different from what was sent means stale-rejected.
                let row = &t.after.conditions[&write.input.condition_type];
                let stale = t.after.is_stale(row, now, &self.deadlines.ttls);
                Ok(reply::ok(
                    Record::Condition(reply::condition(&id, row, stale)),
                    t.after.record.version,
                ))
            }
            other => {
                let id = device_id(&other).to_string();
                if id.is_empty() {
                    return Err(invalid("device_id is required"));
                }
                let needs_version = !matches!(
                    other,
                    C::EnrollmentProof(_) | C::ImpairmentHold(_) | C::Delegate(_)
                );
                if needs_version && c.expected_version <= 0 {
                    return Err(invalid("version is required: pass the version you read"));
                }
                let mut tx = self.deps.pool.begin().await?;
                let mut work = Work::lock(&mut tx, std::slice::from_ref(&id)).await?;
                let s = work
                    .device(&id, &cause, None)
                    .ok_or_else(|| DomainError::NotFound(format!("device {id}")))?;
                if c.expected_version > 0 {
                    cmd::check_version(&s.record, c.expected_version)?;
                }
                apply_device_command(s, other, now)?;
                let work = self.commit_work(tx, work, now).await?;
                Ok(reply::device_ok(&work.devices[&id].after))
            }
        }
    }

    async fn create_device(
        &self,
        d: v1::CreateDevice,
        cause: &str,
    ) -> Result<v1::HubReply, CommandError> {
        let (site, name) = (d.site.trim().to_string(), d.name.trim().to_string());
        let draft = draft(d)?;
        let mut tx = self.deps.pool.begin().await?;
        let kinds = pool_kinds(&mut tx, draft.pool_id.iter()).await?;
        let new = draft.resolve(&kinds)?;
        let id = new.id.clone();
        insert_device(&mut tx, &new, || {
            format!("a device named {name} (or with that netbox_id) already exists in site {site}")
        })
        .await?;
        let mut work = Work::lock(&mut tx, std::slice::from_ref(&id)).await?;
        if let Some(t) = work.devices.get_mut(&id) {
            t.born = true;
            t.cause = cause.to_string();
        }
        let now = Utc::now();
        let work = self.commit_work(tx, work, now).await?;
        Ok(reply::device_ok(&work.devices[&id].after))
    }
}

impl Hub {
    /// One event's hold on many devices in one transaction: each device is
    /// applied or refused on its own (unknown, or held by another event),
    /// and only the applied ones change.
    async fn impairment_holds(
        &self,
        h: v1::ImpairmentHolds,
        cause: &str,
        now: chrono::DateTime<Utc>,
    ) -> Result<v1::HubReply, CommandError> {
        if h.event_id.trim().is_empty() {
            return Err(invalid("event_id is required"));
        }
        if h.device_ids.is_empty() || h.device_ids.len() > 1000 {
            return Err(invalid("device_ids must name 1 to 1000 devices"));
        }
        let mut ids: Vec<String> = h.device_ids.clone();
        ids.sort();
        ids.dedup();
        let mut tx = self.deps.pool.begin().await?;
        let mut work = Work::lock(&mut tx, &ids).await?;
        let refuse = |e: DomainError| Some(CommandError::Domain(e).item_error());
        let results: Vec<v1::HoldResult> = h
            .device_ids
            .iter()
            .map(|id| {
                let error = match work.device(id, cause, None) {
                    None => refuse(DomainError::NotFound(format!("device {id}"))),
                    Some(s) => {
                        // Applied to a copy, kept only when it passes: a
                        // refused device is left exactly as it was.
                        let mut r = s.record.clone();
                        match cmd::impairment_hold(&mut r, &h.event_id, h.set) {
                            Ok(()) => {
                                s.record = r;
                                None
                            }
                            Err(e) => refuse(e),
                        }
                    }
                };
                v1::HoldResult {
                    device_id: id.clone(),
                    error,
                }
            })
            .collect();
        self.commit_work(tx, work, now).await?;
        Ok(reply::ok(Record::Holds(v1::HoldResults { results }), 0))
    }
}

/// Inserts one new device; a taken name (or key) is `ALREADY_EXISTS` as
/// `taken` words it, an unknown site, pool or tenant `NOT_FOUND`.
pub(crate) async fn insert_device(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    new: &NewDevice,
    taken: impl FnOnce() -> String,
) -> Result<(), CommandError> {
    match devices::insert_device(tx, new).await {
        Ok(Some(())) => Ok(()),
        Ok(None) => Err(DomainError::NotFound(format!("site {}", new.site_id)).into()),
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23505") => {
            Err(DomainError::AlreadyExists(taken()).into())
        }
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23503") => {
            Err(DomainError::NotFound(format!("pool or tenant of device {}", new.name)).into())
        }
        Err(e) => Err(e.into()),
    }
}

/// A create-device request checked for everything but the database.
struct Draft {
    new: NewDevice,
    explicit_role: Option<Role>,
    pool_id: Option<String>,
}

fn draft(d: v1::CreateDevice) -> Result<Draft, CommandError> {
    let site = opt(&d.site).ok_or_else(|| invalid("site is required"))?;
    let name = opt(&d.name).ok_or_else(|| invalid("name is required"))?;
    let device_class =
        vocab(&d.device_class, DeviceClass::parse)?.unwrap_or(DeviceClass::GpuCompute);
    let trust = vocab(&d.trust, Trust::parse)?.unwrap_or(Trust::Platform);
    let inventory_status =
        vocab(&d.inventory_status, InventoryStatus::parse)?.unwrap_or(InventoryStatus::Unknown);
    let provision_state =
        vocab(&d.provision_state, ProvisionState::parse)?.unwrap_or(ProvisionState::Adopting);
    let explicit_role = vocab(&d.role, Role::parse)?;
    let pool_id = opt(&d.pool_id);
    use fleet_domain::limits::{check_count, check_len, MAX_ID, MAX_ITEMS, MAX_KEY};
    for (field, value, max) in [
        ("site", &d.site, MAX_ID),
        ("name", &d.name, MAX_KEY),
        ("serial", &d.serial, MAX_KEY),
        ("bmc_address", &d.bmc_address, MAX_KEY),
        ("infrastructure_ref", &d.infrastructure_ref, MAX_KEY),
        ("pool_id", &d.pool_id, MAX_ID),
        ("owner_tenant_id", &d.owner_tenant_id, MAX_ID),
        ("rack", &d.rack, MAX_KEY),
    ] {
        check_len(field, value, max)?;
    }
    check_count("labels", d.labels.len(), MAX_ITEMS)?;
    for (k, v) in &d.labels {
        check_len("a label key", k, MAX_KEY)?;
        check_len("a label value", v, MAX_KEY)?;
    }
    Ok(Draft {
        new: NewDevice {
            id: format!("dev_{}", ulid::Ulid::new()),
            site_id: site,
            name,
            serial: opt(&d.serial),
            netbox_id: (d.netbox_id > 0).then_some(d.netbox_id),
            bmc_address: opt(&d.bmc_address),
            infrastructure_ref: opt(&d.infrastructure_ref),
            pool_id: pool_id.clone(),
            owner_tenant_id: opt(&d.owner_tenant_id),
            rack: opt(&d.rack),
            device_class,
            role: explicit_role.unwrap_or(Role::Unassigned),
            trust,
            inventory_status,
            provision_state,
            labels: serde_json::to_value(&d.labels).unwrap_or_default(),
            agent: None,
        },
        explicit_role,
        pool_id,
    })
}

impl Draft {
    /// Better Compute: the pool kind decides the role unless one is given.
    fn resolve(
        mut self,
        kinds: &std::collections::HashMap<String, String>,
    ) -> Result<NewDevice, CommandError> {
        if let (None, Some(p)) = (&self.explicit_role, &self.pool_id) {
            self.new.role = match kinds.get(p).map(String::as_str) {
                None => return Err(DomainError::NotFound(format!("pool {p}")).into()),
                Some(kind) => fleet_domain::inventory::PoolKind::parse(kind)?.role(),
            };
        }
        Ok(self.new)
    }
}

async fn pool_kinds(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    ids: impl Iterator<Item = &String>,
) -> Result<std::collections::HashMap<String, String>, sqlx::Error> {
    let ids: Vec<&String> = ids.collect();
    if ids.is_empty() {
        return Ok(Default::default());
    }
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT id, kind FROM pools WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(&mut **tx)
            .await?;
    Ok(rows.into_iter().collect())
}

/// The most devices one `create_devices` takes.
pub const CREATE_DEVICES_MAX: usize = 1000;

impl Hub {
    /// `create_devices`: every item checked on its own, the valid ones
    /// inserted with one statement (`ON CONFLICT DO NOTHING`: an existing
    /// device is `CONFLICT`), born with their lifecycle and outbox rows, all
    /// in one transaction.
    async fn create_devices(
        &self,
        list: Vec<v1::CreateDevice>,
        cause: &str,
    ) -> Result<v1::HubReply, CommandError> {
        if list.is_empty() {
            return Err(invalid("devices is required"));
        }
        if list.len() > CREATE_DEVICES_MAX {
            return Err(invalid(format!(
                "at most {CREATE_DEVICES_MAX} devices per create_devices, got {}",
                list.len()
            )));
        }
        let mut results: Vec<v1::CreateResult> = list
            .iter()
            .map(|d| v1::CreateResult {
                site: d.site.trim().to_string(),
                name: d.name.trim().to_string(),
                ..Default::default()
            })
            .collect();
        let fail = |r: &mut v1::CreateResult, e: CommandError| {
            if let CommandError::Store(s) = &e {
                tracing::warn!(error = %s, "create_devices item failed in the store");
            }
            r.error = Some(v1::HubError {
                code: e.code() as i32,
                message: e.public(),
            });
        };
        let mut drafts = Vec::new();
        for (i, d) in list.into_iter().enumerate() {
            match draft(d) {
                Ok(x) => drafts.push((i, x)),
                Err(e) => fail(&mut results[i], e),
            }
        }
        let mut tx = self.deps.pool.begin().await?;
        let kinds = pool_kinds(
            &mut tx,
            drafts.iter().filter_map(|(_, d)| d.pool_id.as_ref()),
        )
        .await?;
        let mut news = Vec::new();
        for (i, d) in drafts {
            match d.resolve(&kinds) {
                Ok(n) => news.push((i, n)),
                Err(e) => fail(&mut results[i], e),
            }
        }
        let refs = devices::missing_references(&mut tx, news.iter().map(|(_, n)| n)).await?;
        news.retain(|(i, n)| match refs.get(&n.id) {
            Some(what) => {
                fail(&mut results[*i], DomainError::NotFound(what.clone()).into());
                false
            }
            None => true,
        });
        let only: Vec<NewDevice> = news.iter().map(|(_, n)| n.clone()).collect();
        let inserted = devices::insert_devices(&mut tx, &only).await?;
        let ids: Vec<String> = inserted.iter().cloned().collect();
        let mut work = Work::lock(&mut tx, &ids).await?;
        for t in work.devices.values_mut() {
            t.born = true;
            t.cause = cause.to_string();
        }
        let now = Utc::now();
        self.commit_work(tx, work, now).await?;
        for (i, n) in &news {
            if inserted.contains(&n.id) {
                results[*i].id = n.id.clone();
            } else {
                fail(
                    &mut results[*i],
                    DomainError::AlreadyExists(format!(
                        "a device named {} (or with that netbox_id) already exists in site {}",
                        n.name, n.site_id
                    ))
                    .into(),
                );
            }
        }
        Ok(reply::ok(Record::Created(v1::CreateResults { results }), 0))
    }
}

fn device_id(c: &C) -> &str {
    match c {
        C::Cordon(x) => &x.device_id,
        C::Uncordon(x) => &x.device_id,
        C::Drain(x) => &x.device_id,
        C::Taint(x) => &x.device_id,
        C::Provision(x) => &x.device_id,
        C::Adopt(x) => &x.device_id,
        C::RevokeIdentity(x) => &x.device_id,
        C::DeleteDevice(x) => &x.device_id,
        C::EnrollmentProof(x) => &x.device_id,
        C::Delegate(x) => &x.device_id,
        C::PromoteToManaged(x) => &x.device_id,
        C::ImpairmentHold(x) => &x.device_id,
        C::SetMaintenance(x) => &x.device_id,
        C::Join(_) | C::JoinDevices(_) => "",
        C::CreateDevice(_)
        | C::CreateDevices(_)
        | C::ImpairmentHolds(_)
        | C::CreateSite(_)
        | C::UpdateSite(_)
        | C::CreateTenant(_)
        | C::UpdateTenant(_)
        | C::CreatePool(_)
        | C::UpdatePool(_)
        | C::DeleteInventory(_)
        | C::Triage(_)
        | C::WriteCondition(_)
        | C::ApplySnapshot(_) => "",
    }
}

fn apply_device_command(
    s: &mut DeviceState,
    c: C,
    now: chrono::DateTime<Utc>,
) -> Result<(), DomainError> {
    if let C::Delegate(x) = &c {
        let d = fleet_domain::state::Delegation {
            pinned_infrastructure_ref: &x.pinned_infrastructure_ref,
            netbox_status: &x.netbox_status,
        };
        let notes = s.delegate(d, now)?;
        if notes.handover_breach {
            tracing::error!(device_id = %s.record.id, job_id = %x.job_id, "HandoverBreach: Metal hand-back with no verified front-end VRF flip on record");
        }
        return Ok(());
    }
    let r = &mut s.record;
    match c {
        C::Cordon(x) => cmd::cordon(r, &x.reason),
        C::Uncordon(_) => {
            cmd::uncordon(r);
            Ok(())
        }
        C::Drain(x) => cmd::drain(r, &x.reason),
        C::Taint(x) => cmd::taint(r, &x.key, x.remove),
        C::Provision(x) => cmd::provision_move(r, ProvisionState::parse(&x.to)?),
        C::Adopt(_) => cmd::adopt(r),
        C::RevokeIdentity(_) => {
            cmd::revoke_identity(r);
            Ok(())
        }
        C::DeleteDevice(_) => {
            cmd::delete(r);
            Ok(())
        }
        C::SetMaintenance(x) => cmd::set_maintenance(r, x.maintenance, &x.reason),
        C::PromoteToManaged(x) => cmd::promote_to_managed(r, &x.reason),
        C::EnrollmentProof(x) => {
            let outcome = match x.outcome.as_str() {
                "enrolled" => ProofOutcome::Enrolled {
                    result_ref: x.result_ref,
                    source: x.proof_source,
                },
                "failed" => ProofOutcome::Failed {
                    pinned_infrastructure_ref: opt(&x.pinned_infrastructure_ref),
                },
                other => {
                    return Err(DomainError::InvalidArgument(format!(
                        "unknown enrollment proof outcome {other:?}"
                    )))
                }
            };
            cmd::enrollment_proof(r, outcome, now).map(|_| ())
        }
        C::ImpairmentHold(x) => cmd::impairment_hold(r, &x.event_id, x.set),
        // Join, the create and inventory commands, triage, condition
        // writes and snapshots carry no single device.
        _ => Err(DomainError::InvalidArgument(
            "not a single-device command".into(),
        )),
    }
}

/// `<root>.hub.cmd.<verb>`: one command, its reply the stored record.
impl Responder for Hub {
    const SERVICE: &'static str = "hub";

    async fn respond(
        self: Arc<Self>,
        _route: &'static str,
        subject: String,
        payload: bytes::Bytes,
    ) -> Result<bytes::Bytes, Refusal> {
        let verb = fleet_bus::subjects::command_verb(&subject);
        let reply = self.command_bytes(verb, &payload).await?;
        Ok(reply.encode_to_vec().into())
    }

    fn refused(&self, _route: &'static str, code: ErrorCode, message: &str) -> bytes::Bytes {
        v1::HubReply {
            error: Some(v1::HubError {
                code: code as i32,
                message: message.to_string(),
            }),
            record: None,
            version: 0,
        }
        .encode_to_vec()
        .into()
    }
}
