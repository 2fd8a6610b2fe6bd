//! What the hub's tests share beyond `fleet_testkit`: a hub running on a
//! fresh environment, and the reads and waits most tests repeat.

use chrono::Utc;
use fleet_proto::v1;
use sqlx::postgres::PgRow;

pub use fleet_testkit::*;

/// A fresh environment with a hub running against it.
pub async fn start() -> (TestEnv, RunningHub) {
    let env = TestEnv::new().await;
    let hub = RunningHub::start(&env).await;
    (env, hub)
}

/// Waits until the device `id`'s `column` reads `value`.
pub async fn eventually_field(env: &TestEnv, id: &str, column: &str, value: &str) {
    eventually(&format!("{column} {value}"), || async {
        (env.device_field(id, column).await == value).then_some(())
    })
    .await;
}

/// Every row `sql` selects with `arg` (mostly a device's id) as its `$1`.
pub async fn rows<T>(env: &TestEnv, sql: &str, arg: &str) -> Vec<T>
where
    T: for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin,
{
    sqlx::query_as(sql)
        .bind(arg)
        .fetch_all(&env.pool)
        .await
        .unwrap()
}

/// The first of [`rows`], if there is one.
pub async fn optional_row<T>(env: &TestEnv, sql: &str, arg: &str) -> Option<T>
where
    T: for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin,
{
    rows(env, sql, arg).await.into_iter().next()
}

/// The first of [`rows`]; there must be one.
pub async fn row<T>(env: &TestEnv, sql: &str, arg: &str) -> T
where
    T: for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin,
{
    optional_row(env, sql, arg)
        .await
        .unwrap_or_else(|| panic!("no row for {arg}: {sql}"))
}

/// The values of [`rows`] of one column.
pub async fn scalars<T>(env: &TestEnv, sql: &str, arg: &str) -> Vec<T>
where
    (T,): for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin,
{
    let all: Vec<(T,)> = rows(env, sql, arg).await;
    all.into_iter().map(|(v,)| v).collect()
}

/// The value of [`row`] of one column.
pub async fn scalar<T>(env: &TestEnv, sql: &str, arg: &str) -> T
where
    (T,): for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin,
{
    row::<(T,)>(env, sql, arg).await.0
}

/// Waits until the count `sql` selects with `arg` as its `$1` is `n`.
pub async fn eventually_count(env: &TestEnv, what: &str, sql: &str, arg: &str, n: i64) {
    eventually(what, || async {
        (scalar::<i64>(env, sql, arg).await == n).then_some(())
    })
    .await;
}

/// A hub command: `source` writes `condition` of the device `id` (at s1),
/// observed `at`.
pub fn write_condition(
    source: &str,
    id: &str,
    condition: v1::Condition,
    at: chrono::DateTime<Utc>,
) -> v1::hub_command::Command {
    v1::hub_command::Command::WriteCondition(v1::ConditionWrite {
        source: source.into(),
        device: Some(v1::DeviceKey {
            site: "s1".into(),
            kind: "device_id".into(),
            key: id.into(),
        }),
        condition: Some(condition),
        observed_at: Some(fleet_proto::timestamp(at)),
        hub_ordered: false,
    })
}

/// A hub reply's error code, `OK` when it has none.
pub fn error_code(r: &v1::HubReply) -> &str {
    r.error
        .as_ref()
        .map(|e| fleet_proto::error_code_of(e.code).as_str_name())
        .unwrap_or("OK")
}

/// The hub's refusal in `r`, checked to carry `code`.
pub fn refusal(r: v1::HubReply, code: fleet_proto::ErrorCode) -> v1::HubError {
    let e = r.error.expect("refused");
    assert_eq!(fleet_proto::error_code_of(e.code), code, "{e:?}");
    e
}

/// Holds the device `id` the way a lane's batch or a command's unit of work
/// does, until the transaction returned ends.
pub async fn hold(env: &TestEnv, id: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = env.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM devices WHERE id = $1 FOR NO KEY UPDATE")
        .bind(id)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx
}
