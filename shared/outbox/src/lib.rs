//! The transactional outbox, once for every service that announces its
//! changes on the bus (the hub's `outbox`, the placer's `placer_outbox`):
//! rows written in the same transaction as the change they announce,
//! published to JetStream with `Nats-Msg-Id = <prefix><id>` (a crash between
//! commit and publish re-publishes, and the stream's duplicate window drops
//! the copy), deleted once their PubAck arrived.

use std::collections::VecDeque;

use sqlx::{Postgres, Transaction};

/// One outbox table and the dedupe-id prefix of its rows.
#[derive(Debug, Clone, Copy)]
pub struct Outbox {
    /// The table: `id bigserial, subject, schema, payload, traceparent,
    /// created_at`.
    pub table: &'static str,
    /// `Nats-Msg-Id` is the prefix and the row id.
    pub msg_id_prefix: &'static str,
    /// The span each publish runs in, given the subject (span names are
    /// static: one function per outbox).
    pub span: fn(&str) -> tracing::Span,
}

/// The hub's outbox: `StatusChanged` to `STATUS`.
pub const HUB: Outbox = Outbox {
    table: "outbox",
    msg_id_prefix: "outbox-",
    span: |subject| tracing::info_span!("hub.relay", subject = %subject),
};

/// The placer's outbox: allocation events.
pub const PLACER: Outbox = Outbox {
    table: "placer_outbox",
    msg_id_prefix: "placer-",
    span: |subject| tracing::info_span!("placer.relay", subject = %subject),
};

/// A row to write.
#[derive(Debug, Clone)]
pub struct Row {
    pub subject: String,
    pub schema: String,
    pub payload: Vec<u8>,
    pub traceparent: Option<String>,
}

/// A written row, with its id.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Pending {
    pub id: i64,
    pub subject: String,
    pub schema: String,
    pub payload: Vec<u8>,
    pub traceparent: Option<String>,
}

impl Outbox {
    /// Inserts the rows and returns them with their ids, in order.
    pub async fn insert(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        rows: Vec<Row>,
    ) -> Result<Vec<Pending>, sqlx::Error> {
        if rows.is_empty() {
            return Ok(vec![]);
        }
        let subjects: Vec<&str> = rows.iter().map(|r| r.subject.as_str()).collect();
        let schemas: Vec<&str> = rows.iter().map(|r| r.schema.as_str()).collect();
        let payloads: Vec<&[u8]> = rows.iter().map(|r| r.payload.as_slice()).collect();
        let traces: Vec<Option<&str>> = rows.iter().map(|r| r.traceparent.as_deref()).collect();
        // Ids are drawn in the order of the ordered SELECT.
        let mut ids: Vec<i64> = sqlx::query_scalar(&format!(
            "INSERT INTO {} (subject, schema, payload, traceparent) \
             SELECT s, c, p, t FROM UNNEST($1::text[], $2::text[], $3::bytea[], $4::text[]) \
             WITH ORDINALITY AS u(s, c, p, t, n) ORDER BY n RETURNING id",
            self.table
        ))
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
            .map(|(id, r)| Pending {
                id,
                subject: r.subject,
                schema: r.schema,
                payload: r.payload,
                traceparent: r.traceparent,
            })
            .collect())
    }

    /// The oldest rows written at least `older_than_secs` ago, locked so
    /// that two relays (two replicas) never publish the same row at once.
    pub async fn pending(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        limit: i64,
        older_than_secs: f64,
    ) -> Result<Vec<Pending>, sqlx::Error> {
        sqlx::query_as(&format!(
            "SELECT id, subject, schema, payload, traceparent FROM {} \
             WHERE created_at < now() - make_interval(secs => $2) \
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
            self.table
        ))
        .bind(limit)
        .bind(older_than_secs)
        .fetch_all(&mut **tx)
        .await
    }

    /// Deletes published rows.
    pub async fn delete<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        ids: &[i64],
    ) -> Result<(), sqlx::Error> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query(&format!("DELETE FROM {} WHERE id = ANY($1)", self.table))
            .bind(ids)
            .execute(executor)
            .await?;
        Ok(())
    }

    /// Publishes `rows` in order with at most `WINDOW` PubAcks outstanding
    /// (the JetStream context blocks new publishes past its in-flight limit,
    /// so publishing everything before awaiting would deadlock); returns the
    /// acked ids, a prefix of `rows`. Each publish runs in a span that is a
    /// child of the trace that wrote the row, and the message carries it.
    pub async fn publish(&self, js: &async_nats::jetstream::Context, rows: &[Pending]) -> Vec<i64> {
        const WINDOW: usize = 256;
        let mut inflight = VecDeque::with_capacity(WINDOW.min(rows.len()));
        let mut acked = Vec::with_capacity(rows.len());
        let mut failed = false;
        for row in rows {
            if inflight.len() >= WINDOW {
                let (id, ack): (i64, async_nats::jetstream::context::PublishAckFuture) =
                    inflight.pop_front().expect("window is full");
                match ack.await {
                    Ok(_) => acked.push(id),
                    Err(e) => {
                        tracing::warn!(error = %e, table = self.table, outbox_id = id, "no PubAck");
                        failed = true;
                        break;
                    }
                }
            }
            let span = (self.span)(&row.subject);
            if let Some(tp) = &row.traceparent {
                fleet_runtime::telemetry::set_parent_traceparent(&span, tp);
            }
            let tp =
                fleet_runtime::telemetry::traceparent_of(&span).or_else(|| row.traceparent.clone());
            let headers = fleet_bus::headers(&row.schema, tp.as_deref());
            let msg_id = format!("{}{}", self.msg_id_prefix, row.id);
            match fleet_bus::publish(
                js,
                row.subject.clone(),
                &msg_id,
                headers,
                row.payload.clone().into(),
            )
            .await
            {
                Ok(ack) => inflight.push_back((row.id, ack)),
                Err(e) => {
                    tracing::warn!(error = %e, table = self.table, outbox_id = row.id, "publish failed");
                    failed = true;
                    break;
                }
            }
        }
        // Await what is in flight even after a failure: a row stays in the
        // outbox unless its own ack arrived, and a re-publish is deduplicated.
        // All at once: a PubAck's timeout runs from when it is awaited, so
        // one by one, the acks a lost server took would cost one timeout
        // each, holding the caller (a hub lane) for minutes.
        let (ids, acks): (Vec<i64>, Vec<_>) = inflight.into_iter().unzip();
        for (id, ack) in ids.into_iter().zip(
            futures::future::join_all(acks.into_iter().map(std::future::IntoFuture::into_future))
                .await,
        ) {
            match ack {
                Ok(_) if !failed => acked.push(id),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, table = self.table, outbox_id = id, "no PubAck");
                    failed = true;
                }
            }
        }
        acked
    }

    /// One relay round: publishes a page of the rows written at least
    /// `older_than_secs` ago and not in `skip` (rows their writer is
    /// publishing), and deletes the acked ones, in one transaction. Returns
    /// (published, read): fewer published than read means a publish failed
    /// and the rest stays for the next round.
    pub async fn relay_once(
        &self,
        pool: &sqlx::PgPool,
        js: &async_nats::jetstream::Context,
        limit: i64,
        older_than_secs: f64,
        skip: impl Fn(i64) -> bool,
    ) -> Result<(usize, usize), sqlx::Error> {
        let mut tx = pool.begin().await?;
        let rows: Vec<Pending> = self
            .pending(&mut tx, limit, older_than_secs)
            .await?
            .into_iter()
            .filter(|r| !skip(r.id))
            .collect();
        if rows.is_empty() {
            return Ok((0, 0));
        }
        let acked = self.publish(js, &rows).await;
        self.delete(&mut *tx, &acked).await?;
        tx.commit().await?;
        Ok((acked.len(), rows.len()))
    }

    /// Relays until `shutdown`: a round as soon as `wake` is notified (a
    /// writer just committed rows), otherwise every second, the next round
    /// at once while rounds publish a full page; a last round at shutdown.
    /// `published` counts what each round published.
    pub async fn relay_loop(
        &self,
        pool: &sqlx::PgPool,
        js: &async_nats::jetstream::Context,
        wake: &tokio::sync::Notify,
        mut shutdown: fleet_runtime::Shutdown,
        published: impl Fn(usize),
    ) {
        const PAGE: i64 = 500;
        loop {
            match self.relay_once(pool, js, PAGE, 0.0, |_| false).await {
                Ok((acked, read)) => {
                    published(acked);
                    if acked < read {
                        tracing::warn!(
                            outbox = self.table,
                            unacked = read - acked,
                            "outbox rows not acknowledged; retrying"
                        );
                    } else if acked > 0 {
                        continue;
                    }
                }
                Err(e) => {
                    tracing::warn!(outbox = self.table, error = %e, "outbox relay round failed; retrying")
                }
            }
            if shutdown.is_triggered() {
                return;
            }
            tokio::select! {
                _ = wake.notified() => {},
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {},
                _ = shutdown.wait() => {
                    // Flush what is left, then stop.
                    if let Ok((acked, _)) = self.relay_once(pool, js, PAGE, 0.0, |_| false).await {
                        published(acked);
                    }
                    return;
                }
            }
        }
    }
}
