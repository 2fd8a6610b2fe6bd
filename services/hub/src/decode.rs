//! From bus messages to validated domain inputs. Every rejection is typed;
//! a rejected message is dead-lettered with its reason and changes nothing.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use fleet_domain::binding::{BindingInput, Resource};
use fleet_domain::limits::{
    check_count, check_len, MAX_ID, MAX_ITEMS, MAX_KEY, MAX_MESSAGE, MAX_REASON,
};
use fleet_domain::state::{check_observed_at, ConditionInput, Mirror, SlurmMode, Snapshot};
use fleet_domain::*;
use fleet_proto::{datetime, v1, Message, Name};

/// A validated observation, still keyed by the source's external key.
#[derive(Debug, Clone)]
pub enum Observation {
    Snapshot {
        key: Key,
        snapshot: Snapshot,
    },
    Write {
        key: Key,
        write: SingleWrite,
    },
    Connectivity {
        device_id: String,
        epoch: i64,
        gateway_id: String,
        event: ConnectivityEvent,
        observed_at: DateTime<Utc>,
        observed_generation: i64,
        /// The identity generation the session was opened under; 0: not
        /// reported.
        identity_generation: i64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub site: String,
    pub kind: KeyKind,
    pub key: String,
}

#[derive(Debug, Clone)]
pub struct SingleWrite {
    pub source: Source,
    pub input: ConditionInput,
    pub observed_at: Option<DateTime<Utc>>,
    pub hub_ordered: bool,
}

impl Observation {
    pub fn source(&self) -> Source {
        match self {
            Observation::Snapshot { snapshot, .. } => snapshot.source,
            Observation::Write { write, .. } => write.source,
            Observation::Connectivity { .. } => Source::Gateway,
        }
    }
    pub fn key(&self) -> Key {
        match self {
            Observation::Snapshot { key, .. } | Observation::Write { key, .. } => key.clone(),
            Observation::Connectivity { device_id, .. } => Key {
                site: String::new(),
                kind: KeyKind::DeviceId,
                key: device_id.clone(),
            },
        }
    }
    pub fn observed_at(&self) -> DateTime<Utc> {
        match self {
            Observation::Snapshot { snapshot, .. } => snapshot.observed_at,
            Observation::Write { write, .. } => write.observed_at.unwrap_or_else(Utc::now),
            Observation::Connectivity { observed_at, .. } => *observed_at,
        }
    }
}

fn invalid(msg: impl Into<String>) -> DomainError {
    DomainError::InvalidArgument(msg.into())
}

fn opt(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

pub fn key(k: Option<&v1::DeviceKey>) -> Result<Key, DomainError> {
    let k = k.ok_or_else(|| invalid("device key is required"))?;
    check_len("device.site", &k.site, MAX_ID)?;
    check_len("device.kind", &k.kind, MAX_ID)?;
    check_len("device.key", &k.key, MAX_KEY)?;
    let kind = KeyKind::parse(&k.kind)?;
    if k.key.is_empty() {
        return Err(invalid("device key is empty"));
    }
    if kind != KeyKind::DeviceId && kind != KeyKind::Serial && k.site.is_empty() {
        return Err(invalid(format!("a {kind} key needs its site")));
    }
    Ok(Key {
        site: k.site.clone(),
        kind,
        key: k.key.clone(),
    })
}

pub fn condition(c: &v1::Condition) -> Result<ConditionInput, DomainError> {
    check_len("condition.type", &c.r#type, MAX_ID)?;
    check_len("condition.reason", &c.reason, MAX_REASON)?;
    check_len("condition.message", &c.message, MAX_MESSAGE)?;
    Ok(ConditionInput {
        condition_type: ConditionType::lookup(&c.r#type)?,
        status: ConditionStatus::parse(&c.status)?,
        reason: c.reason.clone(),
        message: c.message.clone(),
    })
}

pub fn snapshot(
    s: &v1::ConditionSnapshot,
    now: DateTime<Utc>,
) -> Result<(Key, Snapshot), DomainError> {
    let source = Source::parse(&s.source)?;
    let key = key(s.device.as_ref())?;
    let observed_at =
        datetime(s.observed_at.as_ref()).ok_or_else(|| invalid("observed_at is required"))?;
    check_count("conditions", s.conditions.len(), MAX_ITEMS)?;
    mirror_bounded(s.mirror.as_ref())?;
    let conditions = s
        .conditions
        .iter()
        .map(condition)
        .collect::<Result<Vec<_>, _>>()?;
    use v1::condition_snapshot::Mirror as M;
    let mirror = match &s.mirror {
        None => Mirror::None,
        Some(M::Ironic(m)) => Mirror::Ironic {
            provision_state: m.provision_state.clone(),
            maintenance: m.maintenance,
            maintenance_reason: opt(&m.maintenance_reason),
            instance_uuid: opt(&m.instance_uuid),
            lessee: opt(&m.lessee),
            power: match m.power_state.as_str() {
                "power on" => Power::On,
                "power off" => Power::Off,
                _ => Power::Unknown,
            },
            node_uuid: opt(&m.node_uuid),
        },
        Some(M::Slurm(m)) => Mirror::Slurm {
            states: m.states.clone(),
            mode: match m.mode.as_str() {
                "" | "observed" => SlurmMode::Observed,
                "keep" => SlurmMode::Keep,
                "clear" => SlurmMode::Clear,
                other => return Err(invalid(format!("unknown slurm mirror mode {other:?}"))),
            },
        },
        Some(M::Netbox(m)) => Mirror::Netbox {
            status: if m.status.is_empty() {
                None
            } else {
                Some(InventoryStatus::parse(&m.status)?)
            },
            tags: m.tags.clone(),
            // A snapshot of NetBox's record names the device's NetBox id;
            // a mark (a device gone from NetBox) does not.
            identity: (m.netbox_id > 0).then(|| fleet_domain::state::NetboxIdentity {
                netbox_id: Some(m.netbox_id),
                serial: opt(&m.serial),
                rack: opt(&m.rack),
            }),
        },
        Some(M::Health(m)) => Mirror::Health {
            chassis: if m.chassis_health.is_empty() {
                None
            } else {
                Some(ChassisHealth::parse(&m.chassis_health)?)
            },
        },
        Some(M::Custody(m)) => {
            if m.state.is_empty() {
                return Err(invalid("custody state is required"));
            }
            // Only the states the hub acts on are stored.
            CustodyState::parse(&m.state)?;
            Mirror::Custody {
                state: m.state.clone(),
                credential_ref: opt(&m.credential_ref),
            }
        }
    };
    check_count("resource_bindings", s.resource_bindings.len(), MAX_ITEMS)?;
    let bindings = s
        .resource_bindings
        .iter()
        .map(binding)
        .collect::<Result<Vec<_>, _>>()?;
    let snapshot = Snapshot {
        source,
        observed_at,
        conditions,
        mirror,
        bindings,
    }
    .validate(now)?;
    Ok((key, snapshot))
}

fn binding(b: &v1::ResourceBinding) -> Result<BindingInput, DomainError> {
    let resource = Resource::parse(&b.resource)?;
    check_len("resource_binding.resource_id", &b.resource_id, MAX_ID)?;
    check_len("resource_binding.reason", &b.reason, MAX_REASON)?;
    check_len("resource_binding.message", &b.message, MAX_MESSAGE)?;
    Ok(if b.resource_id.is_empty() {
        BindingInput::Failed {
            resource,
            reason: b.reason.clone(),
            message: b.message.clone(),
        }
    } else {
        BindingInput::Resolved {
            resource,
            resource_id: b.resource_id.clone(),
        }
    })
}

pub fn write(
    w: &v1::ConditionWrite,
    now: DateTime<Utc>,
) -> Result<(Key, SingleWrite), DomainError> {
    let source = Source::parse(&w.source)?;
    let key = key(w.device.as_ref())?;
    let input = condition(
        w.condition
            .as_ref()
            .ok_or_else(|| invalid("condition is required"))?,
    )?;
    input.condition_type.check_owner(source)?;
    let observed_at = datetime(w.observed_at.as_ref());
    if !w.hub_ordered {
        let at =
            observed_at.ok_or_else(|| invalid("observed_at is required unless hub_ordered"))?;
        check_observed_at(at, now)?;
    }
    if w.hub_ordered
        && !(source == Source::Borneo
            && input.condition_type == ConditionType::FrontendPortsInCustomerVrf)
    {
        return Err(invalid(
            "hub_ordered is only for the custody-entry FrontendPortsInCustomerVrf write",
        ));
    }
    if source == Source::Borneo && !w.hub_ordered {
        return Err(DomainError::ForbiddenSource {
            source_name: source.to_string(),
            condition_type: format!("{} (custody entry only, hub-ordered)", input.condition_type),
        });
    }
    input
        .condition_type
        .check_latch_reason(input.status, &input.reason, w.hub_ordered)?;
    Ok((
        key,
        SingleWrite {
            source,
            input,
            observed_at,
            hub_ordered: w.hub_ordered,
        },
    ))
}

pub fn connectivity(
    c: &v1::ConnectivityObservation,
    now: DateTime<Utc>,
) -> Result<Observation, DomainError> {
    if c.device_id.is_empty() {
        return Err(invalid("device_id is required"));
    }
    check_len("device_id", &c.device_id, MAX_ID)?;
    check_len("gateway_id", &c.gateway_id, MAX_ID)?;
    let observed_at =
        datetime(c.observed_at.as_ref()).ok_or_else(|| invalid("observed_at is required"))?;
    check_observed_at(observed_at, now)?;
    Ok(Observation::Connectivity {
        device_id: c.device_id.clone(),
        epoch: c.epoch,
        gateway_id: c.gateway_id.clone(),
        event: ConnectivityEvent::parse(&c.event)?,
        observed_at,
        observed_generation: c.observed_generation.max(0),
        identity_generation: c.identity_generation.max(0),
    })
}

/// Decodes one message from an observation stream. `subject_source` is the source
/// token of the subject: the subject is what NATS permissions guard, so a
/// payload naming another source is `FORBIDDEN_SOURCE`.
pub fn observation(
    schema: Option<&str>,
    subject_source: &str,
    payload: &Bytes,
    now: DateTime<Utc>,
) -> Result<Observation, DomainError> {
    // The header is a full name (`fleet.v1.ConditionSnapshot`); no header
    // is a snapshot. Matched on the message's own name (`prost::Name`).
    let name = match schema {
        None => v1::ConditionSnapshot::NAME,
        Some(s) => s
            .strip_prefix(v1::ConditionSnapshot::PACKAGE)
            .and_then(|s| s.strip_prefix('.'))
            .unwrap_or(""),
    };
    let obs = match name {
        v1::ConditionSnapshot::NAME => {
            let m = v1::ConditionSnapshot::decode(payload.as_ref())
                .map_err(|e| invalid(format!("undecodable ConditionSnapshot: {e}")))?;
            if snapshot_has_nul(&m) {
                return Err(invalid("a string holds a NUL character"));
            }
            let (key, snapshot) = snapshot(&m, now)?;
            Observation::Snapshot { key, snapshot }
        }
        v1::ConditionWrite::NAME => {
            let m = v1::ConditionWrite::decode(payload.as_ref())
                .map_err(|e| invalid(format!("undecodable ConditionWrite: {e}")))?;
            if fleet_proto::contains_nul(&m) {
                return Err(invalid("a string holds a NUL character"));
            }
            let (key, write) = write(&m, now)?;
            Observation::Write { key, write }
        }
        v1::ConnectivityObservation::NAME => {
            let m = v1::ConnectivityObservation::decode(payload.as_ref())
                .map_err(|e| invalid(format!("undecodable ConnectivityObservation: {e}")))?;
            if fleet_proto::contains_nul(&m) {
                return Err(invalid("a string holds a NUL character"));
            }
            connectivity(&m, now)?
        }
        _ => {
            return Err(invalid(format!(
                "unexpected schema {:?} on an observation subject",
                schema.unwrap_or_default()
            )))
        }
    };
    if obs.source().subject_token() != subject_source {
        return Err(DomainError::ForbiddenSource {
            source_name: subject_source.to_string(),
            condition_type: format!("a message from {}", obs.source()),
        });
    }
    Ok(obs)
}

/// Every string a mirror carries is bounded.
fn mirror_bounded(m: Option<&v1::condition_snapshot::Mirror>) -> Result<(), DomainError> {
    use v1::condition_snapshot::Mirror as M;
    let tokens = |field: &str, items: &[String]| -> Result<(), DomainError> {
        check_count(field, items.len(), MAX_ITEMS)?;
        items
            .iter()
            .try_for_each(|t| check_len(field, t, MAX_REASON))
    };
    match m {
        None => Ok(()),
        Some(M::Ironic(i)) => {
            check_len("ironic.provision_state", &i.provision_state, MAX_REASON)?;
            check_len(
                "ironic.maintenance_reason",
                &i.maintenance_reason,
                MAX_MESSAGE,
            )?;
            check_len("ironic.instance_uuid", &i.instance_uuid, MAX_ID)?;
            check_len("ironic.lessee", &i.lessee, MAX_REASON)?;
            check_len("ironic.power_state", &i.power_state, MAX_ID)?;
            check_len("ironic.node_uuid", &i.node_uuid, MAX_ID)
        }
        Some(M::Slurm(x)) => {
            check_len("slurm.mode", &x.mode, MAX_ID)?;
            tokens("slurm.states", &x.states)
        }
        Some(M::Netbox(x)) => {
            check_len("netbox.status", &x.status, MAX_ID)?;
            check_len("netbox.name", &x.name, MAX_KEY)?;
            check_len("netbox.serial", &x.serial, MAX_KEY)?;
            check_len("netbox.rack", &x.rack, MAX_KEY)?;
            tokens("netbox.tags", &x.tags)
        }
        Some(M::Health(x)) => check_len("health.chassis_health", &x.chassis_health, MAX_ID),
        Some(M::Custody(x)) => {
            check_len("custody.state", &x.state, MAX_ID)?;
            check_len("custody.credential_ref", &x.credential_ref, MAX_KEY)
        }
    }
}

/// NUL cannot be stored in PostgreSQL text: checked field by field on the
/// hot path (the generic check formats the whole message).
fn snapshot_has_nul(m: &v1::ConditionSnapshot) -> bool {
    use v1::condition_snapshot::Mirror as M;
    let nul = |s: &str| s.contains('\0');
    let key = m
        .device
        .as_ref()
        .is_some_and(|k| nul(&k.site) || nul(&k.kind) || nul(&k.key));
    let conds = m
        .conditions
        .iter()
        .any(|c| nul(&c.r#type) || nul(&c.status) || nul(&c.reason) || nul(&c.message));
    let mirror = match &m.mirror {
        None => false,
        Some(M::Ironic(i)) => [
            &i.provision_state,
            &i.maintenance_reason,
            &i.instance_uuid,
            &i.lessee,
            &i.power_state,
            &i.node_uuid,
        ]
        .iter()
        .any(|s| nul(s)),
        Some(M::Slurm(x)) => nul(&x.mode) || x.states.iter().any(|s| nul(s)),
        Some(M::Netbox(x)) => {
            nul(&x.status)
                || nul(&x.name)
                || nul(&x.serial)
                || nul(&x.rack)
                || x.tags.iter().any(|s| nul(s))
        }
        Some(M::Health(x)) => nul(&x.chassis_health),
        Some(M::Custody(x)) => nul(&x.state) || nul(&x.credential_ref),
    };
    let bindings = m
        .resource_bindings
        .iter()
        .any(|b| nul(&b.resource) || nul(&b.resource_id) || nul(&b.reason) || nul(&b.message));
    nul(&m.source) || key || conds || mirror || bindings
}
