//! The placer's client, for the API (`POST /api/v1/allocations`,
//! `DELETE /api/v1/allocations/{id}`, `GET /api/v1/pools/{id}/capacity`)
//! and any other caller: core NATS request/reply with a timeout; no
//! answer in time is `UNAVAILABLE` (the API answers 503, never a guess).

use std::time::Duration;

use fleet_bus::{Caller, Subjects};
use fleet_proto::{v1, Message};

use crate::error::PlacerError;
use crate::model::{AllocateRequest, Allocation, Capacity};

#[derive(Clone)]
pub struct PlacerClient {
    bus: Caller,
}

impl PlacerClient {
    pub fn new(nats: async_nats::Client, subjects: Subjects, timeout: Duration) -> Self {
        PlacerClient {
            bus: Caller::new(nats, subjects, timeout),
        }
    }

    async fn call(
        &self,
        verb: &str,
        payload: Vec<u8>,
    ) -> Result<v1::placer_reply::Result, PlacerError> {
        let reply: v1::PlacerReply = self
            .bus
            .call("placer", self.bus.subjects().placer_cmd(verb), payload)
            .await?;
        if let Some(e) = &reply.error {
            return Err(PlacerError::from_proto(e));
        }
        reply
            .result
            .ok_or_else(|| PlacerError::Unavailable("empty placer reply".into()))
    }

    fn allocation(r: v1::placer_reply::Result) -> Result<Allocation, PlacerError> {
        match r {
            v1::placer_reply::Result::Allocation(a) => Ok(Allocation::from_proto(&a)),
            _ => Err(PlacerError::Unavailable(
                "placer answered with no allocation".into(),
            )),
        }
    }

    pub async fn allocate(&self, req: &AllocateRequest) -> Result<Allocation, PlacerError> {
        Self::allocation(
            self.call("allocate", req.to_proto().encode_to_vec())
                .await?,
        )
    }

    /// `tenant_id`: when set, another tenant's allocation is `NOT_FOUND`.
    pub async fn release(
        &self,
        allocation_id: &str,
        tenant_id: Option<&str>,
    ) -> Result<Allocation, PlacerError> {
        let r = v1::ReleaseRequest {
            allocation_id: allocation_id.to_string(),
            tenant_id: tenant_id.unwrap_or_default().to_string(),
        };
        Self::allocation(self.call("release", r.encode_to_vec()).await?)
    }

    pub async fn get(&self, allocation_id: &str) -> Result<Allocation, PlacerError> {
        let r = v1::GetAllocationRequest {
            allocation_id: allocation_id.to_string(),
        };
        Self::allocation(self.call("get", r.encode_to_vec()).await?)
    }

    pub async fn capacity(&self, pool_id: &str) -> Result<Capacity, PlacerError> {
        let r = v1::CapacityRequest {
            pool_id: pool_id.to_string(),
        };
        match self.call("capacity", r.encode_to_vec()).await? {
            v1::placer_reply::Result::Capacity(c) => Ok(Capacity::from_proto(&c)),
            _ => Err(PlacerError::Unavailable(
                "placer answered with no capacity".into(),
            )),
        }
    }
}
