//! Operator and workflow commands as pure edits of a device record. The hub
//! checks `version`, runs one of these, re-derives and writes the diff.

use chrono::{DateTime, Utc};

use crate::error::DomainError;
use crate::provision;
use crate::state::DeviceRecord;
use crate::vocab::{OperationalStatus, ProvisionState};

/// `CONFLICT` unless the caller read the current version.
pub fn check_version(record: &DeviceRecord, expected: i64) -> Result<(), DomainError> {
    if record.version != expected {
        return Err(DomainError::Conflict {
            expected,
            actual: record.version,
        });
    }
    Ok(())
}

fn non_empty(what: &str, value: &str) -> Result<String, DomainError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(DomainError::InvalidArgument(format!("{what} is required")));
    }
    Ok(v.to_string())
}

pub fn cordon(r: &mut DeviceRecord, reason: &str) -> Result<(), DomainError> {
    let reason = non_empty("reason", reason)?;
    r.cordoned = true;
    r.cordon_reason = Some(reason);
    Ok(())
}

pub fn uncordon(r: &mut DeviceRecord) {
    r.cordoned = false;
    r.cordon_reason = None;
    r.draining = false;
}

/// Cordon and mark draining: no new work, and `draining` joins
/// `no_schedule_reasons` until uncordoned.
pub fn drain(r: &mut DeviceRecord, reason: &str) -> Result<(), DomainError> {
    cordon(r, reason)?;
    r.draining = true;
    Ok(())
}

/// Taint keys are subject- and label-safe: `[a-z0-9][a-z0-9._/-]*`, at most 63.
pub fn taint(r: &mut DeviceRecord, key: &str, remove: bool) -> Result<(), DomainError> {
    let ok = !key.is_empty()
        && key.len() <= 63
        && key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._/-".contains(c));
    if !ok {
        return Err(DomainError::InvalidArgument(format!(
            "invalid taint key {key:?}"
        )));
    }
    if remove {
        r.taints.retain(|k| k != key);
    } else if !r.taints.iter().any(|k| k == key) {
        r.taints.push(key.to_string());
        r.taints.sort();
    }
    Ok(())
}

/// Seed 002, "Triage flag": `parent_ticket_url` is set once and left alone
/// across triage cycles.
pub fn triage(
    r: &mut DeviceRecord,
    in_triage: bool,
    ticket: Option<&str>,
    parent: Option<&str>,
    now: DateTime<Utc>,
) {
    if in_triage {
        if !r.in_triage {
            r.entered_triage_at = Some(now);
        }
        r.in_triage = true;
        if let Some(t) = ticket.filter(|t| !t.is_empty()) {
            r.triage_ticket_url = Some(t.to_string());
        }
        if r.parent_ticket_url.is_none() {
            r.parent_ticket_url = parent.filter(|p| !p.is_empty()).map(str::to_string);
        }
    } else {
        r.in_triage = false;
        r.entered_triage_at = None;
        r.triage_ticket_url = None;
    }
}

pub fn set_maintenance(r: &mut DeviceRecord, on: bool, reason: &str) -> Result<(), DomainError> {
    r.maintenance_reason = if on {
        Some(non_empty("reason", reason)?)
    } else {
        None
    };
    r.maintenance = on;
    Ok(())
}

/// A provision-state move through the table; entering `failed` records
/// `failed_from` and turns `maintenance` on in the same change.
pub fn provision_move(r: &mut DeviceRecord, to: ProvisionState) -> Result<(), DomainError> {
    let m = provision::check_move(r.provision_state, r.failed_from, to)?;
    r.provision_state = m.to;
    r.failed_from = m.failed_from;
    if m.maintenance_on {
        r.maintenance = true;
        r.maintenance_reason = Some(format!(
            "provision_state failed from {}",
            r.failed_from.map_or("", |s| s.as_str())
        ));
    }
    if to == ProvisionState::Retired {
        clear_enrollment_proof(r);
    }
    Ok(())
}

/// Acceptance passed: `adopting` -> `adopted`.
pub fn adopt(r: &mut DeviceRecord) -> Result<(), DomainError> {
    if r.provision_state != ProvisionState::Adopting {
        return Err(DomainError::InvalidState(format!(
            "adopt needs provision_state adopting, not {}",
            r.provision_state
        )));
    }
    provision_move(r, ProvisionState::Adopted)
}

/// Seed 002: "Immutable via ordinary API/model updates; promote-to-managed
/// is an explicit audited operation": an inventory-only device becomes
/// managed, with a reason. A managed device is refused (nothing to
/// promote), and so is an empty reason.
pub fn promote_to_managed(r: &mut DeviceRecord, reason: &str) -> Result<(), DomainError> {
    if reason.trim().is_empty() {
        return Err(DomainError::InvalidArgument(
            "promote_to_managed needs a reason (it is kept with the lifecycle row)".into(),
        ));
    }
    crate::limits::check_len("reason", reason, crate::limits::MAX_REASON)?;
    if !r.inventory_only {
        return Err(DomainError::InvalidState(format!(
            "device {} is not inventory-only: nothing to promote",
            r.id
        )));
    }
    r.inventory_only = false;
    Ok(())
}

/// Credentials of an earlier generation never work again; the session ends.
pub fn revoke_identity(r: &mut DeviceRecord) {
    r.identity_generation += 1;
    clear_enrollment_proof(r);
}

pub fn delete(r: &mut DeviceRecord) {
    r.identity_generation += 1;
    r.deleted = true;
    clear_enrollment_proof(r);
}

/// "The hub also clears proof atomically when a Device leaves
/// enrollment-managed scope."
pub fn clear_enrollment_proof(r: &mut DeviceRecord) {
    r.enrollment_validated_ref = None;
    r.enrollment_proof_source = None;
    r.enrollment_proof_at = None;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProofOutcome {
    /// A qualifying typed completion.
    Enrolled { result_ref: String, source: String },
    /// A started non-success, guarded by the identity the workflow pinned.
    Failed {
        pinned_infrastructure_ref: Option<String>,
    },
}

/// Seed 002, "Enrollment identity proof". Returns whether anything changed.
pub fn enrollment_proof(
    r: &mut DeviceRecord,
    outcome: ProofOutcome,
    now: DateTime<Utc>,
) -> Result<bool, DomainError> {
    match outcome {
        ProofOutcome::Enrolled { result_ref, source } => {
            let result_ref = non_empty("result_ref", &result_ref)?;
            // "A qualifying typed completion establishes enrolled proof for its result reference."
            let source = non_empty("proof_source", &source)?;
            r.enrollment_validated_ref = Some(result_ref);
            r.enrollment_proof_source = Some(source);
            r.enrollment_proof_at = Some(now);
            Ok(true)
        }
        ProofOutcome::Failed {
            pinned_infrastructure_ref,
        } => {
            // "failures without a trustworthy pinned identity make no proof write"
            let Some(pinned) = pinned_infrastructure_ref.filter(|p| !p.is_empty()) else {
                return Ok(false);
            };
            // "if the Device now carries a replacement infrastructure_ref, the write safely no-ops"
            if r.infrastructure_ref.as_deref() != Some(pinned.as_str()) {
                return Ok(false);
            }
            match r.enrollment_validated_ref.as_deref() {
                // "A device without prior proof remains explicitly at none."
                None => Ok(false),
                // "if matching enrolled ... proof already exists, the earlier validation is preserved"
                Some(v) if v == pinned => Ok(false),
                // "Stale proof metadata is cleared when the operated identity still matches."
                Some(_) => {
                    clear_enrollment_proof(r);
                    Ok(true)
                }
            }
        }
    }
}

/// The eligibility comparison: proof exists for the current identity.
pub fn has_enrollment_proof(r: &DeviceRecord) -> bool {
    matches!((&r.enrollment_validated_ref, &r.infrastructure_ref), (Some(v), Some(i)) if !v.is_empty() && v == i)
}

/// Impairment events: setting the hold quarantines and freezes; clearing it
/// lets the next derivation restore the status.
pub fn impairment_hold(r: &mut DeviceRecord, event_id: &str, set: bool) -> Result<(), DomainError> {
    let event_id = non_empty("event_id", event_id)?;
    if set {
        if let Some(other) = r.impairment_hold.as_deref().filter(|h| *h != event_id) {
            return Err(DomainError::InvalidState(format!(
                "device already carries impairment event {other}'s hold"
            )));
        }
        r.impairment_hold = Some(event_id);
        r.operational_status = OperationalStatus::Quarantine;
    } else if r.impairment_hold.as_deref() == Some(event_id.as_str()) {
        r.impairment_hold = None;
    } else {
        return Err(DomainError::InvalidState(format!(
            "device holds no impairment event {event_id}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> DeviceRecord {
        let mut r = DeviceRecord::new("dev_1".into(), "s1".into(), "n1".into());
        r.infrastructure_ref = Some("uuid-1".into());
        r
    }

    #[test]
    fn enrollment_proof_rules_of_seed_002() {
        let now = Utc::now();
        let mut r = rec();
        // A started non-success pinned to `pinned`: whether it changed anything.
        let failed = |r: &mut DeviceRecord, pinned: Option<&str>| {
            let outcome = ProofOutcome::Failed {
                pinned_infrastructure_ref: pinned.map(str::to_string),
            };
            enrollment_proof(r, outcome, now).unwrap()
        };
        // "A device without prior proof remains explicitly at none."
        assert!(!failed(&mut r, Some("uuid-1")));
        assert_eq!(r.enrollment_validated_ref, None);
        enrollment_proof(
            &mut r,
            ProofOutcome::Enrolled {
                result_ref: "uuid-1".into(),
                source: "enrollment".into(),
            },
            now,
        )
        .unwrap();
        assert!(has_enrollment_proof(&r));
        // "if matching enrolled ... proof already exists, the earlier validation is preserved"
        assert!(!failed(&mut r, Some("uuid-1")));
        assert!(has_enrollment_proof(&r));
        // "if the Device now carries a replacement infrastructure_ref, the write safely no-ops"
        assert!(!failed(&mut r, Some("uuid-0")));
        // A replacement identity makes the proof stale for eligibility ...
        r.infrastructure_ref = Some("uuid-2".into());
        assert!(!has_enrollment_proof(&r));
        // ... and "Stale proof metadata is cleared when the operated identity still matches."
        assert!(failed(&mut r, Some("uuid-2")));
        assert_eq!(r.enrollment_validated_ref, None);
        // "failures without a trustworthy pinned identity ... make no proof write"
        assert!(!failed(&mut r, None));
    }

    #[test]
    fn triage_keeps_the_parent_ticket() {
        let now = Utc::now();
        let mut r = rec();
        triage(&mut r, true, Some("t/1"), Some("p/1"), now);
        triage(&mut r, false, None, None, now);
        triage(&mut r, true, Some("t/2"), Some("p/2"), now);
        assert_eq!(r.parent_ticket_url.as_deref(), Some("p/1"));
        assert_eq!(r.triage_ticket_url.as_deref(), Some("t/2"));
    }

    #[test]
    fn version_and_inputs_are_checked() {
        let mut r = rec();
        assert!(matches!(
            check_version(&r, 7),
            Err(DomainError::Conflict {
                expected: 7,
                actual: 1
            })
        ));
        assert!(cordon(&mut r, "  ").is_err());
        assert!(!r.cordoned, "bad input changes nothing");
        assert!(taint(&mut r, "Bad Key", false).is_err());
        assert!(adopt(&mut r).is_ok());
        assert!(matches!(adopt(&mut r), Err(DomainError::InvalidState(_))));
    }
}
