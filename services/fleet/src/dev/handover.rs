//! The simulated handover workflow: the front-end half of a custody
//! handover or return. The switch has applied the flip (the scenario
//! engine did it); this reads the port back from the simulated switch's
//! NVUE, exactly as connector-fabric reads it ([`fleet_connector_fabric::nvue`]),
//! and only when the port is in the VRF the flip promised writes the
//! `FrontendPortsInCustomerVrf` latch through the hub with
//! [`fleet_latch::LatchWriter`] (`CustomerVrfFlipVerified`, or
//! `IsolateFlipVerified` on a return). Once the hub has recorded it the
//! engine moves custody, so the partner reports `GOOGLE_OWNED` only after
//! the verified flip is on record: a proper handover, no `HandoverBreach`.
//! The flips it verifies are real reads of the simulated switch, not a
//! simulated workflow run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fleet_bus::Subjects;
use fleet_latch::{Latch, LatchWrite, LatchWriter};
use fleet_proto::v1;

use crate::dev::engine::{FlipJob, FrontendLatch};
use crate::dev::fabric::{NVUE_PASSWORD, NVUE_USER};
use crate::dev::servers::{basic, Shared};

/// Flips handled per round, so a large initial backlog does not hold the
/// scenario lock for long or flood the hub.
const PER_ROUND: usize = 64;

pub struct Workflow {
    pub scenario: Shared,
    /// To leave alone devices NetBox has not brought in yet.
    pub pool: sqlx::PgPool,
    pub nvue: String,
    pub writer: LatchWriter,
    pub paused: Arc<AtomicBool>,
    /// The scenario is held (its evolution, handovers included).
    pub held: Arc<AtomicBool>,
    /// True while a round is in progress (a pause waits for it).
    pub busy: Arc<AtomicBool>,
}

impl Workflow {
    pub fn new(
        scenario: Shared,
        pool: sqlx::PgPool,
        nvue: String,
        nats: async_nats::Client,
        subjects: Subjects,
        paused: Arc<AtomicBool>,
        held: Arc<AtomicBool>,
        busy: Arc<AtomicBool>,
    ) -> Workflow {
        let mut writer = LatchWriter::new(nats, subjects, "workflow:dev-handover:sim");
        writer.attempts = 1;
        writer.timeout = Duration::from_secs(5);
        Workflow {
            scenario,
            pool,
            nvue,
            writer,
            paused,
            held,
            busy,
        }
    }

    /// Runs until aborted.
    pub async fn run(self) {
        let mut every = tokio::time::interval(Duration::from_millis(250));
        loop {
            every.tick().await;
            self.busy.store(true, Ordering::SeqCst);
            if !self.paused.load(Ordering::SeqCst) && !self.held.load(Ordering::SeqCst) {
                self.round().await;
            }
            self.busy.store(false, Ordering::SeqCst);
        }
    }

    async fn round(&self) {
        let jobs = self
            .scenario
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .flip_jobs();
        if jobs.is_empty() {
            return;
        }
        // Devices the hub knows (a latch write for any other is refused),
        // and, for a return, only once the hub has the device in custody: a
        // return flip recorded before the hub applied the custody entry
        // would make that entry a breach.
        let names: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
        let known: std::collections::BTreeMap<(String, String), String> =
            match sqlx::query_as::<_, (String, String, String)>(
                "SELECT site_id, name, operational_status FROM devices \
             WHERE name = ANY($1) AND deleted_at IS NULL",
            )
            .bind(&names)
            .fetch_all(&self.pool)
            .await
            {
                Ok(rows) => rows.into_iter().map(|(s, n, o)| ((s, n), o)).collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "simulated handover workflow cannot read devices");
                    return;
                }
            };
        let jobs =
            jobs.into_iter()
                .filter(|j| match known.get(&(j.site.clone(), j.name.clone())) {
                    None => false,
                    Some(_) if j.latch == FrontendLatch::CustomerVrfFlipVerified => true,
                    Some(status) => matches!(status.as_str(), "delegated" | "drained"),
                });
        for job in jobs.take(PER_ROUND) {
            match self.flip(&job).await {
                Ok(()) => self
                    .scenario
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .flip_recorded(&job),
                Err(e) => {
                    // Mostly a device NetBox has not brought in yet.
                    tracing::debug!(device = %job.name, site = %job.site, error = %e, "simulated handover flip not recorded yet");
                    self.scenario
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .flip_failed();
                }
            }
        }
    }

    /// Reads the port back and records the latch.
    async fn flip(&self, job: &FlipJob) -> anyhow::Result<()> {
        let url = format!(
            "{}/{}/nvue_v1/interface?rev=operational",
            self.nvue, job.switch
        );
        let text =
            crate::dev::status::http_get_auth(&url, &basic(NVUE_USER, NVUE_PASSWORD)).await?;
        let body: serde_json::Value = serde_json::from_str(&text)?;
        let interfaces =
            fleet_connector_fabric::nvue::interfaces(body).map_err(anyhow::Error::msg)?;
        let vrf = fleet_connector_fabric::nvue::port_vrf(&interfaces, &job.port)
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", job.switch, job.port))?;
        anyhow::ensure!(
            vrf == job.vrf,
            "{}:{} reads back in {vrf}, not {}",
            job.switch,
            job.port,
            job.vrf
        );
        let reason = job.latch.reason();
        debug_assert!(job.latch != FrontendLatch::HandoverBreach);
        let w = LatchWrite::new(
            Latch::FrontendVrf,
            v1::DeviceKey {
                site: job.site.clone(),
                kind: "name".into(),
                key: job.name.clone(),
            },
            reason,
            format!("{}:{} read back in {vrf}", job.switch, job.port),
            chrono::Utc::now(),
        )?;
        self.writer.write(&w).await?;
        Ok(())
    }
}
