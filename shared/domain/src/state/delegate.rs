//! Entering `delegated`: Borneo's custody entry and Release's Metal
//! hand-back share the front-end latch rule; the hand-back's own checks,
//! re-run inside the hub's transaction with the device row locked.

use super::*;

/// Release's Metal hand-back as the workflow asks for it (seed 002,
/// "Inventory status": "writing operational_status=delegated ... refuse[s]
/// a missing or non-active device").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delegation<'a> {
    /// The identity the workflow pinned: it must still be the device's.
    pub pinned_infrastructure_ref: &'a str,
    /// What the activity read of NetBox immediately before: `active`.
    pub netbox_status: &'a str,
}

impl DeviceState {
    /// The custody-entry rule of the front-end latch: "On an actual
    /// transition into delegated" the latch is written Unknown
    /// (HandoverBreach) unless verified True; "Only missing-row repair for
    /// a device already in delegated" otherwise. Returns whether a breach
    /// was recorded.
    pub(super) fn custody_entry_latch(&mut self, entering: bool, now: DateTime<Utc>) -> bool {
        let latch = self
            .conditions
            .get(&ConditionType::FrontendPortsInCustomerVrf)
            .map(|r| r.status);
        let write = match latch {
            None => true,
            Some(status) => entering && status != ConditionStatus::True,
        };
        if !write {
            return false;
        }
        let changed = self.put_condition(
            ConditionType::FrontendPortsInCustomerVrf,
            ConditionStatus::Unknown,
            reasons::HANDOVER_BREACH,
            "custody entry with no verified front-end flip on record",
            Source::Borneo,
            now,
            now,
            true,
        );
        changed || latch.is_none()
    }

    /// Release's Metal hand-back: `operational_status = delegated`, or a
    /// typed refusal that changes nothing. Already `delegated` is a no-op
    /// (a retried hand-back). The front-end latch follows the custody-entry
    /// rule, so Borneo's later `GOOGLE_OWNED` does not write it twice.
    pub fn delegate(
        &mut self,
        d: Delegation<'_>,
        now: DateTime<Utc>,
    ) -> Result<Notes, DomainError> {
        let refuse = |m: String| Err(DomainError::InvalidState(m));
        let r = &self.record;
        if r.inventory_only {
            return refuse("the device is inventory-only: it is never handed to a customer".into());
        }
        if d.pinned_infrastructure_ref.trim().is_empty()
            || r.infrastructure_ref.as_deref() != Some(d.pinned_infrastructure_ref)
        {
            return refuse(format!(
                "the device's infrastructure_ref is {:?}, not the pinned {:?}",
                r.infrastructure_ref.as_deref().unwrap_or(""),
                d.pinned_infrastructure_ref
            ));
        }
        if d.netbox_status != "active" {
            return refuse(format!(
                "NetBox reads the device {:?}, not active",
                d.netbox_status
            ));
        }
        if r.operational_status == OperationalStatus::Delegated {
            return Ok(Notes::default());
        }
        if r.operational_status.is_custody_hold() {
            return refuse(format!(
                "the device is {} (a custody hold): it is not handed back over it",
                r.operational_status
            ));
        }
        if r.impairment_hold.is_some() {
            return refuse("the device carries an active impairment hold".into());
        }
        if matches!(
            r.operational_status,
            OperationalStatus::Failed | OperationalStatus::Quarantine
        ) {
            return refuse(format!(
                "the device is {}: only a device that is not failed or quarantined is handed to a customer",
                r.operational_status
            ));
        }
        // "In flight, each hand-back activity re-reads both latches ... the
        // Metal hand-back always does": re-read here under the row lock.
        for t in [
            ConditionType::NvLinkGpusInRepairPartition,
            ConditionType::BackendPortsInMaintenanceVrf,
        ] {
            if let Some(row) = self.conditions.get(&t) {
                if matches!(row.status, ConditionStatus::True | ConditionStatus::Unknown) {
                    return refuse(format!("{} is {}", t.as_str(), row.status));
                }
            }
        }
        let notes = Notes {
            handover_breach: self.custody_entry_latch(true, now),
        };
        self.record.operational_status = OperationalStatus::Delegated;
        Ok(notes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(status: OperationalStatus) -> DeviceState {
        let mut r = DeviceRecord::new("dev_1".into(), "s1".into(), "gpu01".into());
        r.infrastructure_ref = Some("uuid-1".into());
        r.operational_status = status;
        DeviceState::new(r)
    }

    fn ask() -> Delegation<'static> {
        Delegation {
            pinned_infrastructure_ref: "uuid-1",
            netbox_status: "active",
        }
    }

    fn now() -> DateTime<Utc> {
        "2026-12-02T12:00:00Z".parse().unwrap()
    }

    fn latch(s: &mut DeviceState, t: ConditionType, status: ConditionStatus) {
        s.put_condition(t, status, "Test", "", Source::Borneo, now(), now(), true);
    }

    /// "writing operational_status=delegated ... refuse[s] a missing or
    /// non-active device"; the identity, the custody holds, the latches
    /// ("True and Unknown refuse the handoff") refuse and change nothing.
    #[test]
    fn every_refusal_changes_nothing() {
        use ConditionStatus as C;
        use ConditionType as T;
        let cases: Vec<(&str, DeviceState, Delegation<'static>)> = vec![
            (
                "netbox rma",
                state(OperationalStatus::Validation),
                Delegation {
                    netbox_status: "rma",
                    ..ask()
                },
            ),
            (
                "another identity",
                state(OperationalStatus::Validation),
                Delegation {
                    pinned_infrastructure_ref: "uuid-2",
                    ..ask()
                },
            ),
            (
                "no identity pinned",
                state(OperationalStatus::Validation),
                Delegation {
                    pinned_infrastructure_ref: "",
                    ..ask()
                },
            ),
            ("drained", state(OperationalStatus::Drained), ask()),
            ("failed", state(OperationalStatus::Failed), ask()),
            ("quarantine", state(OperationalStatus::Quarantine), ask()),
            (
                "inventory only",
                {
                    let mut s = state(OperationalStatus::Validation);
                    s.record.inventory_only = true;
                    s
                },
                ask(),
            ),
            (
                "nvlink unknown",
                {
                    let mut s = state(OperationalStatus::Validation);
                    latch(&mut s, T::NvLinkGpusInRepairPartition, C::Unknown);
                    s
                },
                ask(),
            ),
            (
                "back-end true",
                {
                    let mut s = state(OperationalStatus::Validation);
                    latch(&mut s, T::BackendPortsInMaintenanceVrf, C::True);
                    s
                },
                ask(),
            ),
        ];
        for (what, mut s, d) in cases {
            let before = s.clone();
            assert!(
                matches!(s.delegate(d, now()), Err(DomainError::InvalidState(_))),
                "{what}"
            );
            assert_eq!(s, before, "{what}: nothing changed");
        }
    }

    /// "On an actual transition into delegated" the front-end latch is
    /// written Unknown unless verified True; a retried hand-back and a
    /// later custody entry write nothing twice.
    #[test]
    fn entering_delegated_writes_the_front_end_latch_once() {
        use ConditionStatus as C;
        let mut s = state(OperationalStatus::Validation);
        latch(&mut s, ConditionType::NvLinkGpusInRepairPartition, C::False);
        let notes = s.delegate(ask(), now()).unwrap();
        assert!(notes.handover_breach);
        assert_eq!(s.record.operational_status, OperationalStatus::Delegated);
        let row = &s.conditions[&ConditionType::FrontendPortsInCustomerVrf];
        assert_eq!(
            (row.status, row.reason.as_str()),
            (C::Unknown, reasons::HANDOVER_BREACH)
        );

        let before = s.clone();
        assert!(!s.delegate(ask(), now()).unwrap().handover_breach);
        assert_eq!(s, before, "a retried hand-back is a no-op");
        let custody = s.apply_custody("GOOGLE_OWNED", None, now());
        assert!(
            !custody.handover_breach,
            "Borneo's entry does not write it twice"
        );

        let mut verified = state(OperationalStatus::Available);
        latch(
            &mut verified,
            ConditionType::FrontendPortsInCustomerVrf,
            C::True,
        );
        assert!(!verified.delegate(ask(), now()).unwrap().handover_breach);
        assert_eq!(
            verified.conditions[&ConditionType::FrontendPortsInCustomerVrf].status,
            C::True
        );
    }
}
