//! What the placer takes and answers, as Rust types (serde, for the API's
//! JSON) and their protobuf forms (for NATS request/reply).

use chrono::{DateTime, Utc};
use fleet_proto::{datetime, timestamp, v1};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The values of `Allocation.status`.
pub const ALLOCATION_STATUSES: &[&str] = &["active", "impaired", "released"];

pub fn allocation_status_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(ALLOCATION_STATUSES.iter().copied()))
        .build()
}

/// `POST /api/v1/allocations/`: what the placer books.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AllocateRequest {
    pub tenant_id: String,
    pub pool_id: String,
    /// GPUs to book, 1 to `placer.max_gpus_per_request`.
    pub gpus: u32,
    /// All GPUs on one device.
    #[serde(default)]
    pub same_device: bool,
    /// A domain name, or `"*"` for one NVLink domain, whichever fits.
    #[serde(default)]
    pub nvlink_domain: Option<String>,
    /// Idempotency key: a retry with the same key (and tenant) answers the
    /// first allocation.
    #[serde(default)]
    pub request_id: Option<String>,
}

/// One booked GPU: a GPU index on a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Atom {
    pub device_id: String,
    pub atom: u32,
}

/// An allocation as the placer stored it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Allocation {
    pub id: String,
    pub tenant_id: String,
    pub pool_id: String,
    pub gpus: u32,
    pub same_device: bool,
    pub nvlink_domain: Option<String>,
    #[schema(schema_with = allocation_status_schema)]
    pub status: String,
    pub atoms: Vec<Atom>,
    /// Why it was impaired (`operational:failed`, `connectivity:lost`).
    pub impaired_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub impaired_at: Option<DateTime<Utc>>,
    pub released_at: Option<DateTime<Utc>>,
    pub request_id: Option<String>,
}

/// GPUs of a pool per capacity bucket (`device.md`), as the placer's
/// capacity view has them; the buckets add up to `total`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Capacity {
    pub pool_id: String,
    pub total: i64,
    /// Schedulable and not booked.
    pub schedulable_available: i64,
    /// Schedulable and booked by an active or impaired allocation.
    pub schedulable_allocated: i64,
    pub excluded: i64,
    pub maintenance: i64,
    pub provisioning: i64,
    pub unreachable: i64,
    pub unhealthy: i64,
    /// Devices of the pool.
    pub devices: i64,
}

impl Capacity {
    /// The sum of the buckets (equals `total` by construction).
    pub fn bucket_sum(&self) -> i64 {
        self.schedulable_available
            + self.schedulable_allocated
            + self.excluded
            + self.maintenance
            + self.provisioning
            + self.unreachable
            + self.unhealthy
    }
}

fn opt(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

impl AllocateRequest {
    pub fn to_proto(&self) -> v1::AllocateRequest {
        v1::AllocateRequest {
            tenant_id: self.tenant_id.clone(),
            pool_id: self.pool_id.clone(),
            gpus: self.gpus.min(i32::MAX as u32) as i32,
            same_device: self.same_device,
            nvlink_domain: self.nvlink_domain.clone().unwrap_or_default(),
            request_id: self.request_id.clone().unwrap_or_default(),
        }
    }

    /// A negative `gpus` becomes 0, which validation refuses.
    pub fn from_proto(r: &v1::AllocateRequest) -> Self {
        AllocateRequest {
            tenant_id: r.tenant_id.clone(),
            pool_id: r.pool_id.clone(),
            gpus: r.gpus.max(0) as u32,
            same_device: r.same_device,
            nvlink_domain: opt(&r.nvlink_domain),
            request_id: opt(&r.request_id),
        }
    }
}

impl Allocation {
    pub fn to_proto(&self) -> v1::Allocation {
        v1::Allocation {
            id: self.id.clone(),
            tenant_id: self.tenant_id.clone(),
            pool_id: self.pool_id.clone(),
            gpus: self.gpus as i32,
            same_device: self.same_device,
            nvlink_domain: self.nvlink_domain.clone().unwrap_or_default(),
            status: self.status.clone(),
            atoms: self
                .atoms
                .iter()
                .map(|a| v1::AllocatedAtom {
                    device_id: a.device_id.clone(),
                    atom: a.atom as i32,
                })
                .collect(),
            impaired_reason: self.impaired_reason.clone().unwrap_or_default(),
            created_at: Some(timestamp(self.created_at)),
            impaired_at: self.impaired_at.map(timestamp),
            released_at: self.released_at.map(timestamp),
            request_id: self.request_id.clone().unwrap_or_default(),
        }
    }

    pub fn from_proto(a: &v1::Allocation) -> Self {
        Allocation {
            id: a.id.clone(),
            tenant_id: a.tenant_id.clone(),
            pool_id: a.pool_id.clone(),
            gpus: a.gpus.max(0) as u32,
            same_device: a.same_device,
            nvlink_domain: opt(&a.nvlink_domain),
            status: a.status.clone(),
            atoms: a
                .atoms
                .iter()
                .map(|x| Atom {
                    device_id: x.device_id.clone(),
                    atom: x.atom.max(0) as u32,
                })
                .collect(),
            impaired_reason: opt(&a.impaired_reason),
            created_at: datetime(a.created_at.as_ref()).unwrap_or_default(),
            impaired_at: datetime(a.impaired_at.as_ref()),
            released_at: datetime(a.released_at.as_ref()),
            request_id: opt(&a.request_id),
        }
    }
}

impl Capacity {
    pub fn to_proto(&self) -> v1::Capacity {
        v1::Capacity {
            pool_id: self.pool_id.clone(),
            total: self.total,
            schedulable_available: self.schedulable_available,
            schedulable_allocated: self.schedulable_allocated,
            excluded: self.excluded,
            maintenance: self.maintenance,
            provisioning: self.provisioning,
            unreachable: self.unreachable,
            unhealthy: self.unhealthy,
            devices: self.devices,
        }
    }

    pub fn from_proto(c: &v1::Capacity) -> Self {
        Capacity {
            pool_id: c.pool_id.clone(),
            total: c.total,
            schedulable_available: c.schedulable_available,
            schedulable_allocated: c.schedulable_allocated,
            excluded: c.excluded,
            maintenance: c.maintenance,
            provisioning: c.provisioning,
            unreachable: c.unreachable,
            unhealthy: c.unhealthy,
            devices: c.devices,
        }
    }
}
