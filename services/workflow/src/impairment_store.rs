//! The SQL of impairment events: the event and its devices, owned by the
//! workflow service's role (the API reads them).

use fleet_domain::impairment::{event_status, EventDeviceStatus, EventStatus};
use sqlx::{PgPool, Postgres, Transaction};

/// One device of an event, with what its step needs of the device (read
/// in the same statement; `present` is false once the device is gone).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct EventDevice {
    pub device_id: String,
    pub status: String,
    pub placement_action: Option<String>,
    pub attempts: i32,
    pub present: bool,
    pub site_id: Option<String>,
    pub infrastructure_ref: Option<String>,
    pub impairment_hold: Option<String>,
}

/// One device a new event names: `(id, operational_status, placement_enabled)`.
pub(crate) type Named = (String, String, bool);

/// Serialises event creation per device and reads the named devices; two
/// events created at once for one device cannot both pass the busy check.
pub(crate) async fn lock_and_read(
    tx: &mut Transaction<'_, Postgres>,
    ids: &[String],
) -> Result<Vec<Named>, sqlx::Error> {
    sqlx::query(
        "SELECT pg_advisory_xact_lock(hashtext('fleet-impairment-device:' || d)) \
         FROM unnest($1::text[]) AS d ORDER BY d",
    )
    .bind(ids)
    .execute(&mut **tx)
    .await?;
    sqlx::query_as(
        "SELECT d.id, d.operational_status, s.placement_enabled FROM devices d \
         JOIN sites s ON s.id = d.site_id WHERE d.id = ANY($1) AND d.deleted_at IS NULL ORDER BY d.id",
    )
    .bind(ids)
    .fetch_all(&mut **tx)
    .await
}

/// `(device_id, event_id)` of the devices of `ids` that carry a hold, or
/// belong to an event that has not let go of them yet (its cordon or
/// release is still to run, or the device is cordoned).
pub(crate) async fn busy(
    tx: &mut Transaction<'_, Postgres>,
    ids: &[String],
) -> Result<Vec<(String, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, impairment_hold FROM devices WHERE id = ANY($1) AND impairment_hold IS NOT NULL \
         UNION SELECT device_id, event_id FROM impairment_event_devices WHERE device_id = ANY($1) \
         AND status IN ('pending', 'retrying', 'cordoned', 'release_pending', 'release_retrying', 'release_failed') \
         ORDER BY 1, 2",
    )
    .bind(ids)
    .fetch_all(&mut **tx)
    .await
}

pub(crate) async fn insert_event(
    tx: &mut Transaction<'_, Postgres>,
    id: &str,
    reason: &str,
    ticket_url: Option<&str>,
    created_by: &str,
    devices: &[Named],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO impairment_events (id, status, reason, ticket_url, created_by) \
         VALUES ($1, 'accepted', $2, $3, $4)",
    )
    .bind(id)
    .bind(reason)
    .bind(ticket_url)
    .bind(created_by)
    .execute(&mut **tx)
    .await?;
    let ids: Vec<&str> = devices.iter().map(|d| d.0.as_str()).collect();
    let statuses: Vec<&str> = devices.iter().map(|d| d.1.as_str()).collect();
    let placement: Vec<bool> = devices.iter().map(|d| d.2).collect();
    sqlx::query(
        "INSERT INTO impairment_event_devices (event_id, device_id, status, pre_hold_operational_status, \
         placement_action, placement_status) \
         SELECT $1, d, 'pending', s, CASE WHEN p THEN 'remove_customer_ready_trait' END, \
         CASE WHEN p THEN 'pending' END \
         FROM unnest($2::text[], $3::text[], $4::bool[]) AS t(d, s, p)",
    )
    .bind(id)
    .bind(&ids)
    .bind(&statuses)
    .bind(&placement)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The event's status and whether the storm guard holds it, locked for a
/// clear.
pub(crate) async fn lock_event(
    tx: &mut Transaction<'_, Postgres>,
    id: &str,
) -> Result<Option<(String, bool)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT status, awaiting_confirmation FROM impairment_events WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut **tx)
    .await
}

/// Queues the release of every device not cleared yet; a pre-hold
/// available or in_use host at a Placement site gets its trait restored
/// (the caller passes which pre-hold statuses restore). Returns the devices
/// queued.
pub(crate) async fn queue_release(
    tx: &mut Transaction<'_, Postgres>,
    id: &str,
    restoring: &[&str],
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query(
        "UPDATE impairment_events SET status = 'release_pending', updated_at = now() WHERE id = $1",
    )
    .bind(id)
    .execute(&mut **tx)
    .await?;
    sqlx::query_scalar(
        "UPDATE impairment_event_devices x SET status = 'release_pending', attempts = 0, \
         error_code = NULL, error_message = NULL, updated_at = now(), \
         placement_action = CASE WHEN s.placement_enabled AND x.pre_hold_operational_status = ANY($2) \
           THEN 'restore_customer_ready_trait' END, \
         placement_status = CASE WHEN s.placement_enabled AND x.pre_hold_operational_status = ANY($2) \
           THEN 'pending' END \
         FROM devices d JOIN sites s ON s.id = d.site_id \
         WHERE x.event_id = $1 AND x.status <> 'cleared' AND d.id = x.device_id \
         RETURNING x.device_id",
    )
    .bind(id)
    .bind(restoring)
    .fetch_all(&mut **tx)
    .await
}

pub(crate) async fn device(
    pool: &PgPool,
    event: &str,
    device: &str,
) -> Result<Option<EventDevice>, sqlx::Error> {
    sqlx::query_as(
        "SELECT x.device_id, x.status, x.placement_action, x.attempts, \
         (d.id IS NOT NULL AND d.deleted_at IS NULL) AS present, d.site_id, d.infrastructure_ref, \
         d.impairment_hold FROM impairment_event_devices x LEFT JOIN devices d ON d.id = x.device_id \
         WHERE x.event_id = $1 AND x.device_id = $2",
    )
    .bind(event)
    .bind(device)
    .fetch_optional(pool)
    .await
}

/// A transient failure of the device's step: its retrying status, the
/// attempt and the error so far. A release that retries marks the event
/// `release_retrying`.
pub(crate) async fn retrying(
    pool: &PgPool,
    event: &str,
    device: &str,
    status: EventDeviceStatus,
    attempts: u32,
    code: &str,
    message: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE impairment_event_devices SET status = $3, attempts = $4, error_code = $5, \
         error_message = $6, updated_at = now() WHERE event_id = $1 AND device_id = $2",
    )
    .bind(event)
    .bind(device)
    .bind(status.as_str())
    .bind(attempts as i32)
    .bind(code)
    .bind(message)
    .execute(pool)
    .await?;
    if status == EventDeviceStatus::ReleaseRetrying {
        sqlx::query(
            "UPDATE impairment_events SET status = 'release_retrying', updated_at = now() \
             WHERE id = $1 AND status = 'release_pending'",
        )
        .bind(event)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// The device's phase is over: its status, the Placement work's outcome
/// and the failure, if any.
pub(crate) async fn finish(
    pool: &PgPool,
    event: &str,
    device: &str,
    status: EventDeviceStatus,
    placement_status: Option<&str>,
    failure: Option<(&str, &str)>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE impairment_event_devices SET status = $3, \
         placement_status = CASE WHEN placement_action IS NULL THEN NULL ELSE COALESCE($4, placement_status) END, \
         error_code = $5, error_message = $6, updated_at = now() \
         WHERE event_id = $1 AND device_id = $2",
    )
    .bind(event)
    .bind(device)
    .bind(status.as_str())
    .bind(placement_status)
    .bind(failure.map(|f| f.0))
    .bind(failure.map(|f| f.1))
    .execute(pool)
    .await?;
    Ok(())
}

/// Settles the event once none of its devices is left to work on: its
/// status from theirs (`fleet_domain::impairment::event_status`). The
/// question "any left?" reads one row of a partial index; only the device
/// that finishes last (or the few finishing with it) computes the whole.
/// Each device's status is committed before its settle asks, so the last
/// one always sees every other's.
pub(crate) async fn settle(pool: &PgPool, event: &str) -> Result<Option<EventStatus>, sqlx::Error> {
    let open: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM impairment_event_devices WHERE event_id = $1 \
         AND status IN ('pending', 'retrying', 'release_pending', 'release_retrying'))",
    )
    .bind(event)
    .fetch_one(pool)
    .await?;
    if open {
        return Ok(None);
    }
    let mut tx = pool.begin().await?;
    if lock_event(&mut tx, event).await?.is_none() {
        return Ok(None);
    }
    let statuses: Vec<String> =
        sqlx::query_scalar("SELECT status FROM impairment_event_devices WHERE event_id = $1")
            .bind(event)
            .fetch_all(&mut *tx)
            .await?;
    let statuses: Vec<EventDeviceStatus> = statuses
        .iter()
        .filter_map(|s| EventDeviceStatus::parse(s).ok())
        .collect();
    let status = event_status(&statuses);
    let moved = sqlx::query(
        "UPDATE impairment_events SET status = $2, updated_at = now(), \
         cleared_at = CASE WHEN $2 = 'cleared' THEN now() ELSE cleared_at END \
         WHERE id = $1 AND status <> $2",
    )
    .bind(event)
    .bind(status.as_str())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    // Only the call that moved the event reports it: the last devices'
    // workers all find nothing open, one of them settles it.
    Ok((moved > 0).then_some(status))
}
