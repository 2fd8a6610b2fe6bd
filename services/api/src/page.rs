//! Cursor pagination. A cursor is opaque to callers: the hex of the JSON
//! array of the sort key of the last row served. Lists are keyset-paged on
//! immutable keys, so every row is served exactly once across pages even
//! while rows are updated.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{ApiError, ApiResult};
use crate::App;

/// A list endpoint's query string: its filters, then the page's `limit`
/// and `cursor`. An unknown parameter is refused (400).
macro_rules! page_query {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }) => {
        $(#[$m])*
        #[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
        #[serde(deny_unknown_fields)]
        #[into_params(parameter_in = Query)]
        pub struct $name {
            $($(#[$fm])* pub $f: $t,)*
            /// Page size (default `api.default_page_size`, at most `api.max_page_size`).
            pub limit: Option<i64>,
            /// `next_cursor` of the previous page.
            pub cursor: Option<String>,
        }
    };
}
pub(crate) use page_query;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_garbage() {
        let c = encode(&("dev_01".to_string(), 7i64));
        let back: Option<(String, i64)> = decode(Some(&c)).unwrap();
        assert_eq!(back, Some(("dev_01".into(), 7)));
        assert_eq!(decode::<(String,)>(None).unwrap(), None);
        assert_eq!(decode::<(String,)>(Some("")).unwrap(), None);
        for bad in ["zz", "00", &encode(&(1, 2, 3))] {
            let e = decode::<(String,)>(Some(bad)).unwrap_err();
            assert_eq!(e.code.as_str_name(), "INVALID_ARGUMENT", "{bad}");
        }
    }

    #[test]
    fn a_page_of_limit_plus_one_rows_has_a_next_cursor() {
        let (rows, next) = finish(vec![1, 2, 3], 2, |r| (*r,));
        assert_eq!(rows, vec![1, 2]);
        assert_eq!(decode::<(i32,)>(next.as_deref()).unwrap(), Some((2,)));
        let (rows, next) = finish(vec![1, 2], 2, |r| (*r,));
        assert_eq!((rows, next), (vec![1, 2], None));
    }
}
