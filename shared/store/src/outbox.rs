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

pub async fn insert(
    tx: &mut Transaction<'_, Postgres>,
    rows: &[OutboxRow],
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let subjects: Vec<&str> = rows.iter().map(|r| r.subject.as_str()).collect();
    let schemas: Vec<&str> = rows.iter().map(|r| r.schema.as_str()).collect();
    let payloads: Vec<&[u8]> = rows.iter().map(|r| r.payload.as_slice()).collect();
    let traces: Vec<Option<&str>> = rows.iter().map(|r| r.traceparent.as_deref()).collect();
    sqlx::query(
        "INSERT INTO outbox (subject, schema, payload, traceparent) \
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::bytea[], $4::text[])",
    )
    .bind(&subjects)
    .bind(&schemas)
    .bind(&payloads)
    .bind(&traces)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The oldest pending rows, locked so that two relays (two hub replicas)
/// never publish the same row at once.
pub async fn pending(
    tx: &mut Transaction<'_, Postgres>,
    limit: i64,
) -> Result<Vec<PendingRow>, sqlx::Error> {
    let rows: Vec<(i64, String, String, Vec<u8>, Option<String>)> = sqlx::query_as(
        "SELECT id, subject, schema, payload, traceparent FROM outbox ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
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

pub async fn delete(tx: &mut Transaction<'_, Postgres>, ids: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM outbox WHERE id = ANY($1)")
        .bind(ids)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
