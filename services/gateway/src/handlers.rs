//! The requests the gateway answers: join, open, heartbeat, close (from
//! agents), relay (from operators) and end_sessions (the API's broadcast
//! after a revoke). Each decodes its payload, never panics on input, and
//! answers a typed error; all are served by `fleet_bus::serve`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fleet_bus::{Refusal, Responder};

use chrono::Utc;
use fleet_bus::subjects::token;
use fleet_bus::Subjects;
use fleet_domain::hardware::{self, HardwareIds, IdKind};
use fleet_domain::ConnectivityEvent;
use fleet_proto::{timestamp, v1, ErrorCode, Message};

use crate::policy::{self, Acceptance, AgentCommandKind, Inventory};
use crate::sessions::Session;
use crate::{store, Gateway, GatewayError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Join,
    Open,
    Heartbeat,
    Close,
    Relay,
    EndSessions,
}

impl Route {
    pub const ALL: [Route; 6] = [
        Route::Join,
        Route::Open,
        Route::Heartbeat,
        Route::Close,
        Route::Relay,
        Route::EndSessions,
    ];

    /// The queue group: every route is served by one replica, but
    /// `end_sessions`, which every replica must hear.
    pub fn queue(self) -> Option<String> {
        (self != Route::EndSessions).then(|| "gateway".to_string())
    }

    fn named(name: &str) -> Option<Route> {
        Route::ALL.into_iter().find(|r| r.name() == name)
    }

    pub fn subject(self, s: &Subjects) -> String {
        match self {
            Route::Join => s.agent_join(),
            Route::Open => s.agent_all("open"),
            Route::Heartbeat => s.agent_all("heartbeat"),
            Route::Close => s.agent_all("close"),
            Route::Relay => s.gateway_cmd("relay"),
            Route::EndSessions => s.gateway_cmd("end_sessions"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Route::Join => "join",
            Route::Open => "open",
            Route::Heartbeat => "heartbeat",
            Route::Close => "close",
            Route::Relay => "relay",
            Route::EndSessions => "end_sessions",
        }
    }
}

fn decode<M: Message + Default>(payload: &[u8], what: &str) -> Result<M, GatewayError> {
    M::decode(payload).map_err(|e| GatewayError::invalid(format!("undecodable {what}: {e}")))
}

/// `<root>.agent.<device>.<verb>`: the device token of the subject, which
/// is what NATS permissions guard; the payload must name the same device.
fn subject_device(subject: &str) -> &str {
    let mut it = subject.rsplit('.');
    it.next();
    it.next().unwrap_or("")
}

fn check_device(subject: &str, device_id: &str) -> Result<(), GatewayError> {
    if device_id.is_empty() {
        return Err(GatewayError::invalid("device_id is required"));
    }
    if token(device_id) != subject_device(subject) {
        return Err(GatewayError::new(
            ErrorCode::Forbidden,
            "the payload names another device than the subject",
        ));
    }
    Ok(())
}

fn inventory(i: Option<&v1::Inventory>) -> Inventory {
    i.map(|i| Inventory {
        gpu_count: i.gpu_count.max(0) as u32,
        gpu_model: i.gpu_model.clone(),
    })
    .unwrap_or_default()
}

impl Gateway {
    /// Join: token, hardware key, the hub's `join`, a credential for the
    /// identity generation, then acceptance.
    async fn join(&self, payload: &[u8]) -> Result<v1::JoinReply, GatewayError> {
        let req: v1::JoinRequest = decode(payload, "JoinRequest")?;
        if req.join_token.is_empty() {
            return Err(GatewayError::new(
                ErrorCode::Unauthenticated,
                "a join token is required",
            ));
        }
        let hostname = req.hostname.trim();
        if hostname.is_empty() || hostname.len() > 253 {
            return Err(GatewayError::invalid(
                "hostname is required (at most 253 characters)",
            ));
        }
        let grant = store::join_grant(&self.deps.pool, &req.join_token)
            .await?
            .ok_or_else(|| {
                GatewayError::new(
                    ErrorCode::Unauthenticated,
                    "unknown, revoked or expired join token",
                )
            })?;
        let hw = req.hardware.unwrap_or_default();
        let ids = HardwareIds {
            system_serial: hw.system_serial,
            board_serial: hw.board_serial,
            bmc_mac: hw.bmc_mac,
            nic_macs: hw.nic_macs,
            tpm_ek_hash: hw.tpm_ek_hash,
        };
        let key = hardware::hardware_key(&ids).ok_or_else(|| {
            GatewayError::invalid("no hardware identifier survived normalisation")
        })?;
        let serial = key
            .survivors
            .iter()
            .find(|s| s.kind == IdKind::SystemSerial)
            .map(|s| s.value.clone())
            .unwrap_or_default();
        let inv = inventory(req.inventory.as_ref());
        // Acceptance (the inventory against the pool's hardware profile)
        // is known before the join, so the hub adopts with it.
        let profile = match &grant.pool_id {
            Some(pool_id) => Some(store::profile(&self.deps.pool, pool_id).await?),
            None => None,
        };
        let acceptance = profile
            .as_ref()
            .map(|p| policy::acceptance(&inv, p.as_ref()));
        let crate::batched::Issued { joined, credential } = self
            .hub_join(v1::JoinDevice {
                site: grant.site_id.clone(),
                pool_id: grant.pool_id.clone().unwrap_or_default(),
                name: hostname.to_string(),
                hardware_key: key.key.clone(),
                hardware_key_trusted: key.trusted,
                serial,
                trust: grant.trust.as_str().into(),
                owner_tenant_id: grant.owner_tenant_id.clone().unwrap_or_default(),
                gpu_count: inv.gpu_count.min(256) as i32,
                adopt: acceptance == Some(Acceptance::Accept),
            })
            .await?;
        let (rejoined, claimed) = (joined.rejoined, joined.claimed);
        let device = joined.device.unwrap_or_default();
        let (device_id, generation, version) =
            (device.id, device.identity_generation, device.version);
        let mut provision_state = device.provision_state;
        tracing::info!(device_id = %device_id, rejoined, claimed, trusted = key.trusted, generation, "agent joined");

        // Acceptance: the hub adopted with the join when it passed. A hub
        // that does not know the join's `adopt` (an older replica during a
        // rolling upgrade) left the device adopting: adopt it here.
        if let (Some(profile), Some(acceptance)) = (profile, acceptance) {
            match acceptance {
                Acceptance::Accept if provision_state == "adopting" => {
                    if self.adopt(&device_id, version).await? {
                        provision_state = "adopted".into();
                    }
                }
                Acceptance::Accept => {}
                other => {
                    tracing::info!(device_id = %device_id, acceptance = ?other, "acceptance did not pass; the device stays adopting")
                }
            }
            self.publish_gpu_condition(&grant.site_id, &device_id, &inv, profile.as_ref())
                .await?;
        }
        self.metrics.joins.inc();
        Ok(v1::JoinReply {
            error: None,
            device_id,
            credential,
            identity_generation: generation,
            rejoined,
            hardware_key_trusted: key.trusted,
            provision_state,
            claimed,
        })
    }

    /// The hub's `adopt`, with the version just read; a concurrent change
    /// is read again once.
    async fn adopt(&self, device_id: &str, mut version: i64) -> Result<bool, GatewayError> {
        for _ in 0..3 {
            let r = self
                .hub(
                    version,
                    v1::hub_command::Command::Adopt(v1::Adopt {
                        device_id: device_id.to_string(),
                    }),
                )
                .await;
            match r {
                Ok(_) => return Ok(true),
                Err(e) if e.code == ErrorCode::Conflict => {
                    let Some(d) = store::device(&self.deps.pool, device_id).await? else {
                        return Ok(false);
                    };
                    if d.provision_state != "adopting" {
                        return Ok(false);
                    }
                    version = d.version;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    /// Open: the credential must be of the device's current identity
    /// generation; each open takes a new epoch.
    async fn open(&self, subject: &str, payload: &[u8]) -> Result<v1::SessionOpened, GatewayError> {
        let req: v1::OpenSession = decode(payload, "OpenSession")?;
        check_device(subject, &req.device_id)?;
        let generation =
            store::credential_generation(&self.deps.pool, &req.device_id, &req.credential)
                .await?
                .ok_or_else(|| {
                    GatewayError::new(ErrorCode::Unauthenticated, "unknown credential")
                })?;
        let device = store::device(&self.deps.pool, &req.device_id)
            .await?
            .ok_or_else(|| GatewayError::new(ErrorCode::NotFound, "no such device"))?;
        if device.deleted || device.identity_generation != generation {
            return Err(GatewayError::new(
                ErrorCode::IdentityRevoked,
                "the credential is of an earlier identity generation: join again",
            ));
        }
        let session_token = store::new_secret();
        let token_sha = store::sha256_hex(&session_token);
        let inv = {
            // The inventory this replica last heard, else what the hub stored at join.
            let cached = self
                .sessions()
                .get(&req.device_id)
                .map(|s| s.inventory.clone());
            cached.unwrap_or(Inventory {
                gpu_count: device.gpu_count.unwrap_or(0).max(0) as u32,
                gpu_model: String::new(),
            })
        };
        let epoch = self
            .opens
            .ask(store::SessionOpen {
                device_id: req.device_id.clone(),
                hub_epoch: device.session_epoch,
                identity_generation: generation,
                token_sha256: token_sha.clone(),
                site_id: device.site_id.clone(),
                trust: device.trust,
                inventory: inv.clone(),
            })
            .await?;
        self.sessions().insert(
            req.device_id.clone(),
            Session {
                epoch,
                token_sha256: token_sha,
                identity_generation: generation,
                site_id: device.site_id.clone(),
                pool_id: device.pool_id.clone(),
                trust: device.trust,
                inventory: inv,
                last_heartbeat: Instant::now(),
                closed: None,
            },
        );
        self.publish_connectivity(
            &device.site_id,
            &req.device_id,
            epoch,
            ConnectivityEvent::Opened,
            0,
            generation,
        )
        .await?;
        let platform_secrets = if policy::gets_platform_secrets(device.trust) {
            self.config.platform_secrets.clone().into_iter().collect()
        } else {
            Default::default()
        };
        Ok(v1::SessionOpened {
            error: None,
            epoch,
            session_token,
            heartbeat_interval_secs: self
                .config
                .heartbeat_interval
                .as_secs()
                .clamp(1, i32::MAX as u64) as i32,
            platform_secrets,
            gateway_id: self.gateway_id.clone(),
        })
    }

    /// The live session a heartbeat or close names, or why there is none.
    async fn live_session(
        &self,
        device_id: &str,
        epoch: i64,
        session_token: &str,
    ) -> Result<Session, GatewayError> {
        let s = self
            .session(device_id)
            .await?
            .ok_or_else(|| GatewayError::new(ErrorCode::SessionClosed, "no session: open one"))?;
        if s.token_sha256 != store::sha256_hex(session_token) {
            if s.epoch == epoch {
                return Err(GatewayError::new(
                    ErrorCode::Unauthenticated,
                    "wrong session token",
                ));
            }
            return Err(GatewayError::new(
                ErrorCode::SessionClosed,
                "a newer session replaced this one",
            ));
        }
        if let Some(reason) = s.closed {
            return Err(GatewayError::new(reason, "the session is closed"));
        }
        Ok(s)
    }

    async fn heartbeat(&self, subject: &str, payload: &[u8]) -> Result<(), GatewayError> {
        let req: v1::Heartbeat = decode(payload, "Heartbeat")?;
        check_device(subject, &req.device_id)?;
        let s = self
            .live_session(&req.device_id, req.epoch, &req.session_token)
            .await?;
        self.publish_connectivity(
            &s.site_id,
            &req.device_id,
            s.epoch,
            ConnectivityEvent::Heartbeat,
            req.observed_generation,
            s.identity_generation,
        )
        .await?;
        if let Some(c) = self.sessions().get_mut(&req.device_id) {
            if c.epoch == s.epoch {
                c.last_heartbeat = Instant::now();
            }
        }
        Ok(())
    }

    async fn close_request(&self, subject: &str, payload: &[u8]) -> Result<(), GatewayError> {
        let req: v1::CloseSession = decode(payload, "CloseSession")?;
        check_device(subject, &req.device_id)?;
        let s = self
            .live_session(&req.device_id, req.epoch, &req.session_token)
            .await?;
        self.close(&req.device_id, s.epoch, ErrorCode::SessionClosed)
            .await
    }

    /// Relay: the policy first (nothing destructive reaches a
    /// tenant-controlled device), then the live session, then the agent
    /// with the deadline.
    async fn relay(&self, payload: &[u8]) -> Result<v1::RelayReply, GatewayError> {
        let req: v1::RelayCommand = decode(payload, "RelayCommand")?;
        let kind = AgentCommandKind::parse(&req.command)
            .ok_or_else(|| GatewayError::invalid(format!("unknown command {:?}", req.command)))?;
        let device = store::device(&self.deps.pool, &req.device_id)
            .await?
            .filter(|d| !d.deleted)
            .ok_or_else(|| {
                GatewayError::new(ErrorCode::NotFound, format!("device {}", req.device_id))
            })?;
        if let Err(r) = policy::may_relay(device.trust, kind) {
            tracing::warn!(device_id = %req.device_id, command = kind.as_str(), actor = %req.actor, "refused: {}", r.0);
            return Err(GatewayError::new(ErrorCode::Forbidden, r.0));
        }
        let s = self
            .session(&req.device_id)
            .await?
            .filter(|s| s.closed.is_none() && s.identity_generation == device.identity_generation)
            .ok_or_else(|| {
                GatewayError::new(ErrorCode::NotConnected, "the device has no live session")
            })?;
        let max = self
            .config
            .max_command_deadline
            .max(Duration::from_millis(1));
        let deadline = match req.deadline_ms {
            d if d <= 0 => self.config.command_deadline,
            d => Duration::from_millis(d as u64),
        }
        .min(max);
        let request_id = format!("cmd_{}", ulid::Ulid::new());
        let cmd = v1::AgentCommand {
            request_id: request_id.clone(),
            command: kind.as_str().into(),
            args: req.args.clone(),
            deadline: Some(timestamp(
                Utc::now() + chrono::Duration::milliseconds(deadline.as_millis() as i64),
            )),
            epoch: s.epoch,
        };
        let asked = self.deps.nats.request(
            self.deps.subjects.agent(&req.device_id, "cmd"),
            cmd.encode_to_vec().into(),
        );
        let msg = match tokio::time::timeout(deadline, asked).await {
            Err(_) => {
                return Err(GatewayError::new(
                    ErrorCode::DeadlineExceeded,
                    format!(
                        "{} got no answer within {} ms",
                        kind.as_str(),
                        deadline.as_millis()
                    ),
                ))
            }
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                return Err(GatewayError::new(
                    ErrorCode::NotConnected,
                    "the agent is not listening",
                ))
            }
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::TimedOut => {
                return Err(GatewayError::new(
                    ErrorCode::DeadlineExceeded,
                    format!("{} timed out", kind.as_str()),
                ))
            }
            Ok(Err(e)) => {
                return Err(GatewayError::new(
                    ErrorCode::Unavailable,
                    format!("relay: {e}"),
                ))
            }
            Ok(Ok(m)) => m,
        };
        let result: v1::AgentCommandResult = v1::AgentCommandResult::decode(msg.payload.as_ref())
            .map_err(|e| {
            GatewayError::new(
                ErrorCode::AgentError,
                format!("undecodable agent result: {e}"),
            )
        })?;
        if result.request_id != request_id {
            return Err(GatewayError::new(
                ErrorCode::AgentError,
                "the agent answered another request",
            ));
        }
        if kind == AgentCommandKind::InventoryRefresh && result.status == "ok" {
            if let Some(inv) = result.inventory.as_ref() {
                self.inventory_refreshed(&req.device_id, &s, inventory(Some(inv)))
                    .await?;
            }
        }
        Ok(v1::RelayReply {
            error: None,
            result: Some(result),
        })
    }

    /// A fresh inventory: stored with the session and re-asserted at once.
    async fn inventory_refreshed(
        &self,
        device_id: &str,
        s: &Session,
        inv: Inventory,
    ) -> Result<(), GatewayError> {
        store::set_inventory(&self.deps.pool, device_id, s.epoch, &inv).await?;
        if let Some(c) = self.sessions().get_mut(device_id) {
            if c.epoch == s.epoch {
                c.inventory = inv.clone();
            }
        }
        if let Some(pool_id) = &s.pool_id {
            let profile = store::profile(&self.deps.pool, pool_id).await?;
            self.publish_gpu_condition(&s.site_id, device_id, &inv, profile.as_ref())
                .await?;
        }
        Ok(())
    }
}

impl Responder for Gateway {
    const SERVICE: &'static str = "gateway";

    async fn respond(
        self: Arc<Self>,
        route: &'static str,
        subject: String,
        payload: Bytes,
    ) -> Result<Bytes, Refusal> {
        let started = Instant::now();
        let answer: Result<Vec<u8>, GatewayError> = match Route::named(route) {
            Some(Route::Join) => self.join(&payload).await.map(|r| r.encode_to_vec()),
            Some(Route::Open) => self
                .open(&subject, &payload)
                .await
                .map(|r| r.encode_to_vec()),
            Some(Route::Heartbeat) => self
                .heartbeat(&subject, &payload)
                .await
                .map(|()| v1::HeartbeatAck { error: None }.encode_to_vec()),
            Some(Route::Close) => self
                .close_request(&subject, &payload)
                .await
                .map(|()| v1::SessionClosed { error: None }.encode_to_vec()),
            Some(Route::Relay) => self.relay(&payload).await.map(|r| r.encode_to_vec()),
            Some(Route::EndSessions) => match v1::EndSessions::decode(payload.as_ref()) {
                Ok(req) => self
                    .end_revoked_session(&req.device_id)
                    .await
                    .map(|closed| {
                        v1::SessionsEnded {
                            gateway_id: self.gateway_id.clone(),
                            closed,
                            error: None,
                        }
                        .encode_to_vec()
                    }),
                Err(e) => Err(GatewayError::invalid(format!(
                    "undecodable EndSessions: {e}"
                ))),
            },
            None => Err(GatewayError::invalid(format!("unknown route {route}"))),
        };
        let code = answer
            .as_ref()
            .err()
            .map(|e| e.code.as_str_name())
            .unwrap_or("OK");
        self.metrics.request(route, code, started.elapsed());
        answer
            .map(Bytes::from)
            .map_err(|e| Refusal::new(e.code, e.message))
    }

    fn refused(&self, route: &'static str, code: ErrorCode, message: &str) -> Bytes {
        let error = Some(v1::AgentError {
            code: code as i32,
            message: message.to_string(),
        });
        match Route::named(route) {
            Some(Route::Join) => v1::JoinReply {
                error,
                ..Default::default()
            }
            .encode_to_vec(),
            Some(Route::Open) => v1::SessionOpened {
                error,
                ..Default::default()
            }
            .encode_to_vec(),
            Some(Route::Close) => v1::SessionClosed { error }.encode_to_vec(),
            Some(Route::Relay) => v1::RelayReply {
                error,
                result: None,
            }
            .encode_to_vec(),
            Some(Route::EndSessions) => v1::SessionsEnded {
                gateway_id: self.gateway_id.clone(),
                closed: false,
                error,
            }
            .encode_to_vec(),
            Some(Route::Heartbeat) | None => v1::HeartbeatAck { error }.encode_to_vec(),
        }
        .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subject_names_the_device() {
        assert_eq!(subject_device("t.fleet.agent.dev_01.heartbeat"), "dev_01");
        assert!(check_device("t.fleet.agent.dev_01.open", "dev_01").is_ok());
        assert_eq!(
            check_device("t.fleet.agent.dev_01.open", "dev_02")
                .unwrap_err()
                .code,
            ErrorCode::Forbidden
        );
        assert_eq!(
            check_device("t.fleet.agent.dev_01.open", "")
                .unwrap_err()
                .code,
            ErrorCode::InvalidArgument
        );
    }
}
