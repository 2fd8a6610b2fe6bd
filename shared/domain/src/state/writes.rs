//! The single-condition write path (`ConditionWrite`).

use super::*;

impl DeviceState {
    /// The single-condition path (`ConditionWrite`). Returns the outcome and
    /// whether the value changed semantically (create, status, reason,
    /// message), which is when the caller re-derives.
    pub fn apply_condition_write(
        &mut self,
        source: Source,
        input: &ConditionInput,
        observed_at: Option<DateTime<Utc>>,
        hub_ordered: bool,
        now: DateTime<Utc>,
    ) -> Result<(Outcome, bool), DomainError> {
        let t = input.condition_type;
        t.check_owner(source)?;
        if source == Source::Borneo && !hub_ordered {
            // "borneo (custody entry only, hub-ordered)"
            return Err(DomainError::ForbiddenSource {
                source_name: source.to_string(),
                condition_type: format!("{t} (only as the hub-ordered custody-entry write)"),
            });
        }
        let at = if hub_ordered {
            now
        } else {
            let at = observed_at
                .ok_or_else(|| DomainError::InvalidArgument("observed_at is required".into()))?;
            check_observed_at(at, now)?;
            if let Some(row) = self.conditions.get(&t) {
                if at < row.observed_at {
                    return Ok((Outcome::Stale, false));
                }
                if at == row.observed_at
                    && row.same_value(input.status, &input.reason, &input.message)
                {
                    return Ok((Outcome::Duplicate, false));
                }
            }
            at
        };
        let changed = self.put_condition(
            t,
            input.status,
            &input.reason,
            &input.message,
            source,
            at,
            now,
            true,
        );
        Ok((Outcome::Applied, changed))
    }
}
