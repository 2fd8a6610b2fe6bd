//! Site summaries and observations whose key resolved to no device.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use fleet_domain::predicates::{CUSTOMER_READY_SQL, SCHEDULABLE_BUCKET_SQL};
use fleet_domain::*;
use sqlx::{Postgres, QueryBuilder};

use crate::error::{ApiResult, P, Q};
use crate::model::*;
use crate::page::Keyset;
use crate::{db, App};

/// `NOT_FOUND` unless the site exists.
pub async fn require(app: &App, id: &str) -> ApiResult<()> {
    db::require(app, "sites", id, "site").await
}

/// Per-status counts excluding `inventory_only` devices (seed 002: so
/// projection-only inventory does not read as unhealthy fleet).
#[utoipa::path(get, path = "/api/v1/sites/{id}/summary", params(("id" = String, Path)),
    responses((status = 200, body = SiteSummary), (status = 404, body = crate::error::ErrorBody)),
    tag = "sites")]
pub async fn summary(State(app): State<App>, P(id): P<String>) -> ApiResult<Json<SiteSummary>> {
    require(&app, &id).await?;
    // One scan: grouping sets over the managed devices of the site.
    let sql = format!(
        "SELECT g.axis, g.value, g.n FROM ( \
           SELECT CASE WHEN GROUPING(d.inventory_status) = 0 THEN 'inventory_status' \
                       WHEN GROUPING(d.operational_status) = 0 THEN 'operational_status' \
                       WHEN GROUPING(d.health_status) = 0 THEN 'health_status' \
                       WHEN GROUPING(b.bucket) = 0 THEN 'capacity_bucket' ELSE 'total' END AS axis, \
                  COALESCE(d.inventory_status, d.operational_status, d.health_status, b.bucket, '') AS value, \
                  count(*) AS n \
           FROM devices d LEFT JOIN pools p ON p.id = d.pool_id \
           CROSS JOIN LATERAL (SELECT {SCHEDULABLE_BUCKET_SQL} AS bucket) b \
           WHERE d.site_id = $1 AND d.deleted_at IS NULL AND NOT d.inventory_only \
           GROUP BY GROUPING SETS ((d.inventory_status), (d.operational_status), (d.health_status), (b.bucket), ()) \
         ) g"
    );
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as(&sql).bind(&id).fetch_all(&app.pool).await?;
    let flags: (i64, i64, i64, i64, i64) = sqlx::query_as(&format!(
        "SELECT count(*) FILTER (WHERE NOT d.inventory_only AND {CUSTOMER_READY_SQL}), \
                count(*) FILTER (WHERE NOT d.inventory_only AND d.in_triage), \
                count(*) FILTER (WHERE NOT d.inventory_only AND d.cordoned), \
                count(*) FILTER (WHERE NOT d.inventory_only AND d.maintenance), \
                count(*) FILTER (WHERE d.inventory_only) \
         FROM devices d WHERE d.site_id = $1 AND d.deleted_at IS NULL"
    ))
    .bind(&id)
    .fetch_one(&app.pool)
    .await?;
    // Every value of each vocabulary is present, zero when no device has it.
    let zeroes = |all: Vec<&str>| -> BTreeMap<String, i64> {
        all.into_iter().map(|v| (v.to_string(), 0)).collect()
    };
    let mut s = SiteSummary {
        site_id: id,
        total: 0,
        inventory_only_excluded: flags.4,
        inventory_status: zeroes(InventoryStatus::ALL.iter().map(|v| v.as_str()).collect()),
        operational_status: zeroes(OperationalStatus::ALL.iter().map(|v| v.as_str()).collect()),
        health_status: zeroes(HealthStatus::ALL.iter().map(|v| v.as_str()).collect()),
        capacity_bucket: zeroes(CapacityBucket::ALL.iter().map(|v| v.as_str()).collect()),
        customer_ready: flags.0,
        in_triage: flags.1,
        cordoned: flags.2,
        maintenance: flags.3,
    };
    for (axis, value, n) in rows {
        match axis.as_str() {
            "inventory_status" => {
                s.inventory_status.insert(value, n);
            }
            "operational_status" => {
                s.operational_status.insert(value, n);
            }
            "health_status" => {
                s.health_status.insert(value, n);
            }
            "capacity_bucket" => {
                s.capacity_bucket.insert(value, n);
            }
            _ => s.total = n,
        }
    }
    Ok(Json(s))
}

crate::page::page_query! {
    pub struct UnresolvedFilter {
        #[param(schema_with = source_schema)]
        pub source: Option<String>,
        pub site: Option<String>,
    }
}

/// Observations whose device key resolved to no device (latest per key).
#[utoipa::path(get, path = "/api/v1/unresolved-observations/", params(UnresolvedFilter),
    responses((status = 200, body = UnresolvedPage), (status = 400, body = crate::error::ErrorBody)),
    tag = "conditions")]
pub async fn unresolved(
    State(app): State<App>,
    Q(f): Q<UnresolvedFilter>,
) -> ApiResult<Json<UnresolvedPage>> {
    let page = f.page(&app)?;
    let mut qb = QueryBuilder::<Postgres>::new(
        "SELECT source, site, key_kind, key, observed_at, received_at, seen_count \
         FROM unresolved_observations WHERE true",
    );
    if let Some(s) = &f.source {
        Source::parse(s)?;
        qb.push(" AND source = ").push_bind(s.clone());
    }
    if let Some(s) = &f.site {
        qb.push(" AND site = ").push_bind(s.clone());
    }
    let keyset = Keyset::ascending(&["source", "site", "key_kind", "key"]);
    let (items, next_cursor) = page
        .fetch(&app, qb, keyset, |u: &UnresolvedObservation| {
            (
                u.source.clone(),
                u.site.clone(),
                u.key_kind.clone(),
                u.key.clone(),
            )
        })
        .await?;
    Ok(Json(UnresolvedPage { items, next_cursor }))
}
