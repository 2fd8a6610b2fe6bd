//! A device as the hub holds it inside one transaction, and the pure
//! operations on it: applying a snapshot, a single condition write, a
//! connectivity observation, and re-deriving every derived axis. The hub
//! loads a `DeviceState`, keeps a copy, runs these, and writes the diff.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use sha2::{Digest, Sha256};

use crate::catalogue::{observation_types_of, ConditionType};
use crate::derivation::{self, reasons, Effective};
use crate::error::DomainError;
use crate::predicates::{self, SchedulingFacts};
use crate::vocab::*;

/// "One more than 5 minutes in the future is rejected".
pub const FUTURE_LIMIT: Duration = Duration::minutes(5);

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConditionRow {
    #[serde(rename = "type")]
    pub condition_type: ConditionType,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
    pub source: Source,
    pub condition_of: ConditionOf,
    pub durable: bool,
    pub observed_at: DateTime<Utc>,
    pub received_at: DateTime<Utc>,
    pub decisive: bool,
    pub last_transition_at: DateTime<Utc>,
}

impl ConditionRow {
    fn same_value(&self, status: ConditionStatus, reason: &str, message: &str) -> bool {
        self.status == status && self.reason == reason && self.message == message
    }
}

/// The last snapshot applied from one source for one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freshness {
    pub observed_at: DateTime<Utc>,
    pub digest: Vec<u8>,
    /// The device `version` right after this snapshot was applied and the
    /// device re-derived, when that left every row the source owns holding
    /// the snapshot's values; `UNSETTLED` otherwise, and again as soon as
    /// anything but the source's own snapshots changes one of those rows or
    /// a mirrored column. A version bump that moves neither carries it
    /// along (see [`DeviceState::finish`]). While it equals the device's
    /// version, a later snapshot with the same digest can change nothing
    /// but this row's `observed_at` (see [`confirm`]).
    pub settled_version: i64,
}

/// `Freshness::settled_version` of a row a later snapshot cannot confirm
/// without loading the device.
pub const UNSETTLED: i64 = 0;
/// Set by `apply_snapshot`, turned into the device's version by `finish`.
const SETTLING: i64 = -1;

/// Whether `mirror` is the kind `source`'s snapshots carry (or none): only
/// then does [`mirrored_columns_equal`] cover what applying it writes, and
/// only then may the snapshot settle.
fn mirror_is_the_sources(source: Source, mirror: &Mirror) -> bool {
    matches!(
        (source, mirror),
        (_, Mirror::None)
            | (Source::Openstack, Mirror::Ironic { .. })
            | (Source::Slurm, Mirror::Slurm { .. })
            | (Source::Netbox, Mirror::Netbox { .. })
            | (Source::HealthStatus, Mirror::Health { .. })
            | (Source::Borneo, Mirror::Custody { .. })
    )
}

/// Whether the device columns `source`'s mirror writes (and the deletion
/// mark) are the same in both records. Per source, so one source's first
/// mirror does not unsettle the others.
fn mirrored_columns_equal(source: Source, a: &DeviceRecord, b: &DeviceRecord) -> bool {
    let (x, y) = (&a.mirrors, &b.mirrors);
    a.deleted == b.deleted
        && match source {
            Source::Openstack => {
                x.ironic_provision_state == y.ironic_provision_state
                    && x.ironic_maintenance == y.ironic_maintenance
                    && x.ironic_maintenance_reason == y.ironic_maintenance_reason
                    && x.ironic_instance_uuid == y.ironic_instance_uuid
                    && x.ironic_lessee == y.ironic_lessee
                    && a.power == b.power
            }
            Source::Slurm => x.slurm_states == y.slurm_states,
            Source::Netbox => {
                a.inventory_status == b.inventory_status && x.netbox_tags == y.netbox_tags
            }
            Source::HealthStatus => x.chassis_health == y.chassis_health,
            Source::Borneo => {
                a.custody == b.custody && a.custody_credential_ref == b.custody_credential_ref
            }
            Source::FrontendFabric
            | Source::BackendFabric
            | Source::NvlinkFabric
            | Source::Gateway => true,
        }
}

/// Whether the rows `source` owns hold the same values in both.
fn owned_rows_equal(
    source: Source,
    a: &BTreeMap<ConditionType, ConditionRow>,
    b: &BTreeMap<ConditionType, ConditionRow>,
) -> bool {
    observation_types_of(source).all(|t| match (a.get(&t), b.get(&t)) {
        (None, None) => true,
        (Some(x), Some(y)) => x.same_value(y.status, &y.reason, &y.message),
        _ => false,
    })
}

/// What a snapshot does to a device, decided from its freshness row and the
/// device's version alone, without loading the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// Older than the stored snapshot: not applied.
    Stale,
    /// Same time and content as the stored snapshot: a no-op.
    Duplicate,
    /// Same content, later: only the freshness row's `observed_at` moves.
    Refresh,
    /// Anything else: load the device and apply it in full.
    Load,
}

/// The hub's fast path for a freshness-only resync (`quality.md`: "a
/// freshness-only resync writes O(1) rows per snapshot"). `Refresh` is
/// returned only when applying the snapshot in full and re-deriving would
/// change nothing but `observed_at`: same digest, settled at the device's
/// current version, the source not silent now (so refreshing it cannot
/// change what derivation reads), and not Borneo (custody entries act on
/// the device's status, not only on its rows). Stale and duplicate are
/// decided as `apply_snapshot` decides them; the re-derivation the full path
/// would do at the same time is left to the sweeper.
pub fn confirm(
    stored: Option<&Freshness>,
    version: i64,
    source: Source,
    observed_at: DateTime<Utc>,
    digest: &[u8],
    now: DateTime<Utc>,
    ttls: &Ttls,
) -> Confirmation {
    let Some(f) = stored else {
        return Confirmation::Load;
    };
    match (observed_at, digest).cmp(&(f.observed_at, f.digest.as_slice())) {
        std::cmp::Ordering::Less => Confirmation::Stale,
        std::cmp::Ordering::Equal => Confirmation::Duplicate,
        std::cmp::Ordering::Greater => {
            if source != Source::Borneo
                && f.digest == digest
                && f.settled_version == version
                && version > UNSETTLED
                && f.observed_at + ttls.of(source) >= now
            {
                Confirmation::Refresh
            } else {
                Confirmation::Load
            }
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Mirrors {
    pub ironic_provision_state: Option<String>,
    pub ironic_maintenance: Option<bool>,
    pub ironic_maintenance_reason: Option<String>,
    pub ironic_instance_uuid: Option<String>,
    pub ironic_lessee: Option<String>,
    pub slurm_states: Vec<String>,
    pub netbox_tags: Vec<String>,
    pub chassis_health: Option<ChassisHealth>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Session {
    pub epoch: i64,
    pub gateway_id: Option<String>,
    pub connected_at: Option<DateTime<Utc>>,
    pub disconnected_at: Option<DateTime<Utc>>,
    pub last_seen: Option<DateTime<Utc>>,
}

/// The columns of one `devices` row the hub reads and writes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceRecord {
    pub id: String,
    pub site_id: String,
    pub name: String,
    pub version: i64,
    pub inventory_only: bool,
    pub role: Role,
    pub trust: Trust,
    pub pool_id: Option<String>,
    pub owner_tenant_id: Option<String>,
    /// Read from the pool (not a device column): the schedulable rule 2.
    #[serde(skip)]
    pub pool_owner_tenant_id: Option<String>,
    pub infrastructure_ref: Option<String>,
    pub provision_state: ProvisionState,
    pub failed_from: Option<ProvisionState>,
    pub maintenance: bool,
    pub maintenance_reason: Option<String>,
    pub cordoned: bool,
    pub cordon_reason: Option<String>,
    pub draining: bool,
    pub power: Power,
    pub connectivity: Connectivity,
    pub inventory_status: InventoryStatus,
    pub operational_status: OperationalStatus,
    pub health_status: HealthStatus,
    pub capacity_bucket: CapacityBucket,
    pub in_triage: bool,
    pub triage_ticket_url: Option<String>,
    pub parent_ticket_url: Option<String>,
    pub entered_triage_at: Option<DateTime<Utc>>,
    pub custody: Option<String>,
    pub custody_credential_ref: Option<String>,
    pub impairment_hold: Option<String>,
    pub taints: Vec<String>,
    pub no_schedule_reasons: Vec<String>,
    pub observed_generation: i64,
    pub identity_generation: i64,
    pub enrollment_validated_ref: Option<String>,
    pub enrollment_proof_source: Option<String>,
    pub enrollment_proof_at: Option<DateTime<Utc>>,
    pub entered_service_at: Option<DateTime<Utc>>,
    pub failure_state: Option<String>,
    pub failed_at: Option<DateTime<Utc>>,
    pub mirrors: Mirrors,
    pub session: Session,
    pub deleted: bool,
}

impl DeviceRecord {
    /// A new device row with every axis at its default.
    pub fn new(id: String, site_id: String, name: String) -> Self {
        DeviceRecord {
            id,
            site_id,
            name,
            version: 1,
            inventory_only: false,
            role: Role::Unassigned,
            trust: Trust::Platform,
            pool_id: None,
            owner_tenant_id: None,
            pool_owner_tenant_id: None,
            infrastructure_ref: None,
            provision_state: ProvisionState::Adopting,
            failed_from: None,
            maintenance: false,
            maintenance_reason: None,
            cordoned: false,
            cordon_reason: None,
            draining: false,
            power: Power::Unknown,
            connectivity: Connectivity::Disconnected,
            inventory_status: InventoryStatus::Unknown,
            operational_status: OperationalStatus::Unknown,
            health_status: HealthStatus::Unknown,
            capacity_bucket: CapacityBucket::Excluded,
            in_triage: false,
            triage_ticket_url: None,
            parent_ticket_url: None,
            entered_triage_at: None,
            custody: None,
            custody_credential_ref: None,
            impairment_hold: None,
            taints: vec![],
            no_schedule_reasons: vec![],
            observed_generation: 0,
            identity_generation: 1,
            enrollment_validated_ref: None,
            enrollment_proof_source: None,
            enrollment_proof_at: None,
            entered_service_at: None,
            failure_state: None,
            failed_at: None,
            mirrors: Mirrors::default(),
            session: Session::default(),
            deleted: false,
        }
    }

    /// The value of an axis as its event and lifecycle row carry it.
    pub fn axis_value(&self, axis: Axis) -> String {
        match axis {
            Axis::Inventory => self.inventory_status.to_string(),
            Axis::Operational => self.operational_status.to_string(),
            Axis::Health => self.health_status.to_string(),
            Axis::Provision => self.provision_state.to_string(),
            Axis::Maintenance => self.maintenance.to_string(),
            Axis::Cordoned => self.cordoned.to_string(),
            Axis::Power => self.power.to_string(),
            Axis::Connectivity => self.connectivity.to_string(),
            Axis::Schedulable => self.capacity_bucket.to_string(),
            Axis::Triage => self.in_triage.to_string(),
            Axis::Custody => self.custody.clone().unwrap_or_default(),
            Axis::Enrollment => self.enrollment_validated_ref.clone().unwrap_or_default(),
            Axis::Conditions => String::new(),
        }
    }

    /// Whether two records differ in anything but the heartbeat clock: a
    /// heartbeat alone does not bump `version`.
    pub fn differs_beyond_heartbeat(&self, other: &DeviceRecord) -> bool {
        let mut a = self.clone();
        a.session.last_seen = other.session.last_seen;
        a != *other
    }
}

/// The axes that get lifecycle rows and status events, in a fixed order.
pub const TRACKED_AXES: &[Axis] = &[
    Axis::Inventory,
    Axis::Operational,
    Axis::Health,
    Axis::Provision,
    Axis::Maintenance,
    Axis::Cordoned,
    Axis::Power,
    Axis::Connectivity,
    Axis::Schedulable,
    Axis::Triage,
    Axis::Custody,
    Axis::Enrollment,
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AxisChange {
    pub axis: Axis,
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionChange {
    pub condition_type: ConditionType,
    pub from: Option<ConditionStatus>,
    pub to: ConditionStatus,
}

/// Freshness TTL per source: "default 3 x its source's resync interval".
#[derive(Debug, Clone)]
pub struct Ttls {
    pub default: Duration,
    pub per_source: BTreeMap<Source, Duration>,
}

impl Ttls {
    pub fn uniform(ttl: Duration) -> Self {
        Ttls {
            default: ttl,
            per_source: BTreeMap::new(),
        }
    }
    pub fn of(&self, source: Source) -> Duration {
        self.per_source
            .get(&source)
            .copied()
            .unwrap_or(self.default)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceState {
    pub record: DeviceRecord,
    pub conditions: BTreeMap<ConditionType, ConditionRow>,
    pub freshness: BTreeMap<Source, Freshness>,
}

// ---------------------------------------------------------------- inputs

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionInput {
    pub condition_type: ConditionType,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlurmMode {
    Observed,
    /// SchedulerUnreachable: mirrors left at their last-known values.
    Keep,
    /// NoLongerObserved: mirrors cleared.
    Clear,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mirror {
    None,
    Ironic {
        provision_state: String,
        maintenance: bool,
        maintenance_reason: Option<String>,
        instance_uuid: Option<String>,
        lessee: Option<String>,
        power: Power,
    },
    Slurm {
        states: Vec<String>,
        mode: SlurmMode,
    },
    Netbox {
        status: Option<InventoryStatus>,
        tags: Vec<String>,
    },
    Health {
        chassis: Option<ChassisHealth>,
    },
    Custody {
        state: String,
        credential_ref: Option<String>,
    },
}

/// A validated `ConditionSnapshot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub source: Source,
    pub observed_at: DateTime<Utc>,
    pub conditions: Vec<ConditionInput>,
    pub mirror: Mirror,
}

impl Snapshot {
    /// Every check that rejects the whole snapshot: unknown types are
    /// rejected by the caller's `ConditionType::lookup`; here ownership,
    /// durability, duplicates, mirror kind and the future limit.
    pub fn validate(self, now: DateTime<Utc>) -> Result<Self, DomainError> {
        check_observed_at(self.observed_at, now)?;
        let mut seen = Vec::with_capacity(self.conditions.len());
        for c in &self.conditions {
            c.condition_type.check_owner(self.source)?;
            if c.condition_type.is_durable() {
                return Err(DomainError::InvalidArgument(format!(
                    "durable type {} is never written by a snapshot",
                    c.condition_type
                )));
            }
            if seen.contains(&c.condition_type) {
                return Err(DomainError::InvalidArgument(format!(
                    "type {} appears twice",
                    c.condition_type
                )));
            }
            seen.push(c.condition_type);
        }
        let mirror_ok = match &self.mirror {
            Mirror::None => true,
            Mirror::Ironic { .. } => self.source == Source::Openstack,
            Mirror::Slurm { .. } => self.source == Source::Slurm,
            Mirror::Netbox { .. } => self.source == Source::Netbox,
            Mirror::Health { .. } => self.source == Source::HealthStatus,
            Mirror::Custody { .. } => self.source == Source::Borneo,
        };
        if !mirror_ok {
            return Err(DomainError::ForbiddenSource {
                source_name: self.source.to_string(),
                condition_type: "mirror".into(),
            });
        }
        Ok(self)
    }

    /// A digest of the content, so equal time and equal content is a
    /// duplicate, and equal time with different content is ordered the same
    /// way on every delivery order.
    pub fn digest(&self) -> Vec<u8> {
        let mut conds: Vec<_> = self.conditions.iter().collect();
        conds.sort_by_key(|c| c.condition_type);
        let mut h = Sha256::new();
        h.update(self.source.as_str());
        for c in conds {
            h.update(format!(
                "\n{}|{}|{}|{}",
                c.condition_type, c.status, c.reason, c.message
            ));
        }
        h.update(format!("\n{:?}", self.mirror));
        h.finalize().to_vec()
    }
}

/// An observation time the hub accepts: not more than the future limit
/// ahead of its clock, and not before 2000 (a time PostgreSQL cannot store,
/// or a sender's broken clock, is bad input, refused before any query).
pub fn check_observed_at(
    observed_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<(), DomainError> {
    if observed_at > now + FUTURE_LIMIT {
        return Err(DomainError::FutureObservation {
            observed_at: observed_at.to_rfc3339(),
        });
    }
    if observed_at < earliest_observation() {
        return Err(DomainError::InvalidArgument(format!(
            "observed_at {} is before 2000-01-01",
            observed_at.to_rfc3339()
        )));
    }
    Ok(())
}

fn earliest_observation() -> DateTime<Utc> {
    DateTime::from_timestamp(946_684_800, 0).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Applied: conditions or mirrors may have changed.
    Applied,
    /// Older than what is stored: not applied.
    Stale,
    /// Same time and content as what is stored: a no-op.
    Duplicate,
}

/// What applying a snapshot did besides conditions, for the caller to log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notes {
    /// A custody entry found no verified front-end flip: logged at error.
    pub handover_breach: bool,
}

/// The heartbeat fast path: what a connectivity observation does to a
/// device, decided from its session, `connectivity` and
/// `observed_generation` alone. `Refresh` (only `session.last_seen` moves)
/// is returned for a heartbeat of the live epoch of a connected device that
/// reports no newer generation: `apply_connectivity` would change nothing
/// else, and a heartbeat alone never bumps `version` or changes what
/// derivation reads. Stale and duplicate are decided as
/// `apply_connectivity` decides them.
pub fn confirm_heartbeat(
    session: &Session,
    connectivity: Connectivity,
    stored_generation: i64,
    epoch: i64,
    event: ConnectivityEvent,
    observed_at: DateTime<Utc>,
    observed_generation: i64,
) -> Confirmation {
    if epoch < session.epoch
        || (epoch == session.epoch && session.last_seen.is_some_and(|l| observed_at < l))
    {
        return Confirmation::Stale;
    }
    if epoch == session.epoch && session.last_seen == Some(observed_at) {
        return Confirmation::Duplicate;
    }
    if event == ConnectivityEvent::Heartbeat
        && epoch == session.epoch
        && connectivity == Connectivity::Connected
        && session.disconnected_at.is_none()
        && observed_generation <= stored_generation
    {
        Confirmation::Refresh
    } else {
        Confirmation::Load
    }
}

// ------------------------------------------------------------ operations

impl DeviceState {
    pub fn new(record: DeviceRecord) -> Self {
        DeviceState {
            record,
            conditions: BTreeMap::new(),
            freshness: BTreeMap::new(),
        }
    }

    /// Applies one source's full snapshot (`conditions.md`, "Snapshot").
    pub fn apply_snapshot(&mut self, snap: &Snapshot, now: DateTime<Utc>) -> (Outcome, Notes) {
        let digest = snap.digest();
        if let Some(f) = self.freshness.get(&snap.source) {
            match (snap.observed_at, digest.as_slice()).cmp(&(f.observed_at, f.digest.as_slice())) {
                std::cmp::Ordering::Less => return (Outcome::Stale, Notes::default()),
                std::cmp::Ordering::Equal => return (Outcome::Duplicate, Notes::default()),
                std::cmp::Ordering::Greater => {}
            }
        }
        for t in observation_types_of(snap.source) {
            let given = snap.conditions.iter().find(|c| c.condition_type == t);
            let (status, reason, message) = match given {
                Some(c) => (c.status, c.reason.as_str(), c.message.as_str()),
                // "Types the source owns and left out are written Unknown,
                // reason NotReported, so nothing is remembered between cycles."
                None => (ConditionStatus::Unknown, reasons::NOT_REPORTED, ""),
            };
            self.put_condition(
                t,
                status,
                reason,
                message,
                snap.source,
                snap.observed_at,
                now,
                false,
            );
        }
        // Settled only when every owned row now holds this snapshot's
        // value (a later single write may have kept one).
        let holds = observation_types_of(snap.source).all(|t| {
            let row = self.conditions.get(&t);
            match snap.conditions.iter().find(|c| c.condition_type == t) {
                Some(c) => row.is_some_and(|r| r.same_value(c.status, &c.reason, &c.message)),
                None => row.is_some_and(|r| {
                    r.same_value(ConditionStatus::Unknown, reasons::NOT_REPORTED, "")
                }),
            }
        });
        self.freshness.insert(
            snap.source,
            Freshness {
                observed_at: snap.observed_at,
                digest,
                settled_version: if holds && mirror_is_the_sources(snap.source, &snap.mirror) {
                    SETTLING
                } else {
                    UNSETTLED
                },
            },
        );
        let notes = self.apply_mirror(&snap.mirror, now);
        (Outcome::Applied, notes)
    }

    /// Writes a condition value unless a later write is already stored.
    /// Returns whether it changed semantically.
    #[allow(clippy::too_many_arguments)]
    fn put_condition(
        &mut self,
        t: ConditionType,
        status: ConditionStatus,
        reason: &str,
        message: &str,
        source: Source,
        observed_at: DateTime<Utc>,
        now: DateTime<Utc>,
        refresh_observed_at: bool,
    ) -> bool {
        if refresh_observed_at {
            // Written by something other than a snapshot: the snapshots of
            // the sources owning the type no longer vouch for its row.
            for owner in t.entry().owners {
                if let Some(f) = self.freshness.get_mut(owner) {
                    f.settled_version = UNSETTLED;
                }
            }
        }
        match self.conditions.get_mut(&t) {
            Some(row) if row.observed_at > observed_at && !refresh_observed_at => false,
            Some(row) if row.same_value(status, reason, message) => {
                if refresh_observed_at {
                    row.observed_at = observed_at;
                    row.received_at = now;
                    row.source = source;
                }
                false
            }
            Some(row) => {
                if row.status != status {
                    row.last_transition_at = observed_at;
                }
                row.status = status;
                row.reason = reason.to_string();
                row.message = message.to_string();
                row.source = source;
                row.observed_at = observed_at;
                row.received_at = now;
                true
            }
            None => {
                self.conditions.insert(
                    t,
                    ConditionRow {
                        condition_type: t,
                        status,
                        reason: reason.to_string(),
                        message: message.to_string(),
                        source,
                        condition_of: t.condition_of(),
                        durable: t.is_durable(),
                        observed_at,
                        received_at: now,
                        decisive: false,
                        last_transition_at: observed_at,
                    },
                );
                true
            }
        }
    }

    fn apply_mirror(&mut self, mirror: &Mirror, now: DateTime<Utc>) -> Notes {
        let r = &mut self.record;
        match mirror {
            Mirror::None => {}
            Mirror::Ironic {
                provision_state,
                maintenance,
                maintenance_reason,
                instance_uuid,
                lessee,
                power,
            } => {
                r.mirrors.ironic_provision_state = Some(provision_state.clone());
                r.mirrors.ironic_maintenance = Some(*maintenance);
                r.mirrors.ironic_maintenance_reason = maintenance_reason.clone();
                r.mirrors.ironic_instance_uuid = instance_uuid.clone();
                r.mirrors.ironic_lessee = lessee.clone();
                r.power = *power;
            }
            Mirror::Slurm { states, mode } => match mode {
                SlurmMode::Observed => r.mirrors.slurm_states = states.clone(),
                SlurmMode::Keep => {}
                SlurmMode::Clear => r.mirrors.slurm_states.clear(),
            },
            Mirror::Netbox { status, tags } => {
                if let Some(s) = status {
                    r.inventory_status = *s;
                }
                r.mirrors.netbox_tags = tags.clone();
            }
            Mirror::Health { chassis } => r.mirrors.chassis_health = *chassis,
            Mirror::Custody {
                state,
                credential_ref,
            } => return self.apply_custody(state, credential_ref.as_deref(), now),
        }
        Notes::default()
    }

    /// Borneo custody (`conditions.md`, "Holds that freeze operational status").
    fn apply_custody(
        &mut self,
        state: &str,
        credential_ref: Option<&str>,
        now: DateTime<Utc>,
    ) -> Notes {
        let mut notes = Notes::default();
        let entering = self.record.operational_status != OperationalStatus::Delegated;
        self.record.custody = Some(state.to_string());
        match CustodyState::parse(state) {
            Ok(CustodyState::GoogleOwned) => {
                let latch = self
                    .conditions
                    .get(&ConditionType::FrontendPortsInCustomerVrf)
                    .map(|r| r.status);
                // On the transition: write unless verified True. Already
                // delegated: only a missing row is backfilled.
                let write = match latch {
                    None => true,
                    Some(status) => entering && status != ConditionStatus::True,
                };
                if write {
                    let changed = self.put_condition(
                        ConditionType::FrontendPortsInCustomerVrf,
                        ConditionStatus::Unknown,
                        reasons::HANDOVER_BREACH,
                        "custody entry with no verified front-end flip on record",
                        Source::Borneo,
                        now,
                        now,
                        true,
                    );
                    notes.handover_breach = changed || latch.is_none();
                }
                self.record.operational_status = OperationalStatus::Delegated;
            }
            Ok(CustodyState::Drained) => {
                self.record.operational_status = OperationalStatus::Drained
            }
            Ok(CustodyState::PartnerOwned) => {
                // The post-MVP recovery path: record, change no status.
                if let Some(c) = credential_ref {
                    self.record.custody_credential_ref = Some(c.to_string());
                }
            }
            Err(_) => {}
        }
        notes
    }

    /// The single-condition path (`ConditionWrite`). Returns the outcome and
    /// whether the value changed semantically (create, status, reason,
    /// message), which is when the caller re-derives.
    pub fn apply_condition_write(
        &mut self,
        source: Source,
        input: &ConditionInput,
        observed_at: Option<DateTime<Utc>>,
        hub_ordered: bool,
        now: DateTime<Utc>,
    ) -> Result<(Outcome, bool), DomainError> {
        let t = input.condition_type;
        t.check_owner(source)?;
        if source == Source::Borneo && !hub_ordered {
            // "borneo (custody entry only, hub-ordered)"
            return Err(DomainError::ForbiddenSource {
                source_name: source.to_string(),
                condition_type: format!("{t} (only as the hub-ordered custody-entry write)"),
            });
        }
        let at = if hub_ordered {
            now
        } else {
            let at = observed_at
                .ok_or_else(|| DomainError::InvalidArgument("observed_at is required".into()))?;
            check_observed_at(at, now)?;
            if let Some(row) = self.conditions.get(&t) {
                if at < row.observed_at {
                    return Ok((Outcome::Stale, false));
                }
                if at == row.observed_at
                    && row.same_value(input.status, &input.reason, &input.message)
                {
                    return Ok((Outcome::Duplicate, false));
                }
            }
            at
        };
        let changed = self.put_condition(
            t,
            input.status,
            &input.reason,
            &input.message,
            source,
            at,
            now,
            true,
        );
        Ok((Outcome::Applied, changed))
    }

    /// A node agent session event from the gateway.
    pub fn apply_connectivity(
        &mut self,
        epoch: i64,
        gateway_id: &str,
        event: ConnectivityEvent,
        observed_at: DateTime<Utc>,
    ) -> Outcome {
        self.apply_connectivity_of(epoch, gateway_id, event, observed_at, 0)
    }

    /// [`DeviceState::apply_connectivity`] for a session opened under
    /// `identity_generation` (0: not reported). Seed 000: "Certificates of
    /// an earlier generation never work again": an open or heartbeat of an
    /// earlier generation is refused as stale (a close still applies).
    pub fn apply_connectivity_of(
        &mut self,
        epoch: i64,
        gateway_id: &str,
        event: ConnectivityEvent,
        observed_at: DateTime<Utc>,
        identity_generation: i64,
    ) -> Outcome {
        if identity_generation > 0
            && identity_generation < self.record.identity_generation
            && event != ConnectivityEvent::Closed
        {
            return Outcome::Stale;
        }
        let s = &mut self.record.session;
        if epoch < s.epoch || (epoch == s.epoch && s.last_seen.is_some_and(|l| observed_at < l)) {
            return Outcome::Stale;
        }
        if epoch == s.epoch && s.last_seen == Some(observed_at) {
            return Outcome::Duplicate;
        }
        if epoch > s.epoch {
            s.epoch = epoch;
            s.gateway_id = Some(gateway_id.to_string());
            s.connected_at = Some(observed_at);
            s.disconnected_at = None;
        }
        s.last_seen = Some(observed_at);
        match event {
            ConnectivityEvent::Opened | ConnectivityEvent::Heartbeat => {
                if s.disconnected_at.is_none() {
                    self.record.connectivity = Connectivity::Connected;
                }
            }
            ConnectivityEvent::Closed => {
                s.disconnected_at = Some(observed_at);
                self.record.connectivity = Connectivity::Disconnected;
            }
        }
        Outcome::Applied
    }

    /// The generation the node reports converged; it never moves back.
    pub fn report_generation(&mut self, observed_generation: i64) {
        if observed_generation > self.record.observed_generation {
            self.record.observed_generation = observed_generation;
        }
    }

    /// Liveness: no heartbeat for `unreachable_after` is `unreachable`, for
    /// `lost_after` is `lost`.
    pub fn apply_liveness(
        &mut self,
        now: DateTime<Utc>,
        unreachable_after: Duration,
        lost_after: Duration,
    ) {
        let r = &mut self.record;
        let Some(last) = r.session.last_seen else {
            return;
        };
        if !matches!(
            r.connectivity,
            Connectivity::Connected | Connectivity::Unreachable
        ) {
            return;
        }
        if last + lost_after < now {
            r.connectivity = Connectivity::Lost;
        } else if last + unreachable_after < now && r.connectivity == Connectivity::Connected {
            r.connectivity = Connectivity::Unreachable;
        }
    }

    /// A condition as derivation reads it now: stale observation rows read
    /// `Unknown`/`SourceSilent`.
    pub fn effective(&self, t: ConditionType, now: DateTime<Utc>, ttls: &Ttls) -> Effective<'_> {
        match self.conditions.get(&t) {
            None => Effective::ABSENT,
            Some(row) if self.is_stale(row, now, ttls) => Effective {
                status: ConditionStatus::Unknown,
                reason: reasons::SOURCE_SILENT,
            },
            Some(row) => Effective {
                status: row.status,
                reason: &row.reason,
            },
        }
    }

    /// The time a row was last confirmed: the later of its own
    /// `observed_at` and its source's snapshot freshness.
    pub fn last_confirmed(&self, row: &ConditionRow) -> DateTime<Utc> {
        match self.freshness.get(&row.source) {
            Some(f) if f.observed_at > row.observed_at => f.observed_at,
            _ => row.observed_at,
        }
    }

    pub fn is_stale(&self, row: &ConditionRow, now: DateTime<Utc>, ttls: &Ttls) -> bool {
        !row.durable && self.last_confirmed(row) + ttls.of(row.source) < now
    }

    /// Re-derives every derived axis and the decisive flags. `at` stamps
    /// `entered_service_at` and failure metadata.
    pub fn reconcile(&mut self, now: DateTime<Utc>, ttls: &Ttls) {
        let inventory_only = self.record.inventory_only;
        let derived =
            derivation::derive_operational(inventory_only, |t| self.effective(t, now, ttls));
        let decisive: Vec<ConditionType> = derived.decisive.clone();
        for (t, row) in self.conditions.iter_mut() {
            row.decisive = decisive.contains(t);
        }
        let r = &mut self.record;
        if !derivation::is_frozen(r.operational_status, r.impairment_hold.is_some()) {
            let before = r.operational_status;
            r.operational_status = derived.status;
            if derived.status == OperationalStatus::Failed && before != OperationalStatus::Failed {
                r.failure_state = r.mirrors.ironic_provision_state.clone();
                r.failed_at = Some(now);
            }
        }
        if matches!(
            r.operational_status,
            OperationalStatus::Available | OperationalStatus::InUse
        ) && r.entered_service_at.is_none()
        {
            r.entered_service_at = Some(now);
        }
        let health_fresh = self
            .freshness
            .get(&Source::HealthStatus)
            .is_some_and(|f| f.observed_at + ttls.of(Source::HealthStatus) >= now);
        let composite = if health_fresh {
            self.record.mirrors.chassis_health
        } else {
            None
        };
        self.record.health_status = derivation::derive_health(inventory_only, composite);
        self.record.no_schedule_reasons = self.no_schedule_reasons(now, ttls);
        let r = &self.record;
        self.record.capacity_bucket = predicates::schedulable(&SchedulingFacts {
            role: r.role,
            trust: r.trust,
            owner_tenant_id: r.owner_tenant_id.as_deref(),
            pool_owner_tenant_id: r.pool_owner_tenant_id.as_deref(),
            maintenance: r.maintenance,
            cordoned: r.cordoned,
            provision_state: r.provision_state,
            observed_generation: r.observed_generation,
            connectivity: r.connectivity,
            no_schedule_reasons: &r.no_schedule_reasons,
        });
    }

    /// `taint:<key>`, NoSchedule condition types in their bad state,
    /// `unreachable`, `draining`, `health:critical`, in that order.
    fn no_schedule_reasons(&self, now: DateTime<Utc>, ttls: &Ttls) -> Vec<String> {
        let r = &self.record;
        let mut out: Vec<String> = r.taints.iter().map(|k| format!("taint:{k}")).collect();
        for t in self.conditions.keys() {
            if t.entry().no_schedule && t.is_bad(self.effective(*t, now, ttls).status) {
                out.push(t.to_string());
            }
        }
        if r.connectivity != Connectivity::Connected {
            out.push("unreachable".into());
        }
        if r.draining {
            out.push("draining".into());
        }
        if r.health_status == HealthStatus::Critical {
            out.push("health:critical".into());
        }
        out
    }

    /// Ends a transaction's work on the device: re-derives (unless
    /// deleted), bumps `version` when the record changed beyond the
    /// heartbeat (a device `born` here keeps version 1), and settles the
    /// freshness rows of the snapshots applied since `before`.
    ///
    /// A source settled at `before`'s version stays settled at the new one
    /// when nothing its snapshot's full apply writes has moved: its owned
    /// rows hold the same values and the mirrored columns are unchanged. A
    /// join, a session opening or closing, an adoption or a cordon bumps
    /// the version without touching either, and must not send every
    /// source's next snapshot down the full path.
    pub fn finish(&mut self, before: &DeviceState, born: bool, now: DateTime<Utc>, ttls: &Ttls) {
        if !self.record.deleted {
            self.reconcile(now, ttls);
        }
        if !born && self.record.differs_beyond_heartbeat(&before.record) {
            self.record.version = before.record.version + 1;
        }
        let version = self.record.version;
        for (source, f) in self.freshness.iter_mut() {
            if f.settled_version == SETTLING {
                f.settled_version = version;
            } else if f.settled_version > UNSETTLED {
                let kept = f.settled_version == before.record.version
                    && mirrored_columns_equal(*source, &self.record, &before.record)
                    && owned_rows_equal(*source, &self.conditions, &before.conditions);
                f.settled_version = if kept { version } else { UNSETTLED };
            }
        }
    }

    /// The tracked axes whose value differs from `before`.
    pub fn axis_changes(&self, before: &DeviceRecord) -> Vec<AxisChange> {
        TRACKED_AXES
            .iter()
            .filter_map(|axis| {
                let (from, to) = (before.axis_value(*axis), self.record.axis_value(*axis));
                (from != to).then_some(AxisChange {
                    axis: *axis,
                    from,
                    to,
                })
            })
            .collect()
    }

    /// Condition types whose status differs from `before`.
    pub fn condition_changes(
        &self,
        before: &BTreeMap<ConditionType, ConditionRow>,
    ) -> Vec<ConditionChange> {
        self.conditions
            .values()
            .filter_map(|row| {
                let from = before.get(&row.condition_type).map(|b| b.status);
                (from != Some(row.status)).then_some(ConditionChange {
                    condition_type: row.condition_type,
                    from,
                    to: row.status,
                })
            })
            .collect()
    }

    /// The types the current derivation found decisive, by name.
    pub fn decisive_types(&self) -> Vec<ConditionType> {
        let mut v: Vec<ConditionType> = self
            .conditions
            .values()
            .filter(|r| r.decisive)
            .map(|r| r.condition_type)
            .collect();
        v.sort_by_key(|t| t.as_str());
        v
    }
}
