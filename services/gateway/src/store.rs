//! The gateway's queries. It writes only its own tables (`join_tokens`,
//! `agent_credentials`, `agent_sessions`); devices are the hub's and are
//! only read here.

use chrono::{DateTime, Utc};
use fleet_domain::Trust;
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::policy::{Inventory, Profile};

pub fn sha256_hex(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A random secret: 32 bytes, hex.
pub fn new_secret() -> String {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// What a valid join token grants.
#[derive(Debug, Clone)]
pub struct JoinGrant {
    pub site_id: String,
    pub pool_id: Option<String>,
    pub trust: Trust,
    pub owner_tenant_id: Option<String>,
}

/// A join token that is known, not revoked and not expired.
pub async fn join_grant(pool: &PgPool, token: &str) -> Result<Option<JoinGrant>, sqlx::Error> {
    let row: Option<(String, Option<String>, String, Option<String>)> = sqlx::query_as(
        "SELECT site_id, pool_id, trust, owner_tenant_id FROM join_tokens \
         WHERE token_sha256 = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())",
    )
    .bind(sha256_hex(token))
    .fetch_optional(pool)
    .await?;
    Ok(row.and_then(|(site_id, pool_id, trust, owner_tenant_id)| {
        Some(JoinGrant {
            site_id,
            pool_id,
            trust: Trust::parse(&trust).ok()?,
            owner_tenant_id,
        })
    }))
}

/// Issues a join token; returns it (shown once; stored hashed).
pub async fn issue_join_token(
    pool: &PgPool,
    site_id: &str,
    pool_id: Option<&str>,
    trust: Trust,
    owner_tenant_id: Option<&str>,
    description: &str,
    expires_at: Option<DateTime<Utc>>,
) -> Result<String, sqlx::Error> {
    let token = format!("fjt_{}", new_secret());
    sqlx::query(
        "INSERT INTO join_tokens (id, token_sha256, site_id, pool_id, trust, owner_tenant_id, description, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(format!("jt_{}", ulid::Ulid::new()))
    .bind(sha256_hex(&token))
    .bind(site_id)
    .bind(pool_id)
    .bind(trust.as_str())
    .bind(owner_tenant_id)
    .bind(description)
    .bind(expires_at)
    .execute(pool)
    .await?;
    Ok(token)
}

/// Issues one credential per `(device, identity generation)`, in one
/// statement (one commit for a batch of joins); the secrets in order
/// (shown once, stored hashed).
pub async fn issue_credentials(
    pool: &PgPool,
    grants: &[(&str, i64)],
) -> Result<Vec<String>, sqlx::Error> {
    if grants.is_empty() {
        return Ok(vec![]);
    }
    let secrets: Vec<String> = grants
        .iter()
        .map(|_| format!("fdc_{}", new_secret()))
        .collect();
    let ids: Vec<String> = grants
        .iter()
        .map(|_| format!("cred_{}", ulid::Ulid::new()))
        .collect();
    let devices: Vec<&str> = grants.iter().map(|(d, _)| *d).collect();
    let generations: Vec<i64> = grants.iter().map(|(_, g)| *g).collect();
    let hashes: Vec<String> = secrets.iter().map(|s| sha256_hex(s)).collect();
    sqlx::query(
        "INSERT INTO agent_credentials (id, device_id, identity_generation, secret_sha256) \
         SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[])",
    )
    .bind(&ids)
    .bind(&devices)
    .bind(&generations)
    .bind(&hashes)
    .execute(pool)
    .await?;
    Ok(secrets)
}

/// A device as the gateway reads it.
#[derive(Debug, Clone)]
pub struct DeviceFacts {
    pub id: String,
    pub site_id: String,
    pub pool_id: Option<String>,
    pub trust: Trust,
    pub identity_generation: i64,
    pub deleted: bool,
    pub session_epoch: i64,
    pub gpu_count: Option<i32>,
    pub provision_state: String,
    pub version: i64,
}

pub async fn device(pool: &PgPool, id: &str) -> Result<Option<DeviceFacts>, sqlx::Error> {
    type Row = (
        String,
        String,
        Option<String>,
        String,
        i64,
        bool,
        i64,
        Option<i32>,
        String,
        i64,
    );
    let row: Option<Row> = sqlx::query_as(
        "SELECT id, site_id, pool_id, trust, identity_generation, deleted_at IS NOT NULL, session_epoch, \
         gpu_count, provision_state, version FROM devices WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| DeviceFacts {
        id: r.0,
        site_id: r.1,
        pool_id: r.2,
        trust: Trust::parse(&r.3).unwrap_or(Trust::TenantControlled),
        identity_generation: r.4,
        deleted: r.5,
        session_epoch: r.6,
        gpu_count: r.7,
        provision_state: r.8,
        version: r.9,
    }))
}

/// The identity generation a credential was issued for, when it is this
/// device's.
pub async fn credential_generation(
    pool: &PgPool,
    device_id: &str,
    secret: &str,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT identity_generation FROM agent_credentials WHERE secret_sha256 = $1 AND device_id = $2")
        .bind(sha256_hex(secret))
        .bind(device_id)
        .fetch_optional(pool)
        .await
}

pub async fn profile(pool: &PgPool, pool_id: &str) -> Result<Option<Profile>, sqlx::Error> {
    let row: Option<(i32, String)> = sqlx::query_as(
        "SELECT gpu_count, gpu_model FROM pool_hardware_profiles WHERE pool_id = $1",
    )
    .bind(pool_id)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(n, m)| Profile {
        gpu_count: n.max(0) as u32,
        gpu_model: m,
    }))
}

/// The session row as stored.
#[derive(Debug, Clone)]
pub struct SessionRow {
    pub device_id: String,
    pub epoch: i64,
    pub identity_generation: i64,
    pub token_sha256: String,
    pub site_id: String,
    pub trust: Trust,
    pub closed: bool,
    pub close_reason: Option<String>,
    pub inventory: Inventory,
}

fn inventory_json(inv: &Inventory) -> serde_json::Value {
    serde_json::json!({"gpu_count": inv.gpu_count, "gpu_model": inv.gpu_model})
}

fn inventory_from(v: &serde_json::Value) -> Inventory {
    Inventory {
        gpu_count: v["gpu_count"].as_u64().unwrap_or(0).min(u32::MAX as u64) as u32,
        gpu_model: v["gpu_model"].as_str().unwrap_or_default().to_string(),
    }
}

/// A session to open (`open_sessions`).
#[derive(Debug, Clone)]
pub struct SessionOpen {
    pub device_id: String,
    /// The epoch the hub holds for the device: the new one is above both
    /// it and the stored session's.
    pub hub_epoch: i64,
    pub identity_generation: i64,
    pub token_sha256: String,
    pub site_id: String,
    pub trust: Trust,
    pub inventory: Inventory,
}

/// Opens the sessions (a new epoch each) in one statement; the epochs in
/// order. The devices must be distinct.
pub async fn open_sessions(
    pool: &PgPool,
    gateway_id: &str,
    opens: &[SessionOpen],
) -> Result<Vec<i64>, sqlx::Error> {
    if opens.is_empty() {
        return Ok(vec![]);
    }
    let devices: Vec<&str> = opens.iter().map(|o| o.device_id.as_str()).collect();
    let hub_epochs: Vec<i64> = opens.iter().map(|o| o.hub_epoch).collect();
    let generations: Vec<i64> = opens.iter().map(|o| o.identity_generation).collect();
    let tokens: Vec<&str> = opens.iter().map(|o| o.token_sha256.as_str()).collect();
    let sites: Vec<&str> = opens.iter().map(|o| o.site_id.as_str()).collect();
    let trusts: Vec<&str> = opens.iter().map(|o| o.trust.as_str()).collect();
    let inventories: Vec<serde_json::Value> =
        opens.iter().map(|o| inventory_json(&o.inventory)).collect();
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "INSERT INTO agent_sessions AS s (device_id, epoch, identity_generation, token_sha256, gateway_id, \
         site_id, trust, inventory) \
         SELECT o.device_id, o.hub_epoch + 1, o.generation, o.token, $5, o.site_id, o.trust, o.inventory \
         FROM unnest($1::text[], $2::int8[], $3::int8[], $4::text[], $6::text[], $7::text[], $8::jsonb[]) \
              AS o(device_id, hub_epoch, generation, token, site_id, trust, inventory) \
         ON CONFLICT (device_id) DO UPDATE SET epoch = GREATEST(s.epoch, EXCLUDED.epoch - 1) + 1, \
         identity_generation = EXCLUDED.identity_generation, token_sha256 = EXCLUDED.token_sha256, \
         gateway_id = EXCLUDED.gateway_id, site_id = EXCLUDED.site_id, trust = EXCLUDED.trust, \
         inventory = EXCLUDED.inventory, opened_at = now(), closed_at = NULL, close_reason = NULL \
         RETURNING device_id, epoch",
    )
    .bind(&devices)
    .bind(&hub_epochs)
    .bind(&generations)
    .bind(&tokens)
    .bind(gateway_id)
    .bind(&sites)
    .bind(&trusts)
    .bind(&inventories)
    .fetch_all(pool)
    .await?;
    let epochs: std::collections::HashMap<String, i64> = rows.into_iter().collect();
    devices
        .iter()
        .map(|d| {
            epochs.get(*d).copied().ok_or_else(|| {
                sqlx::Error::Protocol(format!("no session row came back for device {d}"))
            })
        })
        .collect()
}

pub async fn sessions(
    pool: &PgPool,
    device_ids: &[String],
) -> Result<Vec<SessionRow>, sqlx::Error> {
    type Row = (
        String,
        i64,
        i64,
        String,
        String,
        String,
        bool,
        Option<String>,
        serde_json::Value,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT device_id, epoch, identity_generation, token_sha256, site_id, trust, closed_at IS NOT NULL, \
         close_reason, inventory FROM agent_sessions WHERE device_id = ANY($1)",
    )
    .bind(device_ids)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| SessionRow {
            device_id: r.0,
            epoch: r.1,
            identity_generation: r.2,
            token_sha256: r.3,
            site_id: r.4,
            trust: Trust::parse(&r.5).unwrap_or(Trust::TenantControlled),
            closed: r.6,
            close_reason: r.7,
            inventory: inventory_from(&r.8),
        })
        .collect())
}

/// Closes the session `epoch` of a device (no-op when it is not the
/// current one or already closed); true when it closed it.
pub async fn close_session(
    pool: &PgPool,
    device_id: &str,
    epoch: i64,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE agent_sessions SET closed_at = now(), close_reason = $3 \
         WHERE device_id = $1 AND epoch = $2 AND closed_at IS NULL",
    )
    .bind(device_id)
    .bind(epoch)
    .bind(reason)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub async fn set_inventory(
    pool: &PgPool,
    device_id: &str,
    epoch: i64,
    inv: &Inventory,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE agent_sessions SET inventory = $3 WHERE device_id = $1 AND epoch = $2")
        .bind(device_id)
        .bind(epoch)
        .bind(inventory_json(inv))
        .execute(pool)
        .await?;
    Ok(())
}

/// For live sessions: the device's current identity generation, whether
/// it is deleted, its trust, and the session's stored epoch and state.
pub struct IdentityCheck {
    pub device_id: String,
    pub identity_generation: i64,
    pub deleted: bool,
    pub trust: Trust,
    pub pool_id: Option<String>,
    pub session_epoch: Option<i64>,
    pub session_closed: bool,
}

pub async fn identity_checks(
    pool: &PgPool,
    device_ids: &[String],
) -> Result<Vec<IdentityCheck>, sqlx::Error> {
    type Row = (
        String,
        i64,
        bool,
        String,
        Option<String>,
        Option<i64>,
        Option<bool>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT d.id, d.identity_generation, d.deleted_at IS NOT NULL, d.trust, d.pool_id, s.epoch, \
         s.closed_at IS NOT NULL FROM devices d LEFT JOIN agent_sessions s ON s.device_id = d.id \
         WHERE d.id = ANY($1)",
    )
    .bind(device_ids)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| IdentityCheck {
            device_id: r.0,
            identity_generation: r.1,
            deleted: r.2,
            trust: Trust::parse(&r.3).unwrap_or(Trust::TenantControlled),
            pool_id: r.4,
            session_epoch: r.5,
            session_closed: r.6.unwrap_or(true),
        })
        .collect())
}
