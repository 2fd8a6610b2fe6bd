//! The condition catalogue of `spec/conditions.md`: who owns each type, what
//! it feeds, whether it is durable, and which value is the problem.

use crate::derivation::reasons::HANDOVER_BREACH;
use crate::error::DomainError;
use crate::vocab::{vocab, ConditionOf, ConditionStatus, Source};

vocab!(ConditionType, "condition type" {
    IronicProvisionHealthy => "IronicProvisionHealthy",
    IronicMaintenance => "IronicMaintenance",
    IronicAvailable => "IronicAvailable",
    InstanceAllocated => "InstanceAllocated",
    CustomerReady => "CustomerReady",
    InMaintenancePool => "InMaintenancePool",
    SlurmRegistered => "SlurmRegistered",
    SlurmNodeHealthy => "SlurmNodeHealthy",
    ChassisHealth => "ChassisHealth",
    PowerSupplyHealth => "PowerSupplyHealth",
    FanHealth => "FanHealth",
    ThermalHealth => "ThermalHealth",
    MemoryHealth => "MemoryHealth",
    StorageHealth => "StorageHealth",
    ProcessorHealth => "ProcessorHealth",
    NetworkAdapterHealth => "NetworkAdapterHealth",
    GpuHealth => "GpuHealth",
    FpgaHealth => "FpgaHealth",
    GpuCountMismatch => "GpuCountMismatch",
    CustodyIntent => "CustodyIntent",
    FrontendPortsInCustomerVrf => "FrontendPortsInCustomerVrf",
    NvLinkGpusInRepairPartition => "NvLinkGpusInRepairPartition",
    BackendPortsInMaintenanceVrf => "BackendPortsInMaintenanceVrf",
    FrontendPortsObservedInCustomerVrf => "FrontendPortsObservedInCustomerVrf",
    BackendPortsObservedInMaintenanceVrf => "BackendPortsObservedInMaintenanceVrf",
    NvLinkGpusObservedInRepairPartition => "NvLinkGpusObservedInRepairPartition",
});

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Refreshed by every snapshot of its source; expires with source silence.
    Observation,
    /// Changes only by explicit writes: no TTL, no source-silence expiry.
    Durable,
}

/// One row of the catalogue table.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub condition_type: ConditionType,
    pub owners: &'static [Source],
    pub condition_of: ConditionOf,
    pub kind: Kind,
    /// The values that are the problem (`bad when`); empty for `-`.
    pub bad_when: &'static [ConditionStatus],
    /// The catalogue effect NoSchedule: in its bad state the type name joins
    /// `no_schedule_reasons`.
    pub no_schedule: bool,
}

use ConditionStatus::{False as F, True as T, Unknown as U};
use ConditionType as C;

const OPENSTACK: &[Source] = &[Source::Openstack];
const SLURM: &[Source] = &[Source::Slurm];
const HEALTH: &[Source] = &[Source::HealthStatus];

const fn obs(
    t: ConditionType,
    owners: &'static [Source],
    of: ConditionOf,
    bad: &'static [ConditionStatus],
) -> Entry {
    Entry {
        condition_type: t,
        owners,
        condition_of: of,
        kind: Kind::Observation,
        bad_when: bad,
        no_schedule: false,
    }
}

const fn durable(
    t: ConditionType,
    owners: &'static [Source],
    bad: &'static [ConditionStatus],
) -> Entry {
    Entry {
        condition_type: t,
        owners,
        condition_of: ConditionOf::None,
        kind: Kind::Durable,
        bad_when: bad,
        no_schedule: false,
    }
}

pub const CATALOGUE: &[Entry] = &[
    obs(
        C::IronicProvisionHealthy,
        OPENSTACK,
        ConditionOf::Operational,
        &[F],
    ),
    obs(
        C::IronicMaintenance,
        OPENSTACK,
        ConditionOf::Operational,
        &[T],
    ),
    obs(C::IronicAvailable, OPENSTACK, ConditionOf::Operational, &[]),
    obs(
        C::InstanceAllocated,
        OPENSTACK,
        ConditionOf::Operational,
        &[],
    ),
    obs(C::CustomerReady, OPENSTACK, ConditionOf::Operational, &[]),
    obs(
        C::InMaintenancePool,
        OPENSTACK,
        ConditionOf::Operational,
        &[],
    ),
    obs(C::SlurmRegistered, SLURM, ConditionOf::Operational, &[]),
    obs(C::SlurmNodeHealthy, SLURM, ConditionOf::Operational, &[F]),
    obs(C::ChassisHealth, HEALTH, ConditionOf::Health, &[F]),
    obs(C::PowerSupplyHealth, HEALTH, ConditionOf::Health, &[F]),
    obs(C::FanHealth, HEALTH, ConditionOf::Health, &[F]),
    obs(C::ThermalHealth, HEALTH, ConditionOf::Health, &[F]),
    obs(C::MemoryHealth, HEALTH, ConditionOf::Health, &[F]),
    obs(C::StorageHealth, HEALTH, ConditionOf::Health, &[F]),
    obs(C::ProcessorHealth, HEALTH, ConditionOf::Health, &[F]),
    obs(C::NetworkAdapterHealth, HEALTH, ConditionOf::Health, &[F]),
    obs(C::GpuHealth, HEALTH, ConditionOf::Health, &[F]),
    obs(C::FpgaHealth, HEALTH, ConditionOf::Health, &[F]),
    Entry {
        condition_type: C::GpuCountMismatch,
        owners: &[Source::Gateway],
        condition_of: ConditionOf::None,
        kind: Kind::Observation,
        bad_when: &[T],
        no_schedule: true,
    },
    durable(C::CustodyIntent, &[Source::Borneo], &[]),
    // Borneo may write it only as the hub-ordered custody-entry write.
    durable(
        C::FrontendPortsInCustomerVrf,
        &[Source::FrontendFabric, Source::Borneo],
        &[T, U],
    ),
    durable(
        C::NvLinkGpusInRepairPartition,
        &[Source::NvlinkFabric],
        &[T, U],
    ),
    durable(
        C::BackendPortsInMaintenanceVrf,
        &[Source::BackendFabric],
        &[T, U],
    ),
    obs(
        C::FrontendPortsObservedInCustomerVrf,
        &[Source::FrontendFabric],
        ConditionOf::None,
        &[],
    ),
    obs(
        C::BackendPortsObservedInMaintenanceVrf,
        &[Source::BackendFabric],
        ConditionOf::None,
        &[],
    ),
    obs(
        C::NvLinkGpusObservedInRepairPartition,
        &[Source::NvlinkFabric],
        ConditionOf::None,
        &[],
    ),
];

/// The reasons a latch is written with (`conditions.md`, "Latch reasons"),
/// each with the status it carries. `HandoverBreach` (Unknown) is the hub's
/// own custody-entry write of the front-end latch, not among them.
/// `FlipInProgress` (Unknown) is written before the first switch write of a
/// front-end flip, an addition to the seed, which names the
/// Unknown-before-write only for the other two.
const FRONTEND_LATCH_REASONS: &[(&str, ConditionStatus)] = &[
    ("CustomerVrfFlipVerified", T),
    ("IsolateFlipVerified", F),
    ("FlipInProgress", U),
];
const BACKEND_LATCH_REASONS: &[(&str, ConditionStatus)] = &[
    ("IsolateVerified", T),
    ("ReturnVerified", F),
    ("ManualIsolation", T),
    ("ManualReturn", F),
    ("ApplyInProgress", U),
];
const NVLINK_LATCH_REASONS: &[(&str, ConditionStatus)] = &[
    ("MoveVerified", T),
    ("ReturnVerified", F),
    ("MoveInProgress", U),
];

impl ConditionType {
    /// A latch's reasons with their statuses; `None` for a type whose
    /// reasons are its source's to choose.
    pub fn latch_reasons(self) -> Option<&'static [(&'static str, ConditionStatus)]> {
        match self {
            C::FrontendPortsInCustomerVrf => Some(FRONTEND_LATCH_REASONS),
            C::BackendPortsInMaintenanceVrf => Some(BACKEND_LATCH_REASONS),
            C::NvLinkGpusInRepairPartition => Some(NVLINK_LATCH_REASONS),
            _ => None,
        }
    }

    /// Refuses a latch write whose reason is not one of the latch's, or
    /// whose status is not the one its reason carries (`hub_ordered`: the
    /// custody-entry write, `HandoverBreach` Unknown).
    pub fn check_latch_reason(
        self,
        status: ConditionStatus,
        reason: &str,
        hub_ordered: bool,
    ) -> Result<(), DomainError> {
        let Some(reasons) = self.latch_reasons() else {
            return Ok(());
        };
        let allowed = if hub_ordered {
            reason == HANDOVER_BREACH && status == U
        } else {
            reasons.iter().any(|(r, s)| *r == reason && *s == status)
        };
        if allowed {
            return Ok(());
        }
        let list: Vec<String> = reasons
            .iter()
            .map(|(r, s)| format!("{r} ({})", s.as_str()))
            .collect();
        Err(DomainError::InvalidArgument(format!(
            "{self} is a latch: {status} with reason {reason:?} is not one of its writes ({}{})",
            list.join(", "),
            if self == C::FrontendPortsInCustomerVrf {
                "; HandoverBreach (Unknown) is the hub's own custody-entry write"
            } else {
                ""
            }
        )))
    }

    pub fn entry(self) -> &'static Entry {
        // The catalogue lists every variant in declaration order.
        &CATALOGUE[self as usize]
    }

    pub fn is_durable(self) -> bool {
        self.entry().kind == Kind::Durable
    }

    pub fn condition_of(self) -> ConditionOf {
        self.entry().condition_of
    }

    pub fn is_bad(self, status: ConditionStatus) -> bool {
        self.entry().bad_when.contains(&status)
    }

    /// Parses a type name; an unknown one is its own typed error.
    pub fn lookup(name: &str) -> Result<Self, DomainError> {
        Self::parse(name).map_err(|_| DomainError::UnknownConditionType(name.to_string()))
    }

    /// `FORBIDDEN_SOURCE` unless `source` owns this type.
    pub fn check_owner(self, source: Source) -> Result<(), DomainError> {
        if self.entry().owners.contains(&source) {
            Ok(())
        } else {
            Err(DomainError::ForbiddenSource {
                source_name: source.as_str().to_string(),
                condition_type: self.as_str().to_string(),
            })
        }
    }
}

/// The observation types a source owns: what a snapshot from it must carry
/// (the rest are written `Unknown`/`NotReported`).
pub fn observation_types_of(source: Source) -> impl Iterator<Item = ConditionType> {
    CATALOGUE
        .iter()
        .filter(move |e| e.kind == Kind::Observation && e.owners.contains(&source))
        .map(|e| e.condition_type)
}

/// The ten health rows every host carries every cycle.
pub const HEALTH_TYPES: [ConditionType; 10] = [
    C::ChassisHealth,
    C::PowerSupplyHealth,
    C::FanHealth,
    C::ThermalHealth,
    C::MemoryHealth,
    C::StorageHealth,
    C::ProcessorHealth,
    C::NetworkAdapterHealth,
    C::GpuHealth,
    C::FpgaHealth,
];

#[cfg(test)]
mod tests {
    /// `conditions.md`, "Latch reasons": front-end `CustomerVrfFlipVerified`
    /// (True), `IsolateFlipVerified` (False), `HandoverBreach` (Unknown,
    /// custody entry); back-end `IsolateVerified`, `ReturnVerified`,
    /// `ManualIsolation`, `ManualReturn`, `ApplyInProgress` (Unknown); NVLink
    /// `MoveVerified`, `ReturnVerified`, `MoveInProgress` (Unknown).
    #[test]
    fn latch_writes_carry_a_latch_reason_with_its_status() {
        let ok = |t: ConditionType, s: ConditionStatus, r: &str| {
            t.check_latch_reason(s, r, false).is_ok()
        };
        assert!(ok(
            C::FrontendPortsInCustomerVrf,
            T,
            "CustomerVrfFlipVerified"
        ));
        assert!(ok(C::FrontendPortsInCustomerVrf, F, "IsolateFlipVerified"));
        assert!(ok(C::BackendPortsInMaintenanceVrf, T, "ManualIsolation"));
        assert!(ok(C::BackendPortsInMaintenanceVrf, U, "ApplyInProgress"));
        assert!(ok(C::NvLinkGpusInRepairPartition, F, "ReturnVerified"));
        // Not a reason of the latch, the wrong status for it, none at all.
        assert!(!ok(C::FrontendPortsInCustomerVrf, T, "NotARealReason"));
        assert!(!ok(C::FrontendPortsInCustomerVrf, T, ""));
        assert!(!ok(
            C::FrontendPortsInCustomerVrf,
            F,
            "CustomerVrfFlipVerified"
        ));
        assert!(!ok(C::NvLinkGpusInRepairPartition, T, "IsolateVerified"));
        // HandoverBreach is the hub's custody-entry write alone.
        assert!(!ok(C::FrontendPortsInCustomerVrf, U, "HandoverBreach"));
        assert!(C::FrontendPortsInCustomerVrf
            .check_latch_reason(U, "HandoverBreach", true)
            .is_ok());
        // Other types' reasons are their sources' to choose.
        assert!(ok(C::IronicProvisionHealthy, F, "AnythingTheSourceSays"));
    }

    use super::*;

    #[test]
    fn catalogue_is_indexed_by_variant() {
        assert_eq!(CATALOGUE.len(), ConditionType::ALL.len());
        for t in ConditionType::ALL {
            assert_eq!(t.entry().condition_type, *t);
        }
    }

    #[test]
    fn ownership_follows_the_owner_column() {
        assert!(C::IronicMaintenance.check_owner(Source::Openstack).is_ok());
        assert!(matches!(
            C::IronicMaintenance.check_owner(Source::Slurm),
            Err(DomainError::ForbiddenSource { .. })
        ));
        // "frontend-fabric, borneo (custody entry only, hub-ordered)"
        assert!(C::FrontendPortsInCustomerVrf
            .check_owner(Source::Borneo)
            .is_ok());
        assert_eq!(observation_types_of(Source::HealthStatus).count(), 10);
        assert_eq!(observation_types_of(Source::Openstack).count(), 6);
        assert_eq!(observation_types_of(Source::Slurm).count(), 2);
        assert_eq!(observation_types_of(Source::Borneo).count(), 0);
    }

    #[test]
    fn durable_latches_are_never_decisive_kinds() {
        for t in [
            C::CustodyIntent,
            C::FrontendPortsInCustomerVrf,
            C::NvLinkGpusInRepairPartition,
            C::BackendPortsInMaintenanceVrf,
        ] {
            assert!(t.is_durable());
            assert_eq!(t.condition_of(), ConditionOf::None);
        }
    }
}
