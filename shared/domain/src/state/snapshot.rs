//! Applying one source's full snapshot: the validated input, its mirrors
//! and Borneo custody.

use super::*;

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

/// What NetBox owns of a device's identity beyond its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetboxIdentity {
    /// `None`: the hub keeps the device's NetBox id (another live device
    /// of the site holds this one; see the hub's unit of work).
    pub netbox_id: Option<i64>,
    pub serial: Option<String>,
    pub rack: Option<String>,
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
        /// The node's uuid, when the snapshot carries it.
        node_uuid: Option<String>,
    },
    Slurm {
        states: Vec<String>,
        mode: SlurmMode,
    },
    Netbox {
        status: Option<InventoryStatus>,
        tags: Vec<String>,
        /// The device's serial and rack as NetBox has them, when the
        /// snapshot carries NetBox's record (`None`: a mark that carries
        /// no record, such as a device gone from NetBox: left as they are).
        identity: Option<NetboxIdentity>,
    },
    Health {
        chassis: Option<ChassisHealth>,
    },
    Custody {
        state: String,
        credential_ref: Option<String>,
    },
}

impl Mirror {
    /// The mirror's kind, as the protobuf oneof names it.
    pub const fn kind(&self) -> &'static str {
        match self {
            Mirror::None => "no",
            Mirror::Ironic { .. } => "ironic",
            Mirror::Slurm { .. } => "slurm",
            Mirror::Netbox { .. } => "netbox",
            Mirror::Health { .. } => "health",
            Mirror::Custody { .. } => "custody",
        }
    }
}

/// A validated `ConditionSnapshot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub source: Source,
    pub observed_at: DateTime<Utc>,
    pub conditions: Vec<ConditionInput>,
    pub mirror: Mirror,
    /// The resources the source resolved (or failed to) for the device.
    pub bindings: Vec<BindingInput>,
}

impl Snapshot {
    /// The NetBox id a NetBox snapshot names for its device.
    pub fn netbox_id_claim(&self) -> Option<i64> {
        match &self.mirror {
            Mirror::Netbox {
                identity: Some(i), ..
            } => i.netbox_id,
            _ => None,
        }
    }

    /// The same snapshot leaving the device's NetBox id as it is (a claim
    /// the hub refused); everything else still applies.
    pub fn keeping_netbox_id(&self) -> Snapshot {
        let mut s = self.clone();
        if let Mirror::Netbox {
            identity: Some(i), ..
        } = &mut s.mirror
        {
            i.netbox_id = None;
        }
        s
    }

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
        let mut resources = Vec::with_capacity(self.bindings.len());
        for b in &self.bindings {
            b.check()?;
            b.resource().check_owner(self.source)?;
            if resources.contains(&b.resource()) {
                return Err(DomainError::InvalidArgument(format!(
                    "resource binding {} appears twice",
                    b.resource()
                )));
            }
            resources.push(b.resource());
        }
        let mirror_ok = match &self.mirror {
            Mirror::None => true,
            Mirror::Ironic { .. } => self.source == Source::Openstack,
            Mirror::Slurm { .. } => self.source == Source::Slurm,
            Mirror::Netbox { .. } => self.source == Source::Netbox,
            Mirror::Health { .. } => self.source == Source::HealthStatus,
            Mirror::Custody { .. } => self.source == Source::Borneo,
        };
        // A mirror of another source's kind is a malformed snapshot (400),
        // not a condition its source may not write.
        if !mirror_ok {
            return Err(DomainError::InvalidArgument(format!(
                "a {} snapshot cannot carry the {} mirror",
                self.source,
                self.mirror.kind()
            )));
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
        if !self.bindings.is_empty() {
            let mut bindings: Vec<_> = self.bindings.iter().collect();
            bindings.sort_by_key(|b| b.resource());
            h.update(format!("\n{bindings:?}"));
        }
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
    check_observed_at_by(observed_at, now, "the hub's clock")
}

/// [`check_observed_at`] against another process's clock, named in the
/// refusal (the API checks before it asks the hub).
pub fn check_observed_at_by(
    observed_at: DateTime<Utc>,
    now: DateTime<Utc>,
    clock: &'static str,
) -> Result<(), DomainError> {
    if observed_at > now + FUTURE_LIMIT {
        return Err(DomainError::FutureObservation {
            observed_at: observed_at.to_rfc3339(),
            clock,
            now: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
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

pub(super) fn earliest_observation() -> DateTime<Utc> {
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

impl DeviceState {
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
        self.apply_bindings(snap);
        (Outcome::Applied, notes)
    }

    /// The `DeviceResourceBinding` rows of the resources the source owns.
    fn apply_bindings(&mut self, snap: &Snapshot) {
        for resource in Resource::owned_by(snap.source) {
            let given = snap.bindings.iter().find(|b| b.resource() == resource);
            let row = self.bindings.get(&resource);
            match BindingRow::apply(row, resource, snap.source, given, snap.observed_at) {
                Some(r) => {
                    self.bindings.insert(resource, r);
                }
                None => {
                    self.bindings.remove(&resource);
                }
            }
        }
    }

    /// Writes a condition value unless a later write is already stored.
    /// Returns whether it changed semantically.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn put_condition(
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

    pub(super) fn apply_mirror(&mut self, mirror: &Mirror, now: DateTime<Utc>) -> Notes {
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
                node_uuid,
            } => {
                // Issue 19: a device imported from NetBox gets the node's
                // uuid as its infrastructure_ref once the node matched it
                // (by name, uniquely within the site); a ref already set is
                // never replaced here (a re-bind is an operator's change).
                if r.infrastructure_ref.is_none() {
                    if let Some(u) = node_uuid {
                        r.infrastructure_ref = Some(u.clone());
                    }
                }
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
            Mirror::Netbox {
                status,
                tags,
                identity,
            } => {
                if let Some(s) = status {
                    r.inventory_status = *s;
                }
                // Issue 19: "a board swap edited in NetBox leaves the old
                // serial": NetBox's serial and rack are mirrored.
                if let Some(i) = identity {
                    r.serial = i.serial.clone();
                    r.rack = i.rack.clone();
                    if i.netbox_id.is_some() {
                        r.netbox_id = i.netbox_id;
                    }
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
    pub(super) fn apply_custody(
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
                notes.handover_breach = self.custody_entry_latch(entering, now);
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
}
