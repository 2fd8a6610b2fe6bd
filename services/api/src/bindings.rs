//! UNI resource attribution (`DeviceResourceBinding`): the device detail's
//! rows and the list filter, with `resolution_status` derived at read time
//! by the same rule as `fleet_domain::binding::resolution_status`.

use fleet_domain::binding::{ResolutionStatus, Resource};
use sqlx::{Postgres, QueryBuilder};

use crate::error::{ApiError, ApiResult};
use crate::model::ResourceBindingOut;
use crate::{conditions, App};

/// `stale` as SQL: failing, never resolved, or last confirmed (the row's
/// `observed_at` or its source's snapshot freshness, the later) longer ago
/// than the source's TTL. Needs `b` and `f` (the freshness row) in scope.
fn push_stale(qb: &mut QueryBuilder<'_, Postgres>, app: &App) {
    qb.push(
        "(b.failed_at IS NOT NULL OR b.resource_id IS NULL OR \
         greatest(b.observed_at, f.observed_at) + ",
    );
    conditions::push_ttl(qb, app, "b.source");
    qb.push(" < now())");
}

const FROM: &str = " FROM device_resource_bindings b LEFT JOIN device_source_freshness f \
    ON f.device_id = b.device_id AND f.source = b.source";

/// A device's bindings, in resource order.
pub async fn of_device(app: &App, device_id: &str) -> ApiResult<Vec<ResourceBindingOut>> {
    let mut qb = QueryBuilder::new(
        "SELECT b.resource, b.resource_id, b.source, b.resolved_at, b.failed_at, b.reason, \
         b.message, greatest(b.observed_at, f.observed_at) AS confirmed_at, \
         CASE WHEN ",
    );
    push_stale(&mut qb, app);
    qb.push(" THEN 'stale' ELSE 'resolved' END AS resolution_status");
    qb.push(FROM);
    qb.push(" WHERE b.device_id = ")
        .push_bind(device_id.to_string())
        .push(" ORDER BY b.resource");
    Ok(qb.build_query_as().fetch_all(&app.pool).await?)
}

/// The list filter `resource_binding=<resource>:<resolution_status>`, for
/// example `placement:stale`: devices with a binding of that resource in
/// that status (a device with no row for the resource matches neither).
pub fn parse_filter(raw: &str) -> ApiResult<(Resource, ResolutionStatus)> {
    let (r, s) = raw.split_once(':').ok_or_else(|| {
        ApiError::invalid(format!(
            "resource_binding {raw:?} is not <resource>:<resolution_status>, e.g. placement:stale"
        ))
    })?;
    Ok((
        Resource::parse(r.trim())?,
        ResolutionStatus::parse(s.trim())?,
    ))
}

pub fn push_filter(
    qb: &mut QueryBuilder<'_, Postgres>,
    app: &App,
    (resource, status): (Resource, ResolutionStatus),
) {
    qb.push(" AND EXISTS (SELECT 1");
    qb.push(FROM);
    qb.push(" WHERE b.device_id = d.id AND b.resource = ")
        .push_bind(resource.as_str());
    qb.push(match status {
        ResolutionStatus::Stale => " AND ",
        ResolutionStatus::Resolved => " AND NOT ",
    });
    push_stale(qb, app);
    qb.push(")");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_names_a_resource_and_a_status() {
        assert_eq!(
            parse_filter("placement:stale").unwrap(),
            (Resource::Placement, ResolutionStatus::Stale)
        );
        assert_eq!(
            parse_filter("uni:resolved").unwrap(),
            (Resource::Uni, ResolutionStatus::Resolved)
        );
        for bad in ["placement", "nova:stale", "placement:fresh"] {
            assert!(parse_filter(bad).is_err(), "{bad}");
        }
    }
}
