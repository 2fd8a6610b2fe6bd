//! The schedulable (Better Compute placement) and customer-ready (Fleet
//! Manager release) predicates, each in Rust and in SQL. A property test
//! against PostgreSQL (`tests/it/predicates.rs`) holds each pair equal over
//! generated devices.

use crate::vocab::{
    CapacityBucket, Connectivity, HealthStatus, InventoryStatus, OperationalStatus, ProvisionState,
    Role, Trust,
};

/// What the schedulable predicate reads.
#[derive(Debug, Clone)]
pub struct SchedulingFacts<'a> {
    pub role: Role,
    pub trust: Trust,
    pub owner_tenant_id: Option<&'a str>,
    /// The owner of the pool the device is in.
    pub pool_owner_tenant_id: Option<&'a str>,
    pub maintenance: bool,
    pub cordoned: bool,
    pub provision_state: ProvisionState,
    pub observed_generation: i64,
    pub connectivity: Connectivity,
    pub no_schedule_reasons: &'a [String],
}

/// Checked in the order of `device.md`; the first that fails names the
/// capacity bucket. `Schedulable` when all hold.
pub fn schedulable(f: &SchedulingFacts) -> CapacityBucket {
    if f.role != Role::Host {
        return CapacityBucket::Excluded;
    }
    let owners_pool = f.owner_tenant_id.is_some() && f.owner_tenant_id == f.pool_owner_tenant_id;
    if !(f.trust == Trust::Platform || (f.trust == Trust::TenantOwned && owners_pool)) {
        return CapacityBucket::Excluded;
    }
    if f.maintenance || f.cordoned {
        return CapacityBucket::Maintenance;
    }
    if !matches!(
        f.provision_state,
        ProvisionState::Adopted | ProvisionState::Deployed
    ) {
        return CapacityBucket::Provisioning;
    }
    if f.observed_generation < 1 {
        return CapacityBucket::Provisioning;
    }
    if f.connectivity != Connectivity::Connected {
        return CapacityBucket::Unreachable;
    }
    if !f.no_schedule_reasons.is_empty() {
        return CapacityBucket::Unhealthy;
    }
    CapacityBucket::Schedulable
}

/// The same checks over `devices d LEFT JOIN pools p ON p.id = d.pool_id`,
/// as a `CASE` naming the bucket.
pub const SCHEDULABLE_BUCKET_SQL: &str = "(CASE \
    WHEN d.role <> 'host' THEN 'excluded' \
    WHEN NOT COALESCE(d.trust = 'platform' OR (d.trust = 'tenant-owned' AND d.owner_tenant_id IS NOT NULL \
         AND d.owner_tenant_id = p.owner_tenant_id), false) THEN 'excluded' \
    WHEN d.maintenance OR d.cordoned THEN 'maintenance' \
    WHEN d.provision_state NOT IN ('adopted', 'deployed') THEN 'provisioning' \
    WHEN d.observed_generation < 1 THEN 'provisioning' \
    WHEN d.connectivity <> 'connected' THEN 'unreachable' \
    WHEN cardinality(d.no_schedule_reasons) > 0 THEN 'unhealthy' \
    ELSE 'schedulable' END)";

/// The predicate alone, for `WHERE` clauses over the same join (the placer
/// applies it to rows it locks).
pub const SCHEDULABLE_SQL: &str = "(d.role = 'host' \
    AND COALESCE(d.trust = 'platform' OR (d.trust = 'tenant-owned' AND d.owner_tenant_id IS NOT NULL \
         AND d.owner_tenant_id = p.owner_tenant_id), false) \
    AND NOT d.maintenance AND NOT d.cordoned \
    AND d.provision_state IN ('adopted', 'deployed') \
    AND d.observed_generation >= 1 \
    AND d.connectivity = 'connected' \
    AND cardinality(d.no_schedule_reasons) = 0)";

/// Customer-ready (seed 002): a predicate, not a stored state.
pub fn customer_ready(
    inventory_only: bool,
    inventory: InventoryStatus,
    operational: OperationalStatus,
    health: HealthStatus,
) -> bool {
    use HealthStatus as H;
    use OperationalStatus as S;
    if inventory_only || inventory != InventoryStatus::Active {
        return false;
    }
    match operational {
        S::Available | S::InUse => health == H::Healthy,
        S::Delegated => matches!(health, H::Healthy | H::Unknown),
        _ => false,
    }
}

/// Customer-ready over `devices d`.
pub const CUSTOMER_READY_SQL: &str =
    "(NOT d.inventory_only AND d.inventory_status = 'active' AND (\
    (d.operational_status IN ('available', 'in_use') AND d.health_status = 'healthy') \
    OR (d.operational_status = 'delegated' AND d.health_status IN ('healthy', 'unknown'))))";

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> SchedulingFacts<'static> {
        SchedulingFacts {
            role: Role::Host,
            trust: Trust::Platform,
            owner_tenant_id: None,
            pool_owner_tenant_id: None,
            maintenance: false,
            cordoned: false,
            provision_state: ProvisionState::Deployed,
            observed_generation: 1,
            connectivity: Connectivity::Connected,
            no_schedule_reasons: &[],
        }
    }

    /// Each row: the seed sentence it checks, the facts (a schedulable host
    /// with some fields changed) and the bucket. Where two checks fail, the
    /// earlier one names the bucket.
    #[test]
    fn checks_run_in_order_and_name_the_bucket() {
        use CapacityBucket::*;
        let unreachable = ["unreachable".to_string()];
        let burn_in = ["taint:gpu-burnin".to_string()];
        let cases = [
            ("a host passing every check", host(), Schedulable),
            (
                "'role is host. Otherwise the node is excluded.'",
                SchedulingFacts {
                    role: Role::Dedicated,
                    cordoned: true,
                    ..host()
                },
                Excluded,
            ),
            (
                "'trust is platform, or tenant-owned in its owner's pool. Otherwise excluded.'",
                SchedulingFacts {
                    trust: Trust::TenantOwned,
                    owner_tenant_id: Some("t1"),
                    pool_owner_tenant_id: Some("t2"),
                    ..host()
                },
                Excluded,
            ),
            (
                "tenant-owned in its owner's pool",
                SchedulingFacts {
                    trust: Trust::TenantOwned,
                    owner_tenant_id: Some("t1"),
                    pool_owner_tenant_id: Some("t1"),
                    ..host()
                },
                Schedulable,
            ),
            (
                "tenant-controlled",
                SchedulingFacts {
                    trust: Trust::TenantControlled,
                    ..host()
                },
                Excluded,
            ),
            (
                "'Not in maintenance and not cordoned. Otherwise maintenance.'",
                SchedulingFacts {
                    cordoned: true,
                    connectivity: Connectivity::Lost,
                    ..host()
                },
                Maintenance,
            ),
            (
                "'provisionState is adopted or deployed. Otherwise provisioning.'",
                SchedulingFacts {
                    provision_state: ProvisionState::Ready,
                    ..host()
                },
                Provisioning,
            ),
            (
                "'observedGeneration is at least 1'",
                SchedulingFacts {
                    observed_generation: 0,
                    ..host()
                },
                Provisioning,
            ),
            (
                "'connectivity is connected. Otherwise unreachable.'",
                SchedulingFacts {
                    connectivity: Connectivity::Disconnected,
                    no_schedule_reasons: &unreachable,
                    ..host()
                },
                Unreachable,
            ),
            (
                "'noScheduleReasons is empty. Otherwise unhealthy.'",
                SchedulingFacts {
                    no_schedule_reasons: &burn_in,
                    ..host()
                },
                Unhealthy,
            ),
        ];
        for (sentence, facts, want) in cases {
            assert_eq!(schedulable(&facts), want, "{sentence}");
        }
    }

    #[test]
    fn customer_ready_rules() {
        use HealthStatus as H;
        use InventoryStatus as I;
        use OperationalStatus as S;
        assert!(customer_ready(false, I::Active, S::Available, H::Healthy));
        assert!(customer_ready(false, I::Active, S::InUse, H::Healthy));
        assert!(!customer_ready(false, I::Active, S::InUse, H::Unknown));
        // "healthy delegated devices are customer-ready; only degraded/critical exclude them"
        assert!(customer_ready(false, I::Active, S::Delegated, H::Unknown));
        assert!(!customer_ready(false, I::Active, S::Delegated, H::Degraded));
        // "Inventory-only devices are never customer-ready"
        assert!(!customer_ready(true, I::Active, S::Available, H::Healthy));
        assert!(!customer_ready(false, I::Staged, S::Available, H::Healthy));
    }
}
