//! Latch drift: devices whose durable fabric latch disagrees with a fresh
//! live observation, by the rule of `fleet_domain::drift` in its SQL form
//! (`fleet_store::drift::list`), with freshness from the hub's TTLs as the
//! API's `stale` reads them.

use axum::extract::State;
use axum::Json;
use fleet_domain::drift::{Drift, PAIRS};
use fleet_domain::{ConditionType, Source};
use fleet_store::drift::{DriftFilter, Freshness};

use crate::error::{ApiError, ApiResult, Q};
use crate::model::*;
use crate::{page, App};

crate::page::page_query! {
    pub struct DriftParams {
        pub site: Option<String>,
        /// The durable latch.
        #[param(schema_with = latch_schema)]
        pub latch: Option<String>,
        #[param(schema_with = drift_schema)]
        pub drift: Option<String>,
    }
}

fn latch(s: &str) -> ApiResult<ConditionType> {
    ConditionType::parse(s)
        .ok()
        .filter(|t| PAIRS.iter().any(|p| p.latch == *t))
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "latch {s:?} is not a fabric latch; one of {}",
                PAIRS
                    .iter()
                    .map(|p| p.latch.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// Drifting (device, latch) pairs, ordered by device id then latch.
#[utoipa::path(get, operation_id = "list_latch_drift", path = "/api/v1/latch-drift/", params(DriftParams),
    responses((status = 200, body = LatchDriftPage), (status = 400, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)),
    tag = "conditions")]
pub async fn list(State(app): State<App>, Q(p): Q<DriftParams>) -> ApiResult<Json<LatchDriftPage>> {
    let limit = page::limit(&app, p.limit)?;
    let filter = DriftFilter {
        site: p.site.clone(),
        latch: p.latch.as_deref().map(latch).transpose()?,
        drift: p
            .drift
            .as_deref()
            .map(|d| {
                Drift::parse(d).ok_or_else(|| {
                    ApiError::invalid(format!("drift {d:?} is not unguarded or stale_guard"))
                })
            })
            .transpose()?,
        after: page::decode(p.cursor.as_deref())?,
    };
    // A TTL configured for a name that is no source cannot apply to a row.
    let per_source: Vec<(Source, chrono::Duration)> = app
        .ttls
        .sources
        .iter()
        .zip(&app.ttls.secs)
        .filter_map(|(s, secs)| {
            Source::parse(s)
                .ok()
                .map(|s| (s, chrono::Duration::seconds(*secs)))
        })
        .collect();
    let fresh = Freshness {
        per_source: &per_source,
        default: chrono::Duration::seconds(app.ttls.default_secs),
    };
    let rows = fleet_store::drift::list(&app.pool, &fresh, &filter, limit + 1).await?;
    let (rows, next_cursor) =
        page::finish(rows, limit, |r| (r.device_id.clone(), r.latch_type.clone()));
    Ok(Json(LatchDriftPage {
        items: rows.into_iter().map(Into::into).collect(),
        next_cursor,
    }))
}
