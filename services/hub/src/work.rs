//! One transaction's worth of device changes: lock the devices, let the
//! caller apply pure operations, then re-derive, bump versions and write the
//! diff together with its lifecycle rows and outbox rows.

use std::collections::{BTreeMap, BTreeSet};

use crate::store::devices::{self, LifecycleRow, Written};
use chrono::{DateTime, Utc};
use fleet_bus::Subjects;
use fleet_domain::state::{Deadlines, DeviceState, Ttls, TRACKED_AXES};
use fleet_domain::Axis;
use fleet_outbox::{Pending, Row as OutboxRow, HUB};
use fleet_proto::{timestamp, v1, Message};
use fleet_store::StoreError;
use sqlx::{Postgres, Transaction};

pub struct Touched {
    /// The device as the transaction found it: what the rows are diffed
    /// against when the transaction writes.
    pub stored: DeviceState,
    /// The device before the current step; equal to `stored` until a
    /// second operation of the same transaction reaches the device.
    pub before: DeviceState,
    pub after: DeviceState,
    pub cause: String,
    pub trace: Option<String>,
    pub born: bool,
    /// Operations applied since `before`.
    pub steps: u32,
}

pub struct Work {
    pub devices: BTreeMap<String, Touched>,
    /// The outbox rows `finish` wrote: publish them after the commit.
    pub outbox: Vec<Pending>,
    /// Transitions of earlier steps, recorded by [`Work::step`].
    lifecycle: Vec<LifecycleRow>,
    events: Vec<OutboxRow>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Summary {
    pub written: Written,
    pub events: u64,
    pub lifecycle: u64,
}

/// `ids` sorted and each once: concurrent transactions lock in this
/// order, so they never deadlock.
fn id_order(ids: &[String]) -> Vec<String> {
    let mut sorted = ids.to_vec();
    sorted.sort();
    sorted.dedup();
    sorted
}

impl Work {
    pub async fn lock(
        tx: &mut Transaction<'_, Postgres>,
        ids: &[String],
    ) -> Result<Work, StoreError> {
        Ok(Work::of(devices::lock_states(tx, &id_order(ids)).await?))
    }

    /// [`Work::lock`] without waiting: a device another transaction holds
    /// is not in the work.
    pub async fn lock_free(
        tx: &mut Transaction<'_, Postgres>,
        ids: &[String],
    ) -> Result<Work, StoreError> {
        Ok(Work::of(
            devices::lock_free_states(tx, &id_order(ids)).await?,
        ))
    }

    /// Loads devices this transaction has locked already.
    pub async fn load_locked(
        tx: &mut Transaction<'_, Postgres>,
        ids: &[String],
    ) -> Result<Work, StoreError> {
        Ok(Work::of(devices::locked_states(tx, ids).await?))
    }

    fn of(states: BTreeMap<String, DeviceState>) -> Work {
        let devices = states
            .into_iter()
            .map(|(id, s)| {
                (
                    id,
                    Touched {
                        stored: s.clone(),
                        before: s.clone(),
                        after: s,
                        cause: String::new(),
                        trace: None,
                        born: false,
                        steps: 0,
                    },
                )
            })
            .collect();
        Work {
            devices,
            outbox: vec![],
            lifecycle: vec![],
            events: vec![],
        }
    }

    /// The live (not deleted) device, for an operation with `cause`.
    pub fn device(
        &mut self,
        id: &str,
        cause: &str,
        trace: Option<&String>,
    ) -> Option<&mut DeviceState> {
        let t = self
            .devices
            .get_mut(id)
            .filter(|t| !t.after.record.deleted)?;
        t.cause = cause.to_string();
        if let Some(tp) = trace {
            t.trace = Some(tp.clone());
        }
        Some(&mut t.after)
    }

    /// The live device for one more operation of this transaction, in
    /// order: when an earlier operation already reached it, that one's
    /// transitions are derived and recorded first (lifecycle rows and
    /// `StatusChanged`, each with its own version), so two observations of
    /// one device in one batch are two transitions, not their net change.
    pub fn step(
        &mut self,
        id: &str,
        cause: &str,
        trace: Option<&String>,
        now: DateTime<Utc>,
        ttls: &Ttls,
        subjects: &Subjects,
    ) -> Option<&mut DeviceState> {
        let t = self
            .devices
            .get_mut(id)
            .filter(|t| !t.after.record.deleted)?;
        if t.steps > 0 {
            t.after.finish(&t.before, t.born, now, ttls);
            events(t, now, subjects, &mut self.lifecycle, &mut self.events);
            t.before = t.after.clone();
            t.born = false;
        }
        t.steps += 1;
        t.cause = cause.to_string();
        t.trace = trace.cloned();
        Some(&mut t.after)
    }

    /// Which of `claims` (device id, NetBox id) this transaction refuses.
    /// The NetBox id follows NetBox (issue 19: "a device deleted and
    /// re-created in NetBox keeps the old netbox_id"), but it is unique
    /// among a site's live devices (`devices_netbox_id`): an id another live
    /// device of the site holds, or one that two devices of this
    /// transaction claim, would fail the whole write, every snapshot of the
    /// batch with it. Such a claim leaves the device's id as it is, with a
    /// warning; the rest of its snapshot applies.
    pub async fn refused_netbox_ids(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        claims: &[(String, i64)],
    ) -> Result<BTreeSet<(String, i64)>, StoreError> {
        let changing: Vec<(&str, &str, i64)> = claims
            .iter()
            .filter_map(|(id, n)| {
                let t = self.devices.get(id)?;
                (t.stored.record.netbox_id != Some(*n)).then_some((
                    id.as_str(),
                    t.stored.record.site_id.as_str(),
                    *n,
                ))
            })
            .collect();
        if changing.is_empty() {
            return Ok(BTreeSet::new());
        }
        let claimed: Vec<(&str, i64)> = changing.iter().map(|c| (c.1, c.2)).collect();
        let holders = devices::netbox_id_holders(tx, &claimed).await?;
        let mut refused = BTreeSet::new();
        for &(id, site, n) in &changing {
            let holder = holders
                .iter()
                .find(|(s, hn, h)| s == site && *hn == n && h != id)
                .map(|h| h.2.as_str())
                .or_else(|| {
                    changing
                        .iter()
                        .find(|(o, s, on)| *o != id && *s == site && *on == n)
                        .map(|o| o.0)
                });
            if let Some(holder) = holder {
                tracing::warn!(device_id = id, site, netbox_id = n, held_by = holder, "NetBox names a NetBox id another live device of the site holds; the device keeps its own");
                refused.insert((id.to_string(), n));
            }
        }
        Ok(refused)
    }

    /// Re-derives every locked device and writes what changed.
    pub async fn finish(
        mut self,
        tx: &mut Transaction<'_, Postgres>,
        now: DateTime<Utc>,
        deadlines: &Deadlines,
        subjects: &Subjects,
    ) -> Result<(Summary, Work), StoreError> {
        let mut lifecycle = std::mem::take(&mut self.lifecycle);
        let mut outbox_rows = std::mem::take(&mut self.events);
        for t in self.devices.values_mut() {
            // A device is born at version 1, derived axes included.
            t.after.finish(&t.before, t.born, now, &deadlines.ttls);
            events(t, now, subjects, &mut lifecycle, &mut outbox_rows);
        }
        let pairs: Vec<(&DeviceState, &DeviceState)> = self
            .devices
            .values()
            .map(|t| (&t.stored, &t.after))
            .collect();
        let written = devices::write_diffs(tx, &pairs, now, deadlines).await?;
        devices::insert_lifecycle(tx, &lifecycle, now).await?;
        let events = outbox_rows.len() as u64;
        self.outbox = HUB.insert(tx, outbox_rows).await?;
        let summary = Summary {
            written,
            events,
            lifecycle: lifecycle.len() as u64,
        };
        Ok((summary, self))
    }
}

/// Lifecycle rows (one per changed axis, a birth row per kind on creation)
/// and `StatusChanged` outbox rows for one device, contract version 2
/// (`status.proto`): a birth is one `device` event with every axis's first
/// value and the conditions it was born with; otherwise one event per axis
/// that changed and at most one `conditions` event listing every condition
/// that changed.
fn events(
    t: &Touched,
    now: DateTime<Utc>,
    subjects: &Subjects,
    lifecycle: &mut Vec<LifecycleRow>,
    outbox_rows: &mut Vec<OutboxRow>,
) {
    let r = &t.after.record;
    let changes: Vec<(Axis, String, String)> = if t.born {
        TRACKED_AXES
            .iter()
            .map(|a| (*a, String::new(), r.axis_value(*a)))
            .collect()
    } else {
        t.after
            .axis_changes(&t.before.record)
            .into_iter()
            .map(|c| (c.axis, c.from, c.to))
            .collect()
    };
    let conditions: Vec<v1::ConditionChange> = t
        .after
        .condition_changes(&t.before.conditions)
        .into_iter()
        .map(|c| v1::ConditionChange {
            condition_type: c.condition_type.to_string(),
            from_status: c.from.map(|s| s.to_string()).unwrap_or_default(),
            to_status: c.to.to_string(),
        })
        .collect();
    let trace = t.trace.clone().unwrap_or_else(|| {
        fleet_runtime::telemetry::downstream_traceparent(&tracing::Span::none(), None)
    });
    let decisive: Vec<String> = t
        .after
        .decisive_types()
        .iter()
        .map(|c| c.to_string())
        .collect();
    let base = v1::StatusChanged {
        device_id: r.id.clone(),
        site: r.site_id.clone(),
        at: Some(timestamp(now)),
        version: r.version,
        cause: t.cause.clone(),
        schema_version: fleet_proto::STATUS_SCHEMA_VERSION,
        ..Default::default()
    };
    let mut emit = |msg: v1::StatusChanged| {
        outbox_rows.push(OutboxRow {
            subject: subjects.status(&msg.axis, &r.site_id, &r.id),
            schema: fleet_proto::schema::<v1::StatusChanged>(),
            payload: msg.encode_to_vec(),
            traceparent: Some(trace.clone()),
        });
    };
    for (axis, _, to) in &changes {
        lifecycle.push(LifecycleRow {
            device_id: r.id.clone(),
            kind: axis.to_string(),
            value: to.clone(),
            cause: t.cause.clone(),
        });
    }
    if t.born {
        emit(v1::StatusChanged {
            axis: Axis::Device.to_string(),
            to: "born".into(),
            decisive,
            axes: changes
                .into_iter()
                .map(|(axis, _, value)| v1::AxisValue {
                    axis: axis.to_string(),
                    value,
                })
                .collect(),
            conditions,
            ..base
        });
        return;
    }
    for (axis, from, to) in changes {
        emit(v1::StatusChanged {
            axis: axis.to_string(),
            from_value: from,
            to,
            decisive: if axis == Axis::Operational {
                decisive.clone()
            } else {
                vec![]
            },
            ..base.clone()
        });
    }
    if !conditions.is_empty() {
        let listed = |f: fn(&v1::ConditionChange) -> &str| {
            conditions
                .iter()
                .filter(|c| !f(c).is_empty())
                .map(|c| format!("{}={}", c.condition_type, f(c)))
                .collect::<Vec<_>>()
                .join(",")
        };
        emit(v1::StatusChanged {
            axis: Axis::Conditions.to_string(),
            from_value: listed(|c| &c.from_status),
            to: listed(|c| &c.to_status),
            decisive: conditions
                .iter()
                .map(|c| c.condition_type.clone())
                .collect(),
            conditions,
            ..base
        });
    }
}
