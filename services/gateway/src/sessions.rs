//! Live sessions: cached per replica, stored in `agent_sessions` so any
//! replica can serve any agent, checked against the device's identity
//! generation, and kept fresh at the hub (`GpuCountMismatch` resync).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fleet_domain::{ConnectivityEvent, Trust};
use fleet_proto::ErrorCode;
use fleet_runtime::Shutdown;

use crate::policy::{Inventory, Profile};
use crate::{store, Gateway, GatewayError};

/// One session as this replica knows it.
#[derive(Debug, Clone)]
pub struct Session {
    pub epoch: i64,
    pub token_sha256: String,
    pub identity_generation: i64,
    pub site_id: String,
    pub pool_id: Option<String>,
    pub trust: Trust,
    pub inventory: Inventory,
    pub last_heartbeat: Instant,
    /// Why it was closed, when this replica closed it; the next heartbeat
    /// of that epoch gets the reason.
    pub closed: Option<ErrorCode>,
}

impl Gateway {
    /// The cached session of a device, loaded from PostgreSQL on a miss
    /// (another replica opened it).
    pub(crate) async fn session(&self, device_id: &str) -> Result<Option<Session>, GatewayError> {
        if let Some(s) = self.sessions().get(device_id) {
            return Ok(Some(s.clone()));
        }
        let rows = store::sessions(&self.deps.pool, &[device_id.to_string()]).await?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        if row.closed {
            return Ok(Some(Session {
                epoch: row.epoch,
                token_sha256: row.token_sha256,
                identity_generation: row.identity_generation,
                site_id: row.site_id,
                pool_id: None,
                trust: row.trust,
                inventory: row.inventory,
                last_heartbeat: Instant::now(),
                closed: Some(if row.close_reason.as_deref() == Some("identity_revoked") {
                    ErrorCode::IdentityRevoked
                } else {
                    ErrorCode::SessionClosed
                }),
            }));
        }
        let device = store::device(&self.deps.pool, device_id).await?;
        let s = Session {
            epoch: row.epoch,
            token_sha256: row.token_sha256,
            identity_generation: row.identity_generation,
            site_id: row.site_id,
            pool_id: device.as_ref().and_then(|d| d.pool_id.clone()),
            trust: row.trust,
            inventory: row.inventory,
            last_heartbeat: Instant::now(),
            closed: None,
        };
        self.sessions().insert(device_id.to_string(), s.clone());
        Ok(Some(s))
    }

    /// Closes a session this replica holds: stored, announced to the hub,
    /// remembered with its reason for the agent's next heartbeat.
    pub(crate) async fn close(
        &self,
        device_id: &str,
        epoch: i64,
        reason: ErrorCode,
    ) -> Result<(), GatewayError> {
        let site = {
            let mut all = self.sessions();
            match all.get_mut(device_id) {
                Some(s) if s.epoch == epoch => {
                    s.closed = Some(reason);
                    s.site_id.clone()
                }
                _ => return Ok(()),
            }
        };
        let db_reason = if reason == ErrorCode::IdentityRevoked {
            "identity_revoked"
        } else {
            "closed"
        };
        if store::close_session(&self.deps.pool, device_id, epoch, db_reason).await? {
            // A close is never refused for its generation: 0.
            self.publish_connectivity(&site, device_id, epoch, ConnectivityEvent::Closed, 0, 0)
                .await?;
        }
        Ok(())
    }

    /// Closes the device's session now when its identity generation moved
    /// on (revoked, deleted): the broadcast the API sends before it answers
    /// a revoke, so no heartbeat on the old credential is accepted after
    /// that answer. True when this replica closed it.
    pub async fn end_revoked_session(&self, device_id: &str) -> Result<bool, GatewayError> {
        // Loads the session into this replica's cache from PostgreSQL
        // when another replica opened it.
        let Some(s) = self.session(device_id).await? else {
            return Ok(false);
        };
        if s.closed.is_some() {
            return Ok(false);
        }
        let checks = store::identity_checks(&self.deps.pool, &[device_id.to_string()]).await?;
        let revoked = match checks.first() {
            None => true,
            Some(c) => c.deleted || c.identity_generation != s.identity_generation,
        };
        if !revoked {
            return Ok(false);
        }
        tracing::info!(
            device_id,
            epoch = s.epoch,
            "identity revoked: closing the session"
        );
        self.close(device_id, s.epoch, ErrorCode::IdentityRevoked)
            .await?;
        self.metrics.sessions.set(self.open_sessions() as i64);
        Ok(true)
    }

    pub(crate) fn open_sessions(&self) -> usize {
        self.sessions()
            .values()
            .filter(|s| s.closed.is_none())
            .count()
    }

    /// Every cached session against PostgreSQL: a bumped identity
    /// generation or a deleted device closes it (credentials of an earlier
    /// generation never work again); a session superseded or closed by
    /// another replica is dropped; one silent past `lost_after` is
    /// forgotten (the hub has marked it `lost`).
    pub async fn check_identities(&self) -> Result<usize, GatewayError> {
        let forget = self.forget_after();
        let ids: Vec<String> = {
            let mut all = self.sessions();
            all.retain(|_, s| s.last_heartbeat.elapsed() < forget);
            all.iter()
                .filter(|(_, s)| s.closed.is_none())
                .map(|(id, _)| id.clone())
                .collect()
        };
        if ids.is_empty() {
            self.metrics.sessions.set(self.open_sessions() as i64);
            return Ok(0);
        }
        let checks = store::identity_checks(&self.deps.pool, &ids).await?;
        let mut revoked = Vec::new();
        {
            let mut all = self.sessions();
            let found: HashMap<&str, &store::IdentityCheck> =
                checks.iter().map(|c| (c.device_id.as_str(), c)).collect();
            for id in &ids {
                let Some(s) = all.get_mut(id) else { continue };
                match found.get(id.as_str()) {
                    None => revoked.push((id.clone(), s.epoch)),
                    Some(c) if c.deleted || c.identity_generation != s.identity_generation => {
                        revoked.push((id.clone(), s.epoch))
                    }
                    Some(c) if c.session_epoch != Some(s.epoch) || c.session_closed => {
                        all.remove(id);
                    }
                    Some(c) => {
                        s.trust = c.trust;
                        s.pool_id = c.pool_id.clone();
                    }
                }
            }
        }
        for (id, epoch) in &revoked {
            tracing::info!(device_id = %id, epoch, "identity generation moved on: closing the session");
            self.close(id, *epoch, ErrorCode::IdentityRevoked).await?;
        }
        self.metrics.sessions.set(self.open_sessions() as i64);
        Ok(revoked.len())
    }

    /// Re-publishes `GpuCountMismatch` for every live session, so the
    /// observation stays fresh at the hub, evenly over `spread` (100,000
    /// sessions at once were a burst the hub took minutes to absorb, with
    /// heartbeats waiting behind it). Stops early on shutdown.
    pub async fn resync_conditions(
        &self,
        spread: Duration,
        shutdown: &mut Shutdown,
    ) -> Result<usize, GatewayError> {
        let live: Vec<(String, Session)> = self
            .sessions()
            .iter()
            .filter(|(_, s)| s.closed.is_none() && s.pool_id.is_some())
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect();
        let mut profiles: HashMap<String, Option<Profile>> = HashMap::new();
        let mut n = 0;
        let started = tokio::time::Instant::now();
        let total = live.len().max(1) as f64;
        for (i, (id, s)) in live.into_iter().enumerate() {
            let due = started + spread.mul_f64(i as f64 / total);
            // Shutdown first: a resync that is due and a shutdown that
            // came are both ready, and shutdown wins.
            tokio::select! {
                biased;
                _ = shutdown.wait() => break,
                _ = tokio::time::sleep_until(due) => {}
            }
            let Some(pool_id) = &s.pool_id else { continue };
            if !profiles.contains_key(pool_id) {
                let p = store::profile(&self.deps.pool, pool_id).await?;
                profiles.insert(pool_id.clone(), p);
            }
            let profile = profiles.get(pool_id).and_then(|p| p.as_ref());
            self.publish_gpu_condition(&s.site_id, &id, &s.inventory, profile)
                .await?;
            n += 1;
        }
        Ok(n)
    }
}
