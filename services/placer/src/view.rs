//! The capacity view: every pooled device's bucket, GPUs and booked atoms,
//! kept from `<root>.status.schedulable.>` events and the placer's own
//! bookings, rebuildable from PostgreSQL at any time. It answers capacity
//! and ranks candidates; it never decides a booking (the row lock and the
//! re-check do).

use std::collections::{BTreeSet, HashMap, HashSet};

use fleet_domain::CapacityBucket;

use crate::model::Capacity;
use crate::packing::{Candidate, Take};

/// One device as PostgreSQL has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRow {
    pub id: String,
    pub pool_id: String,
    pub version: i64,
    pub rack: Option<String>,
    pub nvlink_domain: Option<String>,
    pub gpus: u32,
    pub bucket: CapacityBucket,
    pub booked: u32,
}

#[derive(Debug, Clone)]
struct Entry {
    row: DeviceRow,
    /// Atoms an in-flight booking of this process plans to take.
    claimed: u32,
    /// The view sequence of this process's last booking or release here.
    touched: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketUpdate {
    Applied,
    /// Older than what the view holds (a redelivery or a replay).
    Stale,
    /// Not in the view: the caller loads the device.
    Unknown,
}

#[derive(Debug, Default)]
pub struct View {
    devices: HashMap<String, Entry>,
    pools: HashMap<String, BTreeSet<String>>,
    seq: u64,
}

impl View {
    /// The sequence to pass to a rebuild started now.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    pub fn device(&self, id: &str) -> Option<&DeviceRow> {
        self.devices.get(id).map(|e| &e.row)
    }

    /// Replaces the devices of `pool` (every pool when `None`) with rows
    /// read from PostgreSQL after `started = self.seq()` was taken. A newer
    /// event already applied wins over the read; a device this process
    /// booked or released on since keeps its own booked count.
    pub fn replace(&mut self, pool: Option<&str>, rows: Vec<DeviceRow>, started: u64) {
        let fresh: HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        let stale: Vec<String> = match pool {
            Some(p) => self
                .pools
                .get(p)
                .map(|s| {
                    s.iter()
                        .filter(|id| !fresh.contains(id.as_str()))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
            None => self
                .devices
                .keys()
                .filter(|id| !fresh.contains(id.as_str()))
                .cloned()
                .collect(),
        };
        for id in stale {
            self.remove(&id);
        }
        for row in rows {
            self.upsert(row, started);
        }
    }

    pub fn upsert(&mut self, mut row: DeviceRow, started: u64) {
        if let Some(e) = self.devices.get(&row.id) {
            if e.row.version > row.version {
                row.bucket = e.row.bucket;
                row.version = e.row.version;
            }
            if e.touched > started {
                row.booked = e.row.booked;
            }
            if e.row.pool_id != row.pool_id {
                if let Some(s) = self.pools.get_mut(&e.row.pool_id) {
                    s.remove(&row.id);
                }
            }
        }
        self.pools
            .entry(row.pool_id.clone())
            .or_default()
            .insert(row.id.clone());
        let (claimed, touched) = self
            .devices
            .get(&row.id)
            .map_or((0, 0), |e| (e.claimed, e.touched));
        self.devices.insert(
            row.id.clone(),
            Entry {
                row,
                claimed,
                touched,
            },
        );
    }

    pub fn remove(&mut self, id: &str) {
        if let Some(e) = self.devices.remove(id) {
            if let Some(s) = self.pools.get_mut(&e.row.pool_id) {
                s.remove(id);
                if s.is_empty() {
                    self.pools.remove(&e.row.pool_id);
                }
            }
        }
    }

    /// A `schedulable` StatusChanged: the bucket `to` at device `version`.
    pub fn apply_bucket(&mut self, id: &str, bucket: CapacityBucket, version: i64) -> BucketUpdate {
        match self.devices.get_mut(id) {
            None => BucketUpdate::Unknown,
            Some(e) if version <= e.row.version => BucketUpdate::Stale,
            Some(e) => {
                e.row.bucket = bucket;
                e.row.version = version;
                BucketUpdate::Applied
            }
        }
    }

    /// What a booking saw under the row lock: the truth at `version`.
    pub fn observed(
        &mut self,
        id: &str,
        version: i64,
        bucket: CapacityBucket,
        gpus: u32,
        booked: u32,
    ) {
        self.seq += 1;
        if let Some(e) = self.devices.get_mut(id) {
            if version >= e.row.version {
                e.row.version = version;
                e.row.bucket = bucket;
                e.row.gpus = gpus;
            }
            e.row.booked = booked;
            e.touched = self.seq;
        }
    }

    /// Booked atoms changed by this process (a booking or a release).
    pub fn add_booked(&mut self, id: &str, delta: i64) {
        self.seq += 1;
        if let Some(e) = self.devices.get_mut(id) {
            e.row.booked = (e.row.booked as i64 + delta).max(0) as u32;
            e.touched = self.seq;
        }
    }

    /// Schedulable devices of `pool` with free atoms, minus `excluded`.
    /// Devices with an in-flight booking of this process are left out
    /// unless `with_claimed`, and then count only what is left.
    pub fn candidates(
        &self,
        pool: &str,
        excluded: &HashSet<String>,
        with_claimed: bool,
    ) -> Vec<Candidate> {
        let Some(ids) = self.pools.get(pool) else {
            return vec![];
        };
        ids.iter()
            .filter(|id| !excluded.contains(*id))
            .filter_map(|id| self.devices.get(id))
            .filter(|e| e.row.bucket == CapacityBucket::Schedulable)
            .filter(|e| with_claimed || e.claimed == 0)
            .filter_map(|e| {
                let free = e
                    .row
                    .gpus
                    .saturating_sub(e.row.booked)
                    .saturating_sub(e.claimed);
                (free > 0).then(|| Candidate {
                    device_id: e.row.id.clone(),
                    rack: e.row.rack.clone(),
                    nvlink_domain: e.row.nvlink_domain.clone(),
                    total: e.row.gpus,
                    free,
                })
            })
            .collect()
    }

    pub fn claim(&mut self, takes: &[Take]) {
        for t in takes {
            if let Some(e) = self.devices.get_mut(&t.device_id) {
                e.claimed += t.atoms;
            }
        }
    }

    pub fn unclaim(&mut self, takes: &[Take]) {
        for t in takes {
            if let Some(e) = self.devices.get_mut(&t.device_id) {
                e.claimed = e.claimed.saturating_sub(t.atoms);
            }
        }
    }

    /// `None` when the view holds no device of the pool.
    pub fn capacity(&self, pool: &str) -> Option<Capacity> {
        let ids = self.pools.get(pool)?;
        Some(capacity_of(
            pool,
            ids.iter()
                .filter_map(|id| self.devices.get(id))
                .map(|e| &e.row),
        ))
    }
}

/// GPUs per bucket over the devices of one pool.
pub fn capacity_of<'a>(pool: &str, rows: impl Iterator<Item = &'a DeviceRow>) -> Capacity {
    let mut c = Capacity {
        pool_id: pool.to_string(),
        ..Default::default()
    };
    for r in rows {
        let gpus = r.gpus as i64;
        c.total += gpus;
        c.devices += 1;
        match r.bucket {
            CapacityBucket::Schedulable => {
                let booked = (r.booked as i64).min(gpus);
                c.schedulable_allocated += booked;
                c.schedulable_available += gpus - booked;
            }
            CapacityBucket::Excluded => c.excluded += gpus,
            CapacityBucket::Maintenance => c.maintenance += gpus,
            CapacityBucket::Provisioning => c.provisioning += gpus,
            CapacityBucket::Unreachable => c.unreachable += gpus,
            CapacityBucket::Unhealthy => c.unhealthy += gpus,
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, version: i64, bucket: CapacityBucket, booked: u32) -> DeviceRow {
        DeviceRow {
            id: id.into(),
            pool_id: "p1".into(),
            version,
            rack: None,
            nvlink_domain: None,
            gpus: 8,
            bucket,
            booked,
        }
    }

    #[test]
    fn events_are_version_gated_and_rebuilds_keep_newer_state() {
        let mut v = View::default();
        let s = v.seq();
        v.replace(None, vec![row("a", 3, CapacityBucket::Schedulable, 2)], s);
        assert_eq!(
            v.apply_bucket("a", CapacityBucket::Maintenance, 3),
            BucketUpdate::Stale
        );
        assert_eq!(
            v.apply_bucket("a", CapacityBucket::Maintenance, 4),
            BucketUpdate::Applied
        );
        assert_eq!(
            v.apply_bucket("b", CapacityBucket::Maintenance, 4),
            BucketUpdate::Unknown
        );
        // A rebuild that read version 3 does not undo the event at 4 ...
        let s = v.seq();
        v.add_booked("a", 1);
        v.replace(None, vec![row("a", 3, CapacityBucket::Schedulable, 2)], s);
        let a = v.device("a").unwrap();
        assert_eq!((a.bucket, a.version), (CapacityBucket::Maintenance, 4));
        // ... nor a booking made after it started.
        assert_eq!(a.booked, 3);
        let c = v.capacity("p1").unwrap();
        assert_eq!((c.maintenance, c.total, c.bucket_sum()), (8, 8, 8));
    }

    #[test]
    fn candidates_leave_out_claimed_devices_and_count_free_atoms() {
        let mut v = View::default();
        v.replace(
            None,
            vec![
                row("a", 1, CapacityBucket::Schedulable, 6),
                row("b", 1, CapacityBucket::Schedulable, 8),
                row("c", 1, CapacityBucket::Unreachable, 0),
                row("d", 1, CapacityBucket::Schedulable, 0),
            ],
            0,
        );
        let none = HashSet::new();
        let ids = |cs: Vec<Candidate>| {
            cs.into_iter()
                .map(|c| (c.device_id, c.free))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            ids(v.candidates("p1", &none, false)),
            vec![("a".into(), 2), ("d".into(), 8)]
        );
        v.claim(&[Take {
            device_id: "d".into(),
            atoms: 3,
        }]);
        assert_eq!(ids(v.candidates("p1", &none, false)), vec![("a".into(), 2)]);
        assert_eq!(
            ids(v.candidates("p1", &none, true)),
            vec![("a".into(), 2), ("d".into(), 5)]
        );
        let c = v.capacity("p1").unwrap();
        assert_eq!(c.schedulable_allocated, 14);
        assert_eq!(c.schedulable_available, 10);
        assert_eq!(c.unreachable, 8);
        assert_eq!(c.bucket_sum(), c.total);
    }
}
