//! Impairment cordon and release (seed 002, "Impairment events"): the
//! operator API asks (`create_impairment`, `clear_impairment`); this
//! service records the event and each device in PostgreSQL and queues one
//! unit of work per device on `JOBS`, in one transaction. A device's work:
//!
//! - cordon: the hold through the hub's `impairment_hold` command (the hub
//!   quarantines and freezes the status), then the customer-ready trait
//!   removed from the device's Placement resource provider (its
//!   `infrastructure_ref`) at a site with Placement;
//! - release: the trait restored for a pre-hold `available` or `in_use`
//!   host, then the hold removed (the hub re-derives the status). "The
//!   release does not read the fabric isolation latches."
//!
//! Every step is idempotent: the hold command is a no-op for the event's
//! own hold, and a trait edit is written only when Placement's current
//! list (read with its generation) lacks it, so a worker killed anywhere
//! is resumed by the next delivery without repeating a write. Transient
//! failures retry with back-off (`retrying`, `release_retrying`); the
//! device fails with a code from the taxonomy once the tries are spent.

use std::sync::Arc;

use fleet_bus::Refusal;
use fleet_domain::failure::FailureCode;
use fleet_domain::impairment::{
    edit_traits, may_clear, restores_trait, EventDeviceStatus as D, EventStatus, PlacementAction,
};
use fleet_domain::OperationalStatus;
use fleet_hub_client::HubCallError;
use fleet_proto::{v1, ErrorCode};

use crate::activities::CallError;
use crate::impairment_store as store;
use crate::service::{all_found, db, decode};
use crate::storm::{self, Held};
use crate::Workflow;

/// Which half of an event a unit of work belongs to (its `JOBS` subject's
/// workflow token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Cordon,
    Release,
}

impl Phase {
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Cordon => "impairment_cordon",
            Phase::Release => "impairment_release",
        }
    }

    pub fn of(workflow: &str) -> Option<Phase> {
        [Phase::Cordon, Phase::Release]
            .into_iter()
            .find(|p| p.as_str() == workflow)
    }

    fn open(self, s: D) -> bool {
        match self {
            Phase::Cordon => s.cordon_open(),
            Phase::Release => s.release_open(),
        }
    }

    fn done(self) -> D {
        match self {
            Phase::Cordon => D::Cordoned,
            Phase::Release => D::Cleared,
        }
    }

    fn retrying(self) -> D {
        match self {
            Phase::Cordon => D::Retrying,
            Phase::Release => D::ReleaseRetrying,
        }
    }

    fn failed(self) -> D {
        match self {
            Phase::Cordon => D::Failed,
            Phase::Release => D::ReleaseFailed,
        }
    }
}

/// A hub call's failure as a step's.
fn hub_error(e: HubCallError) -> CallError {
    CallError::from_hub(e, FailureCode::ImpairmentHoldRefused)
}

impl Workflow {
    /// `create_impairment` and `clear_impairment`.
    pub(crate) async fn impairment_request(
        &self,
        verb: &str,
        payload: &[u8],
    ) -> Result<v1::ImpairmentAccepted, Refusal> {
        match verb {
            "create_impairment" => {
                let r = decode::<v1::CreateImpairmentRequest>(payload, "CreateImpairmentRequest")?;
                self.create_impairment(r).await
            }
            "confirm_impairment" => {
                let r = decode::<v1::ConfirmRequest>(payload, "ConfirmRequest")?;
                self.confirm_impairment(r).await
            }
            _ => {
                let r = decode::<v1::ClearImpairmentRequest>(payload, "ClearImpairmentRequest")?;
                self.clear_impairment(r).await
            }
        }
    }

    /// Records the event `accepted` and every device `pending`, and queues
    /// each device's cordon; refuses (writing nothing) an empty reason, an
    /// unknown device, or a device another event still holds.
    async fn create_impairment(
        &self,
        r: v1::CreateImpairmentRequest,
    ) -> Result<v1::ImpairmentAccepted, Refusal> {
        let reason = r.reason.trim();
        if reason.is_empty() {
            return Err(Refusal::invalid("reason is required"));
        }
        if r.created_by.trim().is_empty() {
            return Err(Refusal::invalid("created_by is required"));
        }
        let ids = self.device_ids(&r.device_ids)?;
        let event_id = format!("imp_{}", ulid::Ulid::new());
        let mut tx = self.deps.pool.begin().await.map_err(db)?;
        let found = store::lock_and_read(&mut tx, &ids).await.map_err(db)?;
        all_found(&ids, |i| found.iter().any(|f| f.0 == i))?;
        let busy = store::busy(&mut tx, &ids).await.map_err(db)?;
        if !busy.is_empty() {
            let list: Vec<String> = busy.iter().map(|(d, e)| format!("{d} ({e})")).collect();
            return Err(Refusal::new(
                ErrorCode::InvalidState,
                format!(
                    "{} device(s) already carry an impairment hold or belong to an event not released yet: {}",
                    busy.len(),
                    list.join(", ")
                ),
            ));
        }
        let ticket = Some(r.ticket_url.trim()).filter(|t| !t.is_empty());
        store::insert_event(
            &mut tx,
            &event_id,
            reason,
            ticket,
            r.created_by.trim(),
            &found,
        )
        .await
        .map_err(db)?;
        // The cordon takes hosts from their customers: the storm guard
        // counts it like a job that takes devices out of service.
        let trips = match self.config.storm_guard.policy() {
            Some(policy) => storm::guard(&mut tx, &policy, Held::ImpairmentEvent, &event_id, &ids)
                .await
                .map_err(db)?,
            None => vec![],
        };
        if trips.is_empty() {
            self.queue(&mut tx, Phase::Cordon.as_str(), &event_id, &ids)
                .await?;
        }
        self.commit(tx).await?;
        let storm_guard = (!trips.is_empty()).then(|| v1::StormGuard {
            awaiting_confirmation: true,
            trips: trips
                .iter()
                .map(|c| v1::StormTrip {
                    scope_kind: c.scope_kind.as_str().into(),
                    scope_id: c.scope_id.clone(),
                    in_service: c.in_service as i32,
                    taking: c.taking as i32,
                    in_window: c.in_window as i32,
                    limit: self
                        .config
                        .storm_guard
                        .policy()
                        .map_or(0, |p| p.limit(c.in_service) as i32),
                })
                .collect(),
            ..Default::default()
        });
        if storm_guard.is_some() {
            tracing::warn!(event_id = %event_id, devices = ids.len(), created_by = %r.created_by, "impairment event held by the storm guard: waiting for an operator's confirmation");
        } else {
            tracing::info!(event_id = %event_id, devices = ids.len(), created_by = %r.created_by, "impairment event accepted");
        }
        Ok(v1::ImpairmentAccepted {
            event_id,
            status: EventStatus::Accepted.as_str().into(),
            storm_guard,
        })
    }

    /// An operator confirms an event the storm guard holds: its cordon is
    /// queued. Confirming twice answers the same; an event the guard never
    /// held is refused.
    async fn confirm_impairment(
        &self,
        r: v1::ConfirmRequest,
    ) -> Result<v1::ImpairmentAccepted, Refusal> {
        let (id, by, reason) = crate::service::confirmation(&r)?;
        let (mut tx, (status, awaiting, confirmed)) = self
            .lock_for_confirm::<String>(Held::ImpairmentEvent, "status", id)
            .await?;
        let accepted = |storm_guard| v1::ImpairmentAccepted {
            event_id: id.to_string(),
            status: status.clone(),
            storm_guard,
        };
        if confirmed {
            return Ok(accepted(None));
        }
        if !awaiting {
            return Err(Refusal::new(
                ErrorCode::InvalidState,
                format!("impairment event {id} is not held by the storm guard"),
            ));
        }
        let ids = storm::admit_confirmed(&mut tx, Held::ImpairmentEvent, id, by, reason)
            .await
            .map_err(db)?;
        self.queue(&mut tx, Phase::Cordon.as_str(), id, &ids)
            .await?;
        self.commit(tx).await?;
        tracing::warn!(event_id = %id, confirmed_by = %by, reason = %reason, devices = ids.len(), "storm guard: impairment event confirmed by an operator");
        Ok(accepted(None))
    }

    /// Queues the release of every device not cleared yet.
    async fn clear_impairment(
        &self,
        r: v1::ClearImpairmentRequest,
    ) -> Result<v1::ImpairmentAccepted, Refusal> {
        let id = r.event_id.trim();
        let mut tx = self.deps.pool.begin().await.map_err(db)?;
        let (status, awaiting) = store::lock_event(&mut tx, id)
            .await
            .map_err(db)?
            .ok_or_else(|| {
                Refusal::new(
                    ErrorCode::NotFound,
                    format!("impairment event {id} not found"),
                )
            })?;
        if awaiting {
            return Err(Refusal::new(
                ErrorCode::InvalidState,
                format!("impairment event {id} is held by the storm guard: nothing was cordoned; confirm it first"),
            ));
        }
        let status = EventStatus::parse(&status)
            .map_err(|e| Refusal::unavailable("an impairment event has an unknown status", e))?;
        may_clear(status).map_err(|e| {
            Refusal::new(
                ErrorCode::InvalidState,
                format!("impairment event {id}: {e}"),
            )
        })?;
        let restoring: Vec<&str> = OperationalStatus::ALL
            .iter()
            .filter(|s| restores_trait(**s))
            .map(|s| s.as_str())
            .collect();
        let devices = store::queue_release(&mut tx, id, &restoring)
            .await
            .map_err(db)?;
        self.queue(&mut tx, Phase::Release.as_str(), id, &devices)
            .await?;
        self.commit(tx).await?;
        tracing::info!(event_id = %id, devices = devices.len(), requested_by = %r.requested_by, "impairment event release queued");
        Ok(v1::ImpairmentAccepted {
            event_id: id.to_string(),
            status: EventStatus::ReleasePending.as_str().into(),
            storm_guard: None,
        })
    }

    /// One device's cordon or release, to its phase's end. `Err` only when
    /// PostgreSQL is away (the message is delivered again).
    pub(crate) async fn impairment_device(
        self: &Arc<Self>,
        phase: Phase,
        event: &str,
        device_id: &str,
    ) -> Result<(), sqlx::Error> {
        let Some(mut row) = store::device(&self.deps.pool, event, device_id).await? else {
            tracing::warn!(
                event,
                device_id,
                "work for a device not in its impairment event; dropped"
            );
            return Ok(());
        };
        let status = D::parse(&row.status).unwrap_or(D::Failed);
        if !phase.open(status) {
            // Delivered again after it finished: settle, in case the
            // worker died between the two.
            store::settle(&self.deps.pool, event).await?;
            return Ok(());
        }
        let c = &self.config;
        let mut attempts = row.attempts.max(0) as u32;
        let outcome = loop {
            match self.impairment_step(phase, event, &row).await {
                Ok(()) => break Ok(()),
                Err(CallError::Permanent(code, message)) => break Err((code, message)),
                Err(CallError::Transient(code, message)) => {
                    attempts += 1;
                    if attempts >= c.max_attempts.max(1) {
                        break Err((code, format!("{message} (after {attempts} attempts)")));
                    }
                    store::retrying(
                        &self.deps.pool,
                        event,
                        device_id,
                        phase.retrying(),
                        attempts,
                        code.as_str(),
                        &message,
                    )
                    .await?;
                    let wait = self.backoff(attempts);
                    tracing::info!(event, device_id, phase = phase.as_str(), attempts, wait_ms = wait.as_millis() as u64, error = %message, "impairment step failed; retrying");
                    tokio::time::sleep(wait).await;
                    // Read the device again: a try decides on fresh facts.
                    if let Some(again) = store::device(&self.deps.pool, event, device_id).await? {
                        row = again;
                    }
                }
            }
        };
        let placement_done = row.placement_action.is_some();
        match &outcome {
            Ok(()) => {
                store::finish(
                    &self.deps.pool,
                    event,
                    device_id,
                    phase.done(),
                    placement_done.then_some("done"),
                    None,
                )
                .await?
            }
            Err((code, message)) => {
                tracing::warn!(
                    event,
                    device_id,
                    phase = phase.as_str(),
                    failure_code = code.as_str(),
                    message,
                    "impairment device failed"
                );
                let placement = matches!(
                    code,
                    FailureCode::PlacementUnavailable
                        | FailureCode::PlacementRequestRefused
                        | FailureCode::PlacementResourceProviderNotFound
                        | FailureCode::SiteNotConfigured
                )
                .then_some("failed");
                store::finish(
                    &self.deps.pool,
                    event,
                    device_id,
                    phase.failed(),
                    placement,
                    Some((code.as_str(), message.as_str())),
                )
                .await?
            }
        }
        let status = match &outcome {
            Ok(()) => phase.done(),
            Err(_) => phase.failed(),
        };
        self.metrics.finished(
            phase.as_str(),
            status.as_str(),
            outcome.as_ref().err().map(|e| e.0.as_str()).unwrap_or(""),
        );
        if let Some(s) = store::settle(&self.deps.pool, event).await? {
            tracing::info!(event, status = %s, "impairment event settled");
        }
        Ok(())
    }

    /// The device's whole phase once: every call is idempotent, so a try
    /// after a transient failure (or after a crash) repeats only what the
    /// systems do not show yet.
    async fn impairment_step(
        &self,
        phase: Phase,
        event: &str,
        row: &store::EventDevice,
    ) -> Result<(), CallError> {
        let actor = format!("workflow:{}:{event}", phase.as_str());
        let hold = |set: bool| self.holds.hold(&actor, event, &row.device_id, set);
        let action = row
            .placement_action
            .as_deref()
            .and_then(|a| PlacementAction::parse(a).ok());
        match phase {
            Phase::Cordon => {
                hold(true).await.map_err(hub_error)?;
                if action == Some(PlacementAction::RemoveCustomerReadyTrait) {
                    self.customer_ready(row, false).await?;
                }
            }
            Phase::Release => {
                // Another event's hold on the device (this one's cordon
                // failed before its hold, and a later event took it): its
                // trait is that event's to restore, not this one's.
                let held_by_other = row.impairment_hold.as_deref().is_some_and(|h| h != event);
                if action == Some(PlacementAction::RestoreCustomerReadyTrait)
                    && !held_by_other
                    && row.present
                {
                    self.customer_ready(row, true).await?;
                }
                match hold(false).await {
                    Ok(_) => {}
                    // No hold of this event on the device (it never got
                    // one, or the device is gone): nothing left to remove.
                    Err(HubCallError::Refused {
                        code: ErrorCode::InvalidState | ErrorCode::NotFound,
                        ..
                    }) => {}
                    Err(e) => return Err(hub_error(e)),
                }
            }
        }
        Ok(())
    }

    /// The customer-ready trait present (`true`) or absent on the device's
    /// resource provider: read with its generation, written only when the
    /// list differs, under that generation (a 409 is read again).
    async fn customer_ready(
        &self,
        device: &store::EventDevice,
        wanted: bool,
    ) -> Result<(), CallError> {
        let device_id = &device.device_id;
        let site_id = device
            .site_id
            .as_deref()
            .filter(|_| device.present)
            .ok_or_else(|| {
                CallError::Permanent(
                    FailureCode::ImpairmentHoldRefused,
                    format!("device {device_id} no longer exists"),
                )
            })?;
        let site = self.sites.get(site_id).ok_or_else(|| {
            CallError::Permanent(
                FailureCode::SiteNotConfigured,
                format!("workflow.sites.{site_id} is not configured (its Placement)"),
            )
        })?;
        let rp = device
            .infrastructure_ref
            .as_deref()
            .filter(|r| !r.trim().is_empty())
            .ok_or_else(|| {
                CallError::Permanent(
                    FailureCode::PlacementResourceProviderNotFound,
                    format!(
                        "device {device_id} has no infrastructure_ref (its resource provider uuid)"
                    ),
                )
            })?;
        let name = self.config.customer_ready_trait.trim();
        let current = site.traits(rp).await?;
        let Some(traits) = edit_traits(&current.traits, name, wanted) else {
            return Ok(());
        };
        site.put_traits(
            rp,
            &fleet_openstack::placement::Traits {
                traits,
                resource_provider_generation: current.resource_provider_generation,
            },
        )
        .await?;
        self.metrics.wrote(
            "placement",
            if wanted {
                "restore_trait"
            } else {
                "remove_trait"
            },
        );
        Ok(())
    }
}
