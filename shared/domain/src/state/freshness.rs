//! Freshness bookkeeping: the last snapshot applied per source, the fast
//! paths that decide what a snapshot or a heartbeat does without loading the
//! device, and the per-source TTLs.

use super::*;

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
pub(super) const SETTLING: i64 = -1;

/// Whether `mirror` is the kind `source`'s snapshots carry (or none): only
/// then does [`mirrored_columns_equal`] cover what applying it writes, and
/// only then may the snapshot settle.
pub(super) fn mirror_is_the_sources(source: Source, mirror: &Mirror) -> bool {
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
pub(super) fn mirrored_columns_equal(source: Source, a: &DeviceRecord, b: &DeviceRecord) -> bool {
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
pub(super) fn owned_rows_equal(
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
