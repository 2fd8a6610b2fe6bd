//! The ground truth: the derived axes each device should show, by the rules
//! of `spec/conditions.md` written here again on purpose (never
//! `fleet_domain::derivation`), so the hub's derivation has an independent
//! check.

use super::*;

/// One device's expected derived axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub operational: &'static str,
    pub health: &'static str,
    pub connectivity: &'static str,
}

/// `connected` while the device's agent has its session open,
/// `disconnected` otherwise (closed, or never opened: the default).
pub fn expected_connectivity(d: &SimDevice) -> &'static str {
    if d.agent_session == Some(true) {
        "connected"
    } else {
        "disconnected"
    }
}

/// The health status `spec/conditions.md` derives from the
/// `chassis_health` series the simulated Prometheus serves.
pub fn expected_health(d: &SimDevice) -> &'static str {
    match d.health {
        0 => "healthy",
        1 => "degraded",
        _ => "critical",
    }
}

/// The operational status `spec/conditions.md` derives from what the
/// connectors read of this device: the conditions each source reports,
/// then the ordered rules. Written from the spec, not from the hub.
pub fn expected_status(d: &SimDevice, outages: Outages) -> &'static str {
    // Custody holds freeze the status whatever the conditions say:
    // `DRAINED` drained, `GOOGLE_OWNED` delegated; `PARTNER_OWNED` changes
    // nothing, so a returned device stays as it was.
    if d.drained {
        return "drained";
    }
    if d.delegated {
        return "delegated";
    }
    #[derive(Clone, Copy, PartialEq)]
    enum C {
        True,
        False,
        Unknown,
        /// Unknown because the source could not be read after having
        /// reported the device (SchedulerUnreachable): "lost from sight".
        Lost,
    }
    let b = |v: bool| if v { C::True } else { C::False };
    let (provision_healthy, maintenance, available, allocated, ready, maint_pool) =
        if outages.ironic {
            // The outage rule: every openstack condition Unknown.
            (
                C::Unknown,
                C::Unknown,
                C::Unknown,
                C::Unknown,
                C::Unknown,
                C::Unknown,
            )
        } else {
            (
                b(!FAILURE_STATES.contains(&d.provision_state)),
                b(d.maintenance.is_some()),
                b(d.provision_state == "available"),
                b(d.instance_uuid.is_some()),
                b(d.customer_ready),
                b(d.lessee == MAINTENANCE_PROJECT),
            )
        };
    // A node SLURM does not list (and, in this scenario, never listed while
    // in the maintenance pool) has no SLURM rows that matter.
    let (registered, node_healthy) = match (d.slurm, outages.slurm) {
        (Some(_), true) => (C::Lost, C::Lost),
        (Some(s), false) => (C::True, b(s.healthy())),
        (None, _) => (C::Unknown, C::Unknown),
    };
    if provision_healthy == C::False {
        return "failed";
    }
    if maintenance == C::True {
        return "quarantine";
    }
    if ready == C::True && allocated == C::True {
        return "in_use";
    }
    if ready == C::True && allocated == C::False && available == C::True {
        return "available";
    }
    if maint_pool == C::True {
        if node_healthy == C::False || registered == C::False {
            return "quarantine";
        }
        let ok = |c: C| c == C::True || c == C::Lost;
        if ok(registered) && ok(node_healthy) {
            return "validation";
        }
        return "quarantine";
    }
    if ready == C::False {
        return "quarantine";
    }
    "unknown"
}
