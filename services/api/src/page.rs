//! Cursor pagination. A cursor is opaque to callers: the hex of the JSON
//! array of the sort key of the last row served. Lists are keyset-paged on
//! immutable keys, so every row is served exactly once across pages even
//! while rows are updated.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{ApiError, ApiResult};
use crate::App;

pub fn limit(app: &App, requested: Option<i64>) -> ApiResult<i64> {
    match requested {
        None => Ok(app.config.default_page_size),
        Some(n) if n >= 1 && n <= app.config.max_page_size => Ok(n),
        Some(n) => Err(ApiError::invalid(format!(
            "limit {n} is outside 1..={}",
            app.config.max_page_size
        ))),
    }
}

pub fn encode<K: Serialize>(key: &K) -> String {
    hex::encode(serde_json::to_vec(key).unwrap_or_default())
}

pub fn decode<K: DeserializeOwned>(cursor: Option<&str>) -> ApiResult<Option<K>> {
    let Some(c) = cursor.filter(|c| !c.is_empty()) else {
        return Ok(None);
    };
    let bytes = hex::decode(c).map_err(|_| ApiError::invalid("invalid cursor"))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|_| ApiError::invalid("invalid cursor"))
}

/// Splits a fetch of `limit + 1` rows into the page and the next cursor.
pub fn finish<T, K: Serialize>(
    mut rows: Vec<T>,
    limit: i64,
    key: impl Fn(&T) -> K,
) -> (Vec<T>, Option<String>) {
    let limit = limit as usize;
    if rows.len() > limit {
        rows.truncate(limit);
        let next = rows.last().map(|r| encode(&key(r)));
        (rows, next)
    } else {
        (rows, None)
    }
}
