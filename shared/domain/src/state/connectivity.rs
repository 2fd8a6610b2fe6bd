//! Connectivity: node agent session events, the generation a node
//! reports, and liveness.

use super::*;

impl DeviceState {
    /// A node agent session event from the gateway.
    pub fn apply_connectivity(
        &mut self,
        epoch: i64,
        gateway_id: &str,
        event: ConnectivityEvent,
        observed_at: DateTime<Utc>,
    ) -> Outcome {
        self.apply_connectivity_of(epoch, gateway_id, event, observed_at, 0)
    }

    /// [`DeviceState::apply_connectivity`] for a session opened under
    /// `identity_generation` (0: not reported). Seed 000: "Certificates of
    /// an earlier generation never work again": an open or heartbeat of an
    /// earlier generation is refused as stale (a close still applies).
    pub fn apply_connectivity_of(
        &mut self,
        epoch: i64,
        gateway_id: &str,
        event: ConnectivityEvent,
        observed_at: DateTime<Utc>,
        identity_generation: i64,
    ) -> Outcome {
        if identity_generation > 0
            && identity_generation < self.record.identity_generation
            && event != ConnectivityEvent::Closed
        {
            return Outcome::Stale;
        }
        let s = &mut self.record.session;
        if epoch < s.epoch || (epoch == s.epoch && s.last_seen.is_some_and(|l| observed_at < l)) {
            return Outcome::Stale;
        }
        if epoch == s.epoch && s.last_seen == Some(observed_at) {
            return Outcome::Duplicate;
        }
        if epoch > s.epoch {
            s.epoch = epoch;
            s.gateway_id = Some(gateway_id.to_string());
            s.connected_at = Some(observed_at);
            s.disconnected_at = None;
        }
        s.last_seen = Some(observed_at);
        match event {
            ConnectivityEvent::Opened | ConnectivityEvent::Heartbeat => {
                if s.disconnected_at.is_none() {
                    self.record.connectivity = Connectivity::Connected;
                }
            }
            ConnectivityEvent::Closed => {
                s.disconnected_at = Some(observed_at);
                self.record.connectivity = Connectivity::Disconnected;
            }
        }
        Outcome::Applied
    }

    /// The generation the node reports converged; it never moves back.
    pub fn report_generation(&mut self, observed_generation: i64) {
        if observed_generation > self.record.observed_generation {
            self.record.observed_generation = observed_generation;
        }
    }

    /// Liveness: no heartbeat for `unreachable_after` is `unreachable`, for
    /// `lost_after` is `lost`.
    pub fn apply_liveness(
        &mut self,
        now: DateTime<Utc>,
        unreachable_after: Duration,
        lost_after: Duration,
    ) {
        let r = &mut self.record;
        let Some(last) = r.session.last_seen else {
            return;
        };
        if !matches!(
            r.connectivity,
            Connectivity::Connected | Connectivity::Unreachable
        ) {
            return;
        }
        if last + lost_after < now {
            r.connectivity = Connectivity::Lost;
        } else if last + unreachable_after < now && r.connectivity == Connectivity::Connected {
            r.connectivity = Connectivity::Unreachable;
        }
    }
}
