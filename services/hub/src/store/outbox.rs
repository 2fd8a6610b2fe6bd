//! The transactional outbox: rows written in the same transaction as the
//! change they announce, read and deleted by the relay.

use sqlx::{Postgres, Transaction};

#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub subject: String,
    pub schema: String,
    pub payload: Vec<u8>,
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone)]
pub struct PendingRow {
    pub id: i64,
    pub subject: String,
    pub schema: String,
    pub payload: Vec<u8>,
    pub traceparent: Option<String>,
}

/// Inserts the rows and returns them with their ids, in order.
pub async fn insert(
    tx: &mut Transaction<'_, Postgres>,
    rows: Vec<OutboxRow>,
) -> Result<Vec<PendingRow>, sqlx::Error> {
    if rows.is_empty() {
        return Ok(vec![]);
    }
    let subjects: Vec<&str> = rows.iter().map(|r| r.subject.as_str()).collect();
    let schemas: Vec<&str> = rows.iter().map(|r| r.schema.as_str()).collect();
    let payloads: Vec<&[u8]> = rows.iter().map(|r| r.payload.as_slice()).collect();
    let traces: Vec<Option<&str>> = rows.iter().map(|r| r.traceparent.as_deref()).collect();
    // Ids are drawn in the order of the ordered SELECT.
    let mut ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO outbox (subject, schema, payload, traceparent) \
         SELECT s, c, p, t FROM UNNEST($1::text[], $2::text[], $3::bytea[], $4::text[]) \
         WITH ORDINALITY AS u(s, c, p, t, n) ORDER BY n RETURNING id",
    )
    .bind(&subjects)
    .bind(&schemas)
    .bind(&payloads)
    .bind(&traces)
    .fetch_all(&mut **tx)
    .await?;
    ids.sort_unstable();
    Ok(ids
        .into_iter()
        .zip(rows)
        .map(|(id, r)| PendingRow {
            id,
            subject: r.subject,
            schema: r.schema,
            payload: r.payload,
            traceparent: r.traceparent,
        })
        .collect())
}

/// The oldest rows written at least `older_than_secs` ago, locked so that
/// two relays (two hub replicas) never publish the same row at once.
/// Younger rows are left to the writer that publishes them right after its
/// commit.
pub async fn pending(
    tx: &mut Transaction<'_, Postgres>,
    limit: i64,
    older_than_secs: f64,
) -> Result<Vec<PendingRow>, sqlx::Error> {
    let rows: Vec<(i64, String, String, Vec<u8>, Option<String>)> = sqlx::query_as(
        "SELECT id, subject, schema, payload, traceparent FROM outbox \
         WHERE created_at < now() - make_interval(secs => $2) \
         ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .bind(older_than_secs)
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, subject, schema, payload, traceparent)| PendingRow {
            id,
            subject,
            schema,
            payload,
            traceparent,
        })
        .collect())
}

pub async fn delete<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    ids: &[i64],
) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query("DELETE FROM outbox WHERE id = ANY($1)")
        .bind(ids)
        .execute(executor)
        .await?;
    Ok(())
}
