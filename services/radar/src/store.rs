//! Radar's reads (devices with their owning tenant's annotations) and its
//! one write: a tenant's `radar_ignore` annotation. It never writes a
//! device field.

use fleet_domain::{HealthStatus, InventoryStatus, OperationalStatus};
use sqlx::PgPool;

use crate::mapping::{self, RadarDevice};

/// A device row with what the projection needs.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: String,
    pub site: String,
    pub name: String,
    pub version: i64,
    pub device: RadarDevice,
}

const SELECT: &str =
    "SELECT d.id, d.site_id, d.name, d.version, d.inventory_only, d.inventory_status, \
    d.operational_status, d.health_status, d.in_triage, d.deleted_at IS NOT NULL, t.annotations \
    FROM devices d LEFT JOIN pools p ON p.id = d.pool_id \
    LEFT JOIN tenants t ON t.id = COALESCE(d.owner_tenant_id, p.owner_tenant_id)";

type Raw = (
    String,
    String,
    String,
    i64,
    bool,
    String,
    String,
    String,
    bool,
    bool,
    Option<serde_json::Value>,
);

fn row(r: Raw) -> Option<Row> {
    let (id, site, name, version, inventory_only, inv, op, health, in_triage, deleted, annotations) =
        r;
    let parsed = (
        InventoryStatus::parse(&inv),
        OperationalStatus::parse(&op),
        HealthStatus::parse(&health),
    );
    let (Ok(inventory), Ok(operational), Ok(health)) = parsed else {
        tracing::error!(device_id = %id, "a stored status is outside its vocabulary; not projected");
        return None;
    };
    if let Some(a) = &annotations {
        if a.get(mapping::RADAR_IGNORE).is_some() {
            if let Err(e) = mapping::validate_annotations(a) {
                tracing::warn!(device_id = %id, error = %e, "the owning tenant's radar_ignore is invalid and not honoured");
            }
        }
    }
    Some(Row {
        id,
        site,
        name,
        version,
        device: RadarDevice {
            inventory_only,
            inventory,
            operational,
            health,
            in_triage,
            deleted,
            opted_out: mapping::opted_out(annotations.as_ref()),
        },
    })
}

/// Every device, deleted ones included (they may need a tombstone).
pub async fn all(pool: &PgPool) -> Result<Vec<Row>, sqlx::Error> {
    let rows: Vec<Raw> = sqlx::query_as(SELECT).fetch_all(pool).await?;
    Ok(rows.into_iter().filter_map(row).collect())
}

pub async fn by_ids(pool: &PgPool, ids: &[String]) -> Result<Vec<Row>, sqlx::Error> {
    let rows: Vec<Raw> = sqlx::query_as(&format!("{SELECT} WHERE d.id = ANY($1)"))
        .bind(ids)
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().filter_map(row).collect())
}

/// The devices a tenant owns (directly or through its pool).
pub async fn of_tenant(pool: &PgPool, tenant_id: &str) -> Result<Vec<Row>, sqlx::Error> {
    let rows: Vec<Raw> = sqlx::query_as(&format!(
        "{SELECT} WHERE COALESCE(d.owner_tenant_id, p.owner_tenant_id) = $1"
    ))
    .bind(tenant_id)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().filter_map(row).collect())
}

/// Sets (with its reason) or clears a tenant's opt-out; `None` when the
/// tenant does not exist. Returns the annotations after the change.
pub async fn set_radar_ignore(
    pool: &PgPool,
    tenant_id: &str,
    ignore: bool,
    reason: &str,
) -> Result<Option<serde_json::Value>, sqlx::Error> {
    if ignore {
        sqlx::query_scalar(
            "UPDATE tenants SET annotations = annotations || jsonb_build_object('radar_ignore', true, \
             'radar_ignore_reason', $2::text) WHERE id = $1 RETURNING annotations",
        )
        .bind(tenant_id)
        .bind(reason)
        .fetch_optional(pool)
        .await
    } else {
        sqlx::query_scalar(
            "UPDATE tenants SET annotations = annotations - 'radar_ignore' - 'radar_ignore_reason' \
             WHERE id = $1 RETURNING annotations",
        )
        .bind(tenant_id)
        .fetch_optional(pool)
        .await
    }
}
