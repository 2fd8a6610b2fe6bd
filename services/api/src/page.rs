//! Cursor pagination. A cursor is opaque to callers: the hex of the JSON
//! array of the sort key of the last row served. Lists are keyset-paged on
//! immutable keys, so every row is served exactly once across pages even
//! while rows are updated.

use serde::de::DeserializeOwned;
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::query_builder::Separated;
use sqlx::{Encode, FromRow, Postgres, QueryBuilder, Type};

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

        impl $name {
            /// The page asked for: `limit` checked, `cursor` decoded.
            pub fn page<K: serde::de::DeserializeOwned>(
                &self,
                app: &crate::App,
            ) -> crate::error::ApiResult<crate::page::Page<K>> {
                crate::page::Page::new(app, self.limit, self.cursor.as_deref())
            }
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

/// One page of a list: its size and the sort key of the last row served
/// before it.
pub struct Page<K> {
    pub limit: i64,
    pub after: Option<K>,
}

impl<K: DeserializeOwned> Page<K> {
    /// Checks `limit`, then decodes `cursor`.
    pub fn new(app: &App, requested: Option<i64>, cursor: Option<&str>) -> ApiResult<Page<K>> {
        Ok(Page {
            limit: limit(app, requested)?,
            after: decode(cursor)?,
        })
    }
}

/// The sort key of a keyset-paged list: its columns, all ascending or all
/// descending.
pub struct Keyset {
    columns: &'static [&'static str],
    descending: bool,
}

impl Keyset {
    pub const fn ascending(columns: &'static [&'static str]) -> Keyset {
        Keyset {
            columns,
            descending: false,
        }
    }

    pub const fn descending(columns: &'static [&'static str]) -> Keyset {
        Keyset {
            columns,
            descending: true,
        }
    }
}

/// One column's value in a cursor's sort key.
pub trait KeyPart:
    Serialize + DeserializeOwned + for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + 'static
{
}

impl<T> KeyPart for T where
    T: Serialize
        + DeserializeOwned
        + for<'q> Encode<'q, Postgres>
        + Type<Postgres>
        + Send
        + 'static
{
}

/// A cursor's sort key: its values bound in column order.
pub trait Key: Serialize + DeserializeOwned + Send {
    fn bind(self, values: &mut Separated<'_, '_, Postgres, &'static str>);
}

/// A bare id (the inventory lists' cursors).
impl Key for String {
    fn bind(self, values: &mut Separated<'_, '_, Postgres, &'static str>) {
        values.push_bind(self);
    }
}

impl<A: KeyPart> Key for (A,) {
    fn bind(self, values: &mut Separated<'_, '_, Postgres, &'static str>) {
        values.push_bind(self.0);
    }
}

impl<A: KeyPart, B: KeyPart> Key for (A, B) {
    fn bind(self, values: &mut Separated<'_, '_, Postgres, &'static str>) {
        values.push_bind(self.0).push_bind(self.1);
    }
}

impl<A: KeyPart, B: KeyPart, C: KeyPart, D: KeyPart> Key for (A, B, C, D) {
    fn bind(self, values: &mut Separated<'_, '_, Postgres, &'static str>) {
        values
            .push_bind(self.0)
            .push_bind(self.1)
            .push_bind(self.2)
            .push_bind(self.3);
    }
}

impl Keyset {
    /// Appends to a SELECT ending in its WHERE clause the rows after `after`
    /// in this order, and at most `limit` of them.
    fn push<K: Key>(&self, qb: &mut QueryBuilder<'_, Postgres>, after: Option<K>, limit: i64) {
        let (cmp, order) = if self.descending {
            ("<", " DESC")
        } else {
            (">", "")
        };
        if let Some(after) = after {
            match self.columns {
                [one] => {
                    qb.push(format!(" AND {one} {cmp} "));
                    after.bind(&mut qb.separated(", "));
                }
                many => {
                    qb.push(format!(" AND ({}) {cmp} (", many.join(", ")));
                    after.bind(&mut qb.separated(", "));
                    qb.push(")");
                }
            }
        }
        let order: Vec<String> = self.columns.iter().map(|c| format!("{c}{order}")).collect();
        qb.push(format!(" ORDER BY {} LIMIT ", order.join(", ")))
            .push_bind(limit);
    }
}

impl<K: Key> Page<K> {
    /// Runs `qb` (a SELECT ending in its WHERE clause) for this page: the
    /// rows after the cursor in `keyset` order, `limit + 1` of them, split
    /// into the page and the next cursor (`key` of its last row).
    pub async fn fetch<T>(
        self,
        app: &App,
        mut qb: QueryBuilder<'_, Postgres>,
        keyset: Keyset,
        key: impl Fn(&T) -> K,
    ) -> ApiResult<(Vec<T>, Option<String>)>
    where
        T: for<'r> FromRow<'r, PgRow> + Send + Unpin,
    {
        keyset.push(&mut qb, self.after, self.limit + 1);
        let rows: Vec<T> = qb.build_query_as().fetch_all(&app.pool).await?;
        Ok(finish(rows, self.limit, key))
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

    #[test]
    fn keysets_page_in_their_order() {
        let sql = |keyset: Keyset, after: Option<(String, i64)>| {
            let mut qb = QueryBuilder::<Postgres>::new("SELECT * FROM t WHERE true");
            keyset.push(&mut qb, after, 3);
            qb.sql().to_string()
        };
        let two = Keyset::descending(&["e.created_at", "e.id"]);
        assert_eq!(
            sql(two, Some(("x".into(), 1))),
            "SELECT * FROM t WHERE true AND (e.created_at, e.id) < ($1, $2) \
             ORDER BY e.created_at DESC, e.id DESC LIMIT $3"
        );
        let one = || Keyset::ascending(&["d.id"]);
        assert_eq!(
            sql(one(), None),
            "SELECT * FROM t WHERE true ORDER BY d.id LIMIT $1"
        );
        let mut qb = QueryBuilder::<Postgres>::new("SELECT * FROM t WHERE true");
        one().push(&mut qb, Some(("x".to_string(),)), 3);
        assert_eq!(
            qb.sql(),
            "SELECT * FROM t WHERE true AND d.id > $1 ORDER BY d.id LIMIT $2"
        );
    }
}
