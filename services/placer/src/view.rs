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
    /// Its key in the pool's best-fit index, when it is in it.
    indexed: Option<(bool, u32)>,
}

impl Entry {
    /// The best-fit key `(empty, free)`: schedulable, not being booked by
    /// this process, with free atoms.
    fn fit_key(&self) -> Option<(bool, u32)> {
        let free = self.row.gpus.saturating_sub(self.row.booked);
        (self.row.bucket == CapacityBucket::Schedulable && self.claimed == 0 && free > 0)
            .then_some((free == self.row.gpus, free))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketUpdate {
    Applied,
    /// Older than what the view holds (a redelivery or a replay).
    Stale,
    /// Not in the view: the caller loads the device.
    Unknown,
}

/// Per pool, the devices a single-device request can take, ordered the
/// way `packing` ranks them: partly used before empty, then fewest free
/// atoms, then id.
type FitIndex = BTreeSet<(bool, u32, String)>;

#[derive(Debug, Default)]
pub struct View {
    devices: HashMap<String, Entry>,
    pools: HashMap<String, BTreeSet<String>>,
    fit: HashMap<String, FitIndex>,
    seq: u64,
}

impl View {
    /// The sequence to pass to a rebuild started now.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Moves a device to where its current state puts it in the index.
    fn reindex(&mut self, id: &str) {
        let Some(e) = self.devices.get_mut(id) else {
            return;
        };
        let want = e.fit_key();
        if e.indexed == want {
            return;
        }
        let pool = &e.row.pool_id;
        if let Some((empty, free)) = e.indexed.take() {
            if let Some(ix) = self.fit.get_mut(pool) {
                ix.remove(&(empty, free, id.to_string()));
            }
        }
        if let Some((empty, free)) = want {
            self.fit
                .entry(pool.clone())
                .or_default()
                .insert((empty, free, id.to_string()));
        }
        e.indexed = want;
    }

    fn unindex(&mut self, id: &str) {
        if let Some(e) = self.devices.get_mut(id) {
            if let Some((empty, free)) = e.indexed.take() {
                if let Some(ix) = self.fit.get_mut(&e.row.pool_id) {
                    ix.remove(&(empty, free, id.to_string()));
                }
            }
        }
    }

    /// The best single device for `gpus` atoms in `pool` (what
    /// `packing::plan` picks first), without listing the pool: partly used
    /// devices first, then the fewest free atoms that fit.
    pub fn best_single(&self, pool: &str, gpus: u32, excluded: &HashSet<String>) -> Option<Take> {
        let ix = self.fit.get(pool)?;
        for empty in [false, true] {
            for (e, _, id) in ix.range((empty, gpus, String::new())..) {
                if *e != empty {
                    break;
                }
                if !excluded.contains(id) {
                    return Some(Take {
                        device_id: id.clone(),
                        atoms: gpus,
                    });
                }
            }
        }
        None
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    #[cfg(test)]
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
        self.unindex(&row.id);
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
        let id = row.id.clone();
        self.devices.insert(
            id.clone(),
            Entry {
                row,
                claimed,
                touched,
                indexed: None,
            },
        );
        self.reindex(&id);
    }

    pub fn remove(&mut self, id: &str) {
        self.unindex(id);
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
                self.reindex(id);
                BucketUpdate::Applied
            }
        }
    }

    /// What a booking saw under the row lock: the device's state at
    /// `version`. Booked atoms are not taken from it: a release of this
    /// process may land between the read and this call, so booked counts
    /// move only by this process's own deltas and by rebuilds.
    pub fn observed(&mut self, id: &str, version: i64, bucket: CapacityBucket, gpus: u32) {
        if let Some(e) = self.devices.get_mut(id) {
            if version >= e.row.version {
                e.row.version = version;
                e.row.bucket = bucket;
                e.row.gpus = gpus;
            }
        }
        self.reindex(id);
    }

    /// Booked atoms changed by this process (a booking or a release).
    pub fn add_booked(&mut self, id: &str, delta: i64) {
        self.seq += 1;
        if let Some(e) = self.devices.get_mut(id) {
            e.row.booked = (e.row.booked as i64 + delta).max(0) as u32;
            e.touched = self.seq;
        }
        self.reindex(id);
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
            self.reindex(&t.device_id);
        }
    }

    pub fn unclaim(&mut self, takes: &[Take]) {
        for t in takes {
            if let Some(e) = self.devices.get_mut(&t.device_id) {
                e.claimed = e.claimed.saturating_sub(t.atoms);
            }
            self.reindex(&t.device_id);
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

    proptest::proptest! {
        #[test]
        fn the_fit_index_picks_what_packing_picks(
            devices in proptest::collection::vec((0u8..3, 1u32..=8, 0u32..=8, 0u8..3), 1..40),
            ops in proptest::collection::vec((0usize..40, 0u8..4, 0u32..4), 0..40),
            gpus in 1u32..9,
            excluded in proptest::collection::btree_set(0usize..40, 0..4),
        ) {
            let buckets = [CapacityBucket::Schedulable, CapacityBucket::Schedulable, CapacityBucket::Maintenance];
            let mut v = View::default();
            let rows: Vec<DeviceRow> = devices.iter().enumerate().map(|(i, (pool, g, used, b))| DeviceRow {
                id: format!("d{i:02}"),
                pool_id: format!("p{}", pool % 2),
                version: 1,
                rack: None,
                nvlink_domain: None,
                gpus: *g,
                bucket: buckets[*b as usize],
                booked: (*used).min(*g),
            }).collect();
            v.replace(None, rows, 0);
            // Events, bookings, claims and rebuilds in any order.
            for (i, op, n) in ops {
                let id = format!("d{:02}", i % devices.len());
                match op {
                    0 => { v.apply_bucket(&id, buckets[(n % 3) as usize], 2 + n as i64); }
                    1 => v.add_booked(&id, n as i64 - 1),
                    2 => v.claim(&[Take { device_id: id, atoms: n }]),
                    _ => v.unclaim(&[Take { device_id: id, atoms: n }]),
                }
            }
            let excluded: HashSet<String> = excluded.iter().map(|i| format!("d{i:02}")).collect();
            for pool in ["p0", "p1"] {
                let req = crate::packing::Request { gpus, same_device: true, domain: crate::packing::Domain::Any, spread_racks: false };
                let by_packing = crate::packing::plan(&req, &v.candidates(pool, &excluded, false));
                let by_index = v.best_single(pool, gpus, &excluded).map(|t| vec![t]);
                proptest::prop_assert_eq!(by_index, by_packing);
            }
        }
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
