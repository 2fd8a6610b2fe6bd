//! Bearer tokens with scopes. A token is shown once at creation and stored
//! as its SHA-256; a missing or unknown token is 401, a missing scope 403.
//! Verified tokens are cached for `api.token_cache_ttl`, so a revocation
//! takes at most that long to bite.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::error::{ApiError, Code};
use crate::App;

/// The scopes of `spec/api.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    DeviceRead,
    DeviceWrite,
    ConditionsWrite,
    EnrollmentProofWrite,
    OperationsWrite,
    JobsWrite,
    /// An operator's confirmation of a job or an impairment event the
    /// storm guard holds (apart from `jobs:write`: who may ask is not
    /// always who may confirm).
    JobsConfirm,
    Admin,
}

impl Scope {
    pub const ALL: &'static [Scope] = &[
        Scope::DeviceRead,
        Scope::DeviceWrite,
        Scope::ConditionsWrite,
        Scope::EnrollmentProofWrite,
        Scope::OperationsWrite,
        Scope::JobsWrite,
        Scope::JobsConfirm,
        Scope::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::DeviceRead => "device:read",
            Scope::DeviceWrite => "device:write",
            Scope::ConditionsWrite => "conditions:write",
            Scope::EnrollmentProofWrite => "enrollment-proof:write",
            Scope::OperationsWrite => "operations:write",
            Scope::JobsWrite => "jobs:write",
            Scope::JobsConfirm => "jobs:confirm",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.iter().copied().find(|x| x.as_str() == s)
    }
}

/// The SHA-256 of a token, hex: what `api_tokens.token_sha256` holds.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Creates a token with `scopes`; returns `(id, token)`. The token itself
/// is not stored and cannot be shown again.
pub async fn create_token(
    pool: &PgPool,
    scopes: &[Scope],
    description: &str,
) -> Result<(String, String), sqlx::Error> {
    let mut secret = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut secret);
    let token = format!("fleet_{}", hex::encode(secret));
    let id = format!("tok_{}", ulid::Ulid::new());
    let scopes: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    sqlx::query(
        "INSERT INTO api_tokens (id, token_sha256, scopes, description) VALUES ($1, $2, $3, $4)",
    )
    .bind(&id)
    .bind(hash_token(&token))
    .bind(&scopes)
    .bind(description)
    .execute(pool)
    .await?;
    Ok((id, token))
}

/// Who is calling, for the hub's `actor` and the audit columns.
#[derive(Debug, Clone)]
pub struct Caller {
    pub token_id: String,
    pub scopes: Vec<Scope>,
}

pub struct TokenCache {
    /// Token hash to caller, each entry for `api.token_cache_ttl` at most
    /// (a revoked token is refused within that), 10,000 entries at most.
    entries: moka::sync::Cache<String, Caller>,
}

impl TokenCache {
    pub fn new(ttl: Duration) -> TokenCache {
        TokenCache {
            entries: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(ttl)
                .build(),
        }
    }
}

async fn verify(app: &App, token: &str) -> Result<Caller, ApiError> {
    let hash = hash_token(token);
    if let Some(c) = app.tokens.entries.get(&hash) {
        return Ok(c);
    }
    let row: Option<(String, Vec<String>)> = sqlx::query_as(
        "SELECT id, scopes FROM api_tokens WHERE token_sha256 = $1 AND revoked_at IS NULL",
    )
    .bind(&hash)
    .fetch_optional(&app.pool)
    .await?;
    let Some((token_id, scopes)) = row else {
        return Err(ApiError::new(Code::Unauthenticated, "unknown token"));
    };
    let caller = Caller {
        token_id,
        scopes: scopes.iter().filter_map(|s| Scope::parse(s)).collect(),
    };
    app.tokens.entries.insert(hash, caller.clone());
    Ok(caller)
}

/// The middleware every scoped route carries: 401 without a known token,
/// 403 without `scope`.
pub async fn require(
    State((app, scope)): State<(App, Scope)>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // The scheme is case-insensitive (RFC 9110).
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::new(
                Code::Unauthenticated,
                "a bearer token is required (Authorization: Bearer <token>)",
            )
        })?;
    let caller = verify(&app, token).await?;
    if !caller.scopes.contains(&scope) {
        return Err(ApiError::new(
            Code::Forbidden,
            format!("this route needs scope {}", scope.as_str()),
        )
        .with_details(serde_json::json!({"required_scope": scope.as_str()})));
    }
    req.extensions_mut().insert(caller);
    Ok(next.run(req).await)
}
