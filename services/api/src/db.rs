//! Reads of one row by id, shared by the detail endpoints: a missing row
//! is `NOT_FOUND` naming what was asked for.

use sqlx::postgres::PgRow;
use sqlx::FromRow;

use crate::error::{ApiError, ApiResult};
use crate::App;

/// The row `sql` selects with `id` bound as `$1`, or `NOT_FOUND` ("`what`
/// `id` not found").
pub async fn one<T>(app: &App, sql: &str, id: &str, what: &str) -> ApiResult<T>
where
    T: for<'r> FromRow<'r, PgRow> + Send + Unpin,
{
    sqlx::query_as(sql)
        .bind(id)
        .fetch_optional(&app.pool)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("{what} {id}")))
}

/// `NOT_FOUND` ("`what` `id` not found") unless `table` has a row with `id`.
pub async fn require(app: &App, table: &str, id: &str, what: &str) -> ApiResult<()> {
    let exists: bool = sqlx::query_scalar(&format!(
        "SELECT EXISTS (SELECT 1 FROM {table} WHERE id = $1)"
    ))
    .bind(id)
    .fetch_one(&app.pool)
    .await?;
    if exists {
        Ok(())
    } else {
        Err(ApiError::not_found(format!("{what} {id}")))
    }
}
