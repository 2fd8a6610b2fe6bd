//! Enrolment (seed 002, "Enrollment identity proof"): each step reads the
//! node, asks `fleet_domain::enrolment`, and writes at most once; the
//! proof goes through the hub's `enrollment_proof` command, bound to the
//! identity the run pinned before its first write.

use chrono::{DateTime, Utc};
use fleet_domain::enrolment::{enrol_next, EnrolNext, EnrolNode, Pinned, Settings};
use fleet_domain::failure::FailureCode;
use fleet_hub_client::HubCallError;
use fleet_proto::v1;
use serde_json::{json, Value};

use super::{Carried, Run, StepOutcome, Taken};
use crate::activities::CallError;
use crate::Workflow;

const IDENTITY: &str = "identity";
const INSPECT_BASELINE: &str = "inspect_baseline";
const POWER_CYCLE_REQUESTED: &str = "power_cycle_requested";
const PROOF_WRITTEN: &str = "proof_written";

/// The run's pins as the decision reads them.
fn pinned(c: &Carried) -> Pinned {
    let time = |v: &Value| v.as_str().and_then(|s| s.parse::<DateTime<Utc>>().ok());
    Pinned {
        identity: c.pinned_str(IDENTITY).map(str::to_string),
        inspect_baseline: c.pinned.get(INSPECT_BASELINE).map(time),
        power_cycle_requested: c.pinned_flag(POWER_CYCLE_REQUESTED),
        proof_written: c.pinned_flag(PROOF_WRITTEN),
    }
}

/// The identity an Enrolment run pinned (a failure write is guarded by it).
pub(crate) fn pinned_identity(pinned: &Value) -> Option<String> {
    pinned
        .get(IDENTITY)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn hub_error(e: HubCallError) -> CallError {
    CallError::from_hub(e, FailureCode::EnrollmentProofWriteRefused)
}

impl Workflow {
    pub(super) async fn enrolment(&self, r: &Run<'_>, carried: &mut Carried) -> StepOutcome {
        let device = r.device;
        let site = self.site_of(device)?;
        // The node the run pinned; before that the device's
        // infrastructure_ref, else its name.
        let device_ref = device
            .infrastructure_ref
            .as_deref()
            .filter(|r| !r.trim().is_empty());
        let ident = carried
            .pinned_str(IDENTITY)
            .or(device_ref)
            .unwrap_or(&device.name)
            .to_string();
        let node = site.node(&ident).await?;
        let view = EnrolNode {
            uuid: &node.uuid,
            provision_state: node.provision_state.as_deref().unwrap_or(""),
            target_provision_state: node.target_provision_state.as_deref().unwrap_or(""),
            target_power_state: node.target_power_state.as_deref().unwrap_or(""),
            maintenance: node.maintenance,
            driver: node.driver.as_deref().unwrap_or(""),
            last_error: node.last_error.as_deref(),
            inspection_finished_at: node.inspection_finished_at,
        };
        let e = &site.config.enrolment;
        let settings = Settings {
            run_inspection: r.job.options.run_inspection.unwrap_or(true),
            power_cycle: e.power_cycle_before_inspect,
            required_driver: e.required_driver.trim(),
        };
        Ok(
            match enrol_next(&view, device_ref, &pinned(carried), settings) {
                EnrolNext::PinIdentity(uuid) => {
                    carried.pin(IDENTITY, uuid);
                    Taken::Step("identity_pinned")
                }
                EnrolNext::PinInspect { baseline } => {
                    carried.pinned.insert(
                        INSPECT_BASELINE.into(),
                        baseline.map_or(Value::Null, |t| Value::String(t.to_rfc3339())),
                    );
                    Taken::Step("inspection_baseline_pinned")
                }
                EnrolNext::PowerCycle => {
                    // Pinned after the request is accepted: a lost request
                    // is sent again, a second reboot is harmless before an
                    // inspection.
                    site.power(&node.uuid, "rebooting").await?;
                    self.metrics.wrote("ironic", "power_cycle");
                    carried.pin_flag(POWER_CYCLE_REQUESTED);
                    Taken::Step("power_cycle_requested")
                }
                EnrolNext::Provision(target) => {
                    site.provision(&node.uuid, &json!({ "target": target }))
                        .await?;
                    self.metrics.wrote("ironic", target);
                    Taken::Step(match target {
                        "manage" => "manage_requested",
                        "inspect" => "inspection_requested",
                        _ => "provide_requested",
                    })
                }
                EnrolNext::WriteProof { result_ref } => {
                    self.write_proof(r, &result_ref).await?;
                    carried.pin_flag(PROOF_WRITTEN);
                    Taken::Step("proof_written")
                }
                EnrolNext::Wait => Taken::Wait,
                EnrolNext::Done => Taken::Done,
                EnrolNext::Fail(code, message) => Taken::Failed(code, message),
            },
        )
    }

    /// "A qualifying typed completion establishes enrolled proof for its
    /// result reference": through the hub, checked against its reply.
    async fn write_proof(&self, r: &Run<'_>, result_ref: &str) -> Result<(), CallError> {
        let actor = format!("workflow:enrollment:{}", r.job.id);
        let c = v1::hub_command::Command::EnrollmentProof(v1::EnrollmentProof {
            device_id: r.device.id.clone(),
            outcome: "enrolled".into(),
            result_ref: result_ref.into(),
            proof_source: format!("enrollment:{}", r.job.id),
            pinned_infrastructure_ref: result_ref.into(),
        });
        let applied = self.hub.call(&actor, 0, c).await.map_err(hub_error)?;
        let recorded = applied.device().map_err(hub_error)?;
        if recorded.enrollment_validated_ref != result_ref {
            return Err(CallError::Permanent(
                FailureCode::EnrollmentProofWriteRefused,
                format!(
                    "the hub recorded enrollment_validated_ref {:?}, not {result_ref}",
                    recorded.enrollment_validated_ref
                ),
            ));
        }
        self.metrics.wrote("hub", "enrollment_proof");
        Ok(())
    }

    /// "A started non-success submits a non-revoking failure write guarded
    /// by the identity pinned in the workflow" (the hub decides whether it
    /// clears stale proof or no-ops). A run that pinned nothing writes
    /// nothing. Tried within `workflow.max_attempts`; its own failure is
    /// logged and does not change the device's outcome.
    pub(crate) async fn enrolment_failure_write(
        &self,
        job_id: &str,
        device_id: &str,
        identity: &str,
    ) {
        let actor = format!("workflow:enrollment:{job_id}");
        for attempt in 1..=self.config.max_attempts.max(1) {
            let c = v1::hub_command::Command::EnrollmentProof(v1::EnrollmentProof {
                device_id: device_id.into(),
                outcome: "failed".into(),
                pinned_infrastructure_ref: identity.into(),
                ..Default::default()
            });
            match self.hub.call(&actor, 0, c).await {
                Ok(_) => {
                    self.metrics.wrote("hub", "enrollment_proof_failed");
                    return;
                }
                Err(e) if attempt < self.config.max_attempts.max(1) => {
                    tracing::info!(job_id, device_id, attempt, error = %e, "enrollment failure write failed; retrying");
                    tokio::time::sleep(self.backoff(attempt)).await;
                }
                Err(e) => {
                    tracing::warn!(job_id, device_id, error = %e, "enrollment failure write not recorded; stale proof of the pinned identity, if any, stays until the next enrolment")
                }
            }
        }
    }
}
