//! Re-deriving every derived axis, ending a transaction's work on the
//! device, and the changes it leaves.

use super::*;

impl DeviceState {
    /// A condition as derivation reads it now: stale observation rows read
    /// `Unknown`/`SourceSilent`.
    pub fn effective(&self, t: ConditionType, now: DateTime<Utc>, ttls: &Ttls) -> Effective<'_> {
        match self.conditions.get(&t) {
            None => Effective::ABSENT,
            Some(row) if self.is_stale(row, now, ttls) => Effective {
                status: ConditionStatus::Unknown,
                reason: reasons::SOURCE_SILENT,
            },
            Some(row) => Effective {
                status: row.status,
                reason: &row.reason,
            },
        }
    }

    /// The time a row was last confirmed: the later of its own
    /// `observed_at` and its source's snapshot freshness.
    pub fn last_confirmed(&self, row: &ConditionRow) -> DateTime<Utc> {
        match self.freshness.get(&row.source) {
            Some(f) if f.observed_at > row.observed_at => f.observed_at,
            _ => row.observed_at,
        }
    }

    pub fn is_stale(&self, row: &ConditionRow, now: DateTime<Utc>, ttls: &Ttls) -> bool {
        !row.durable && self.last_confirmed(row) + ttls.of(row.source) < now
    }

    /// Re-derives every derived axis and the decisive flags. `at` stamps
    /// `entered_service_at` and failure metadata.
    pub fn reconcile(&mut self, now: DateTime<Utc>, ttls: &Ttls) {
        let inventory_only = self.record.inventory_only;
        let derived =
            derivation::derive_operational(inventory_only, |t| self.effective(t, now, ttls));
        let decisive: Vec<ConditionType> = derived.decisive.clone();
        for (t, row) in self.conditions.iter_mut() {
            row.decisive = decisive.contains(t);
        }
        let r = &mut self.record;
        if !derivation::is_frozen(r.operational_status, r.impairment_hold.is_some()) {
            let before = r.operational_status;
            r.operational_status = derived.status;
            if derived.status == OperationalStatus::Failed && before != OperationalStatus::Failed {
                r.failure_state = r.mirrors.ironic_provision_state.clone();
                r.failed_at = Some(now);
            }
        }
        if matches!(
            r.operational_status,
            OperationalStatus::Available | OperationalStatus::InUse
        ) && r.entered_service_at.is_none()
        {
            r.entered_service_at = Some(now);
        }
        let health_fresh = self
            .freshness
            .get(&Source::HealthStatus)
            .is_some_and(|f| f.observed_at + ttls.of(Source::HealthStatus) >= now);
        let composite = if health_fresh {
            self.record.mirrors.chassis_health
        } else {
            None
        };
        self.record.health_status = derivation::derive_health(inventory_only, composite);
        self.record.no_schedule_reasons = self.no_schedule_reasons(now, ttls);
        let r = &self.record;
        self.record.capacity_bucket = predicates::schedulable(&SchedulingFacts {
            role: r.role,
            trust: r.trust,
            owner_tenant_id: r.owner_tenant_id.as_deref(),
            pool_owner_tenant_id: r.pool_owner_tenant_id.as_deref(),
            maintenance: r.maintenance,
            cordoned: r.cordoned,
            provision_state: r.provision_state,
            observed_generation: r.observed_generation,
            connectivity: r.connectivity,
            no_schedule_reasons: &r.no_schedule_reasons,
        });
    }

    /// `taint:<key>`, NoSchedule condition types in their bad state,
    /// `unreachable`, `draining`, `health:critical`, in that order.
    pub(super) fn no_schedule_reasons(&self, now: DateTime<Utc>, ttls: &Ttls) -> Vec<String> {
        let r = &self.record;
        let mut out: Vec<String> = r.taints.iter().map(|k| format!("taint:{k}")).collect();
        for t in self.conditions.keys() {
            if t.entry().no_schedule && t.is_bad(self.effective(*t, now, ttls).status) {
                out.push(t.to_string());
            }
        }
        if r.connectivity != Connectivity::Connected {
            out.push("unreachable".into());
        }
        if r.draining {
            out.push("draining".into());
        }
        if r.health_status == HealthStatus::Critical {
            out.push("health:critical".into());
        }
        out
    }

    /// Ends a transaction's work on the device: re-derives (unless
    /// deleted), bumps `version` when the record changed beyond the
    /// heartbeat (a device `born` here keeps version 1), and settles the
    /// freshness rows of the snapshots applied since `before`.
    ///
    /// A source settled at `before`'s version stays settled at the new one
    /// when nothing its snapshot's full apply writes has moved: its owned
    /// rows hold the same values and the mirrored columns are unchanged. A
    /// join, a session opening or closing, an adoption or a cordon bumps
    /// the version without touching either, and must not send every
    /// source's next snapshot down the full path.
    pub fn finish(&mut self, before: &DeviceState, born: bool, now: DateTime<Utc>, ttls: &Ttls) {
        if !self.record.deleted {
            self.reconcile(now, ttls);
        }
        if !born && self.record.differs_beyond_heartbeat(&before.record) {
            self.record.version = before.record.version + 1;
        }
        let version = self.record.version;
        for (source, f) in self.freshness.iter_mut() {
            if f.settled_version == SETTLING {
                f.settled_version = version;
            } else if f.settled_version > UNSETTLED {
                let kept = f.settled_version == before.record.version
                    && mirrored_columns_equal(*source, &self.record, &before.record)
                    && owned_rows_equal(*source, &self.conditions, &before.conditions);
                f.settled_version = if kept { version } else { UNSETTLED };
            }
        }
    }

    /// The tracked axes whose value differs from `before`.
    pub fn axis_changes(&self, before: &DeviceRecord) -> Vec<AxisChange> {
        TRACKED_AXES
            .iter()
            .filter_map(|axis| {
                let (from, to) = (before.axis_value(*axis), self.record.axis_value(*axis));
                (from != to).then_some(AxisChange {
                    axis: *axis,
                    from,
                    to,
                })
            })
            .collect()
    }

    /// Condition types whose status differs from `before`.
    pub fn condition_changes(
        &self,
        before: &BTreeMap<ConditionType, ConditionRow>,
    ) -> Vec<ConditionChange> {
        self.conditions
            .values()
            .filter_map(|row| {
                let from = before.get(&row.condition_type).map(|b| b.status);
                (from != Some(row.status)).then_some(ConditionChange {
                    condition_type: row.condition_type,
                    from,
                    to: row.status,
                })
            })
            .collect()
    }

    /// The types the current derivation found decisive, by name.
    pub fn decisive_types(&self) -> Vec<ConditionType> {
        let mut v: Vec<ConditionType> = self
            .conditions
            .values()
            .filter(|r| r.decisive)
            .map(|r| r.condition_type)
            .collect();
        v.sort_by_key(|t| t.as_str());
        v
    }
}
