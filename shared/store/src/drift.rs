//! Latch drift in SQL: the devices whose durable fabric latch disagrees
//! with a fresh live observation (`fleet_domain::drift`, whose
//! `DRIFT_SQL` is the comparison used here). For the hub's gauge
//! (`counts`) and for an API list (`list`, keyset-paginated on
//! `(device_id, latch_type)`).
//!
//! An observation is fresh as the API's `stale` says: its last confirmation
//! (the later of its own `observed_at` and its source's snapshot freshness)
//! plus its source's TTL is not in the past.

use chrono::{DateTime, Utc};
use fleet_domain::drift::{Drift, DRIFT_SQL, PAIRS};
use fleet_domain::{ConditionType, Source};
use sqlx::{PgPool, Postgres, QueryBuilder};

/// One drifting latch of one device.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DriftRow {
    pub device_id: String,
    pub site_id: String,
    pub name: String,
    pub latch_type: String,
    /// `None`: no latch row (reads as `False`).
    pub latch_status: Option<String>,
    pub latch_reason: Option<String>,
    pub observed_type: String,
    pub observed_status: String,
    pub observed_reason: String,
    pub observed_message: String,
    pub observed_at: DateTime<Utc>,
    pub observed_source: String,
    /// `unguarded` or `stale_guard`.
    pub drift: String,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DriftCount {
    pub site_id: String,
    pub latch_type: String,
    pub drift: String,
    pub devices: i64,
}

/// What a list is narrowed to.
#[derive(Debug, Clone, Default)]
pub struct DriftFilter {
    pub site: Option<String>,
    pub latch: Option<ConditionType>,
    pub drift: Option<Drift>,
    /// Keyset cursor: rows after this `(device_id, latch_type)`.
    pub after: Option<(String, String)>,
}

/// The TTLs as the hub's configuration gives them.
pub struct Freshness<'a> {
    pub per_source: &'a [(Source, chrono::Duration)],
    pub default: chrono::Duration,
}

fn secs(d: chrono::Duration) -> f64 {
    d.num_milliseconds() as f64 / 1000.0
}

/// `WITH ... drifting AS (...)`: every drifting (device, latch) with its
/// rows, before filters.
fn push_drifting(qb: &mut QueryBuilder<'_, Postgres>, fresh: &Freshness<'_>) {
    let sources: Vec<String> = fresh
        .per_source
        .iter()
        .map(|(s, _)| s.as_str().to_string())
        .collect();
    let ttl_secs: Vec<f64> = fresh.per_source.iter().map(|(_, d)| secs(*d)).collect();
    let latches: Vec<String> = PAIRS.iter().map(|p| p.latch.as_str().to_string()).collect();
    let observed: Vec<String> = PAIRS
        .iter()
        .map(|p| p.observed.as_str().to_string())
        .collect();
    qb.push("WITH ttl AS (SELECT * FROM UNNEST(");
    qb.push_bind(sources);
    qb.push("::text[], ");
    qb.push_bind(ttl_secs);
    qb.push("::float8[]) AS t(source, secs)), pairs AS (SELECT * FROM UNNEST(");
    qb.push_bind(latches);
    qb.push("::text[], ");
    qb.push_bind(observed);
    qb.push("::text[]) AS p(latch_type, observed_type)), drifting AS (SELECT d.id AS device_id, d.site_id, d.name, \
        p.latch_type, l.status AS latch_status, l.reason AS latch_reason, \
        o.type AS observed_type, o.status AS observed_status, o.reason AS observed_reason, \
        o.message AS observed_message, o.observed_at, o.source AS observed_source, ");
    qb.push(DRIFT_SQL);
    qb.push(
        " AS drift FROM device_conditions o \
        JOIN pairs p ON p.observed_type = o.type \
        JOIN devices d ON d.id = o.device_id AND d.deleted_at IS NULL \
        LEFT JOIN device_conditions l ON l.device_id = o.device_id AND l.type = p.latch_type \
        LEFT JOIN device_source_freshness f ON f.device_id = o.device_id AND f.source = o.source \
        LEFT JOIN ttl ON ttl.source = o.source \
        WHERE GREATEST(o.observed_at, f.observed_at) + make_interval(secs => COALESCE(ttl.secs, ",
    );
    qb.push_bind(secs(fresh.default));
    qb.push(")) >= now()) ");
}

/// Drifting (device, latch) pairs in `(device_id, latch_type)` order.
pub async fn list(
    pool: &PgPool,
    fresh: &Freshness<'_>,
    filter: &DriftFilter,
    limit: i64,
) -> Result<Vec<DriftRow>, sqlx::Error> {
    let mut qb = QueryBuilder::new("");
    push_drifting(&mut qb, fresh);
    qb.push("SELECT * FROM drifting WHERE drift IS NOT NULL");
    if let Some(site) = &filter.site {
        qb.push(" AND site_id = ").push_bind(site.clone());
    }
    if let Some(latch) = filter.latch {
        qb.push(" AND latch_type = ")
            .push_bind(latch.as_str().to_string());
    }
    if let Some(d) = filter.drift {
        qb.push(" AND drift = ").push_bind(d.as_str().to_string());
    }
    if let Some((device, latch)) = &filter.after {
        qb.push(" AND (device_id, latch_type) > (")
            .push_bind(device.clone())
            .push(", ")
            .push_bind(latch.clone())
            .push(")");
    }
    qb.push(" ORDER BY device_id, latch_type LIMIT ")
        .push_bind(limit.max(0));
    qb.build_query_as().fetch_all(pool).await
}

/// Devices per site, latch and kind of drift: the hub's gauge.
pub async fn counts(pool: &PgPool, fresh: &Freshness<'_>) -> Result<Vec<DriftCount>, sqlx::Error> {
    let mut qb = QueryBuilder::new("");
    push_drifting(&mut qb, fresh);
    qb.push(
        "SELECT site_id, latch_type, drift, count(*) AS devices FROM drifting \
         WHERE drift IS NOT NULL GROUP BY site_id, latch_type, drift \
         ORDER BY site_id, latch_type, drift",
    );
    qb.build_query_as().fetch_all(pool).await
}
