//! `device.md`: "The predicate exists twice, once in Rust and once in SQL,
//! and a test holds them equal over many generated devices." Generated
//! device rows are written to PostgreSQL and read back through
//! `SCHEDULABLE_BUCKET_SQL`, `SCHEDULABLE_SQL` and `CUSTOMER_READY_SQL`;
//! every row must get the answer the Rust predicates give.

use std::collections::BTreeMap;
use std::sync::Mutex;

use fleet_domain::predicates::{
    customer_ready, schedulable, SchedulingFacts, CUSTOMER_READY_SQL, SCHEDULABLE_BUCKET_SQL,
    SCHEDULABLE_SQL,
};
use fleet_domain::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::json;

use crate::support::*;

#[derive(Debug, Clone)]
struct Row {
    role: Role,
    trust: Trust,
    /// None, t1, t2
    owner: Option<&'static str>,
    /// None, p-open (no owner), p-t1, p-t2
    pool: Option<(&'static str, Option<&'static str>)>,
    maintenance: bool,
    cordoned: bool,
    provision_state: ProvisionState,
    observed_generation: i64,
    connectivity: Connectivity,
    no_schedule_reasons: Vec<String>,
    inventory_only: bool,
    inventory: InventoryStatus,
    operational: OperationalStatus,
    health: HealthStatus,
}

/// Every value, with the ones the predicates pass for made common enough
/// that every bucket and both customer-ready answers turn up.
fn biased<T: Clone + std::fmt::Debug + 'static>(
    all: &'static [T],
    common: &'static [T],
) -> BoxedStrategy<T> {
    prop_oneof![
        1 => prop::sample::select(all.to_vec()),
        2 => prop::sample::select(common.to_vec()),
    ]
    .boxed()
}

fn row() -> impl Strategy<Value = Row> {
    let identity = (
        biased(Role::ALL, &[Role::Host]),
        biased(Trust::ALL, &[Trust::Platform]),
        prop::sample::select(vec![None, Some("t1"), Some("t2")]),
        prop::sample::select(vec![
            None,
            Some(("p-open", None)),
            Some(("p-t1", Some("t1"))),
            Some(("p-t2", Some("t2"))),
        ]),
    );
    let axes = (
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
        biased(
            ProvisionState::ALL,
            &[ProvisionState::Adopted, ProvisionState::Deployed],
        ),
        prop_oneof![1 => -1i64..1, 3 => 1i64..3],
        biased(Connectivity::ALL, &[Connectivity::Connected]),
        prop_oneof![
            2 => Just(vec![]),
            1 => prop::collection::vec(
                prop::sample::select(vec!["taint:burnin", "GpuCountMismatch", "unreachable", "draining", "health:critical"]),
                1..3,
            ),
        ],
    );
    let release = (
        prop::bool::weighted(0.2),
        biased(InventoryStatus::ALL, &[InventoryStatus::Active]),
        biased(
            OperationalStatus::ALL,
            &[
                OperationalStatus::Available,
                OperationalStatus::InUse,
                OperationalStatus::Delegated,
            ],
        ),
        biased(
            HealthStatus::ALL,
            &[HealthStatus::Healthy, HealthStatus::Unknown],
        ),
    );
    (identity, axes, release).prop_map(
        |(
            (role, trust, owner, pool),
            (maintenance, cordoned, provision_state, observed_generation, connectivity, reasons),
            (inventory_only, inventory, operational, health),
        )| Row {
            role,
            trust,
            owner,
            pool,
            maintenance,
            cordoned,
            provision_state,
            observed_generation,
            connectivity,
            no_schedule_reasons: reasons.into_iter().map(str::to_string).collect(),
            inventory_only,
            inventory,
            operational,
            health,
        },
    )
}

fn rust_answers(r: &Row) -> (CapacityBucket, bool) {
    let bucket = schedulable(&SchedulingFacts {
        role: r.role,
        trust: r.trust,
        owner_tenant_id: r.owner,
        pool_owner_tenant_id: r.pool.and_then(|(_, o)| o),
        maintenance: r.maintenance,
        cordoned: r.cordoned,
        provision_state: r.provision_state,
        observed_generation: r.observed_generation,
        connectivity: r.connectivity,
        no_schedule_reasons: &r.no_schedule_reasons,
    });
    let ready = customer_ready(r.inventory_only, r.inventory, r.operational, r.health);
    (bucket, ready)
}

/// Writes the rows and compares every answer; returns the buckets seen.
async fn check(
    env: &TestEnv,
    batch: usize,
    rows: &[Row],
) -> Result<Vec<(CapacityBucket, bool)>, String> {
    let ids: Vec<String> = (0..rows.len())
        .map(|i| format!("dev_g{batch:04}_{i:04}"))
        .collect();
    let records: Vec<serde_json::Value> = rows
        .iter()
        .zip(&ids)
        .map(|(r, id)| {
            json!({
                "id": id, "role": r.role.as_str(), "trust": r.trust.as_str(), "owner_tenant_id": r.owner,
                "pool_id": r.pool.map(|(p, _)| p), "maintenance": r.maintenance, "cordoned": r.cordoned,
                "provision_state": r.provision_state.as_str(), "observed_generation": r.observed_generation,
                "connectivity": r.connectivity.as_str(), "no_schedule_reasons": r.no_schedule_reasons,
                "inventory_only": r.inventory_only, "inventory_status": r.inventory.as_str(),
                "operational_status": r.operational.as_str(), "health_status": r.health.as_str(),
            })
        })
        .collect();
    sqlx::query(
        "INSERT INTO devices (id, name, site_id, role, trust, owner_tenant_id, pool_id, maintenance, cordoned, \
         provision_state, observed_generation, connectivity, no_schedule_reasons, inventory_only, \
         inventory_status, operational_status, health_status) \
         SELECT x.id, x.id, 's1', x.role, x.trust, x.owner_tenant_id, x.pool_id, x.maintenance, x.cordoned, \
         x.provision_state, x.observed_generation, x.connectivity, x.no_schedule_reasons, x.inventory_only, \
         x.inventory_status, x.operational_status, x.health_status \
         FROM jsonb_to_recordset($1::jsonb) AS x(id text, role text, trust text, owner_tenant_id text, \
         pool_id text, maintenance boolean, cordoned boolean, provision_state text, observed_generation bigint, \
         connectivity text, no_schedule_reasons text[], inventory_only boolean, inventory_status text, \
         operational_status text, health_status text)",
    )
    .bind(serde_json::Value::Array(records))
    .execute(&env.pool)
    .await
    .map_err(|e| format!("insert: {e}"))?;
    let sql = format!(
        "SELECT d.id, {SCHEDULABLE_BUCKET_SQL}, {SCHEDULABLE_SQL}, {CUSTOMER_READY_SQL} \
         FROM devices d LEFT JOIN pools p ON p.id = d.pool_id WHERE d.id = ANY($1)"
    );
    let got: Vec<(String, String, bool, bool)> = sqlx::query_as(&sql)
        .bind(&ids)
        .fetch_all(&env.pool)
        .await
        .map_err(|e| format!("select: {e}"))?;
    let got: BTreeMap<String, (String, bool, bool)> = got
        .into_iter()
        .map(|(id, b, s, c)| (id, (b, s, c)))
        .collect();
    let mut seen = vec![];
    for (r, id) in rows.iter().zip(&ids) {
        let (bucket, ready) = rust_answers(r);
        let (sql_bucket, sql_schedulable, sql_ready) =
            got.get(id).ok_or_else(|| format!("{id} not read back"))?;
        if sql_bucket != bucket.as_str() {
            return Err(format!("bucket: Rust {bucket}, SQL {sql_bucket} for {r:?}"));
        }
        if *sql_schedulable != (bucket == CapacityBucket::Schedulable) {
            return Err(format!(
                "SCHEDULABLE_SQL {sql_schedulable} but bucket {bucket} for {r:?}"
            ));
        }
        if *sql_ready != ready {
            return Err(format!(
                "customer-ready: Rust {ready}, SQL {sql_ready} for {r:?}"
            ));
        }
        seen.push((bucket, ready));
    }
    Ok(seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_and_sql_predicates_agree_over_generated_devices() {
    let env = TestEnv::new().await;
    sqlx::query("INSERT INTO tenants (id, name) VALUES ('t1', 'one'), ('t2', 'two')")
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO pools (id, site_id, kind, owner_tenant_id) VALUES \
         ('p-open', 's1', 'metal-host', NULL), ('p-t1', 's1', 'custom', 't1'), ('p-t2', 's1', 'custom', 't2')",
    )
    .execute(&env.pool)
    .await
    .unwrap();

    let seen: Mutex<Vec<(CapacityBucket, bool)>> = Mutex::new(vec![]);
    let batch = Mutex::new(0usize);
    let mut runner = TestRunner::new(Config {
        cases: 40,
        ..Config::default()
    });
    let handle = tokio::runtime::Handle::current();
    let result = runner.run(&prop::collection::vec(row(), 1..250), |rows| {
        let n = {
            let mut b = batch.lock().unwrap();
            *b += 1;
            *b
        };
        let r = tokio::task::block_in_place(|| handle.block_on(check(&env, n, &rows)));
        match r {
            Ok(s) => {
                seen.lock().unwrap().extend(s);
                Ok(())
            }
            Err(m) => Err(TestCaseError::fail(m)),
        }
    });
    if let Err(e) = result {
        panic!("the Rust and SQL predicates disagree: {e}");
    }
    // The generator reached every answer, so agreement means something.
    let seen = seen.into_inner().unwrap();
    assert!(seen.len() > 1000, "only {} devices generated", seen.len());
    for b in CapacityBucket::ALL {
        assert!(
            seen.iter().any(|(s, _)| s == b),
            "no generated device in bucket {b}"
        );
    }
    assert!(seen.iter().any(|(_, r)| *r) && seen.iter().any(|(_, r)| !*r));
    env.cleanup().await;
}
