//! Every closed vocabulary of `spec/device.md` and `spec/conditions.md`, with
//! the string forms exactly as the spec writes them. The same strings are
//! stored in PostgreSQL, carried in protobuf and served by the API.

#[cfg(test)]
use crate::error::DomainError;

macro_rules! vocab {
    ($(#[$meta:meta])* $name:ident, $what:literal { $($variant:ident => $s:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $s),+ }
            }

            /// Parses the spec's string form; anything else is `INVALID_ARGUMENT`.
            pub fn parse(s: &str) -> Result<Self, $crate::error::DomainError> {
                match s {
                    $($s => Ok($name::$variant),)+
                    other => Err($crate::error::DomainError::InvalidArgument(format!(
                        concat!("unknown ", $what, " {:?}"), other
                    ))),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::error::DomainError;
            fn from_str(s: &str) -> Result<Self, $crate::error::DomainError> { Self::parse(s) }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}
pub(crate) use vocab;

vocab!(ProvisionState, "provision_state" {
    Adopting => "adopting", Adopted => "adopted", Enrolling => "enrolling",
    Inspecting => "inspecting", Commissioning => "commissioning", Ready => "ready",
    Deploying => "deploying", Deployed => "deployed", Releasing => "releasing",
    Rescue => "rescue", Failed => "failed", Retiring => "retiring", Retired => "retired",
});

vocab!(Power, "power" { On => "on", Off => "off", Unknown => "unknown" });

vocab!(Connectivity, "connectivity" {
    Connected => "connected", Disconnected => "disconnected",
    Unreachable => "unreachable", Lost => "lost",
});

vocab!(InventoryStatus, "inventory_status" {
    Planned => "planned", Staged => "staged", Active => "active", Offline => "offline",
    Failed => "failed", Inventory => "inventory", Decommissioning => "decommissioning",
    Rma => "rma", Unknown => "unknown",
});

vocab!(OperationalStatus, "operational_status" {
    Unknown => "unknown", Available => "available", InUse => "in_use",
    Validation => "validation", Quarantine => "quarantine", Failed => "failed",
    Delegated => "delegated", PendingHandover => "pending_handover", Drained => "drained",
});

impl OperationalStatus {
    /// Seed 002: "delegated, pending_handover, and drained are frozen while
    /// Google owns the custody projection".
    pub fn is_custody_hold(self) -> bool {
        matches!(
            self,
            Self::Delegated | Self::PendingHandover | Self::Drained
        )
    }
}

vocab!(HealthStatus, "health_status" {
    Unknown => "unknown", Healthy => "healthy", Degraded => "degraded", Critical => "critical",
});

vocab!(DeviceClass, "device_class" {
    GpuCompute => "gpu_compute", CpuBaremetal => "cpu_baremetal",
    CpuHypervisor => "cpu_hypervisor", Switch => "switch",
});

vocab!(Role, "role" { Host => "host", Dedicated => "dedicated", Site => "site", Unassigned => "unassigned" });

vocab!(Trust, "trust" {
    Platform => "platform", TenantOwned => "tenant-owned", TenantControlled => "tenant-controlled",
});

vocab!(ConditionStatus, "condition status" { True => "True", False => "False", Unknown => "Unknown" });

vocab!(ConditionOf, "condition_of" { Operational => "operational", Health => "health", None => "none" });

vocab!(
    /// Who asserts a condition (`spec/conditions.md`, the owner column).
    Source, "source" {
    Netbox => "netbox", Openstack => "openstack", Slurm => "slurm",
    HealthStatus => "health-status", Borneo => "borneo",
    FrontendFabric => "frontend-fabric", BackendFabric => "backend-fabric",
    NvlinkFabric => "nvlink-fabric", Gateway => "gateway",
});

impl Source {
    /// The subject token of a source (`fleet.obs.<source>...`): the spec's
    /// source names are already subject-safe.
    pub fn subject_token(self) -> &'static str {
        self.as_str()
    }
}

vocab!(
    /// The `<axis>` of `fleet.status.<axis>.<site>.<device>` and the `kind`
    /// of a lifecycle event row.
    Axis, "axis" {
    Inventory => "inventory", Operational => "operational", Health => "health",
    Provision => "provision", Maintenance => "maintenance", Cordoned => "cordoned",
    Power => "power", Connectivity => "connectivity", Schedulable => "schedulable",
    Triage => "triage", Custody => "custody", Enrollment => "enrollment",
    InventoryOnly => "inventory_only", Serial => "serial", Rack => "rack", NetboxId => "netbox_id",
    Conditions => "conditions",
    // A device's birth: one event with every axis's first value (never a
    // lifecycle kind: a birth has a row per axis).
    Device => "device",
});

vocab!(
    /// The capacity bucket a device's GPUs are reported in (`device.md`,
    /// "Schedulable").
    CapacityBucket, "capacity bucket" {
    Schedulable => "schedulable", Excluded => "excluded", Maintenance => "maintenance",
    Provisioning => "provisioning", Unreachable => "unreachable", Unhealthy => "unhealthy",
});

vocab!(
    /// Borneo custody states: the hub stores and acts on these and refuses any
    /// other (`INVALID_ARGUMENT`).
    CustodyState, "custody state" {
    GoogleOwned => "GOOGLE_OWNED", PartnerOwned => "PARTNER_OWNED", Drained => "DRAINED",
});

vocab!(ChassisHealth, "chassis_health composite" { Ok => "Ok", Warning => "Warning", Critical => "Critical" });

vocab!(
    /// The external keys a connector can name a device by.
    KeyKind, "device key kind" {
    DeviceId => "device_id", NetboxId => "netbox_id", Name => "name", Serial => "serial",
    InfrastructureRef => "infrastructure_ref", BmcAddress => "bmc_address",
});

vocab!(ConnectivityEvent, "connectivity event" { Opened => "opened", Heartbeat => "heartbeat", Closed => "closed" });

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_forms_round_trip() {
        for s in OperationalStatus::ALL {
            assert_eq!(OperationalStatus::parse(s.as_str()).unwrap(), *s);
        }
        assert_eq!(Trust::TenantOwned.as_str(), "tenant-owned");
        assert_eq!(Source::HealthStatus.as_str(), "health-status");
        assert!(matches!(
            ProvisionState::parse("Deployed"),
            Err(DomainError::InvalidArgument(_))
        ));
    }
}
