//! Burn-in (`single_node_test`, `multi_node_test`): the hardware test runs
//! as a SLURM job on the device's node, and the run reads the job's state
//! as slurmrestd reports it until it ends. Seed 002: "SLURM job states are
//! tracked separately during hardware-test workflows (PENDING, RUNNING,
//! COMPLETED, FAILED, ...)": the state is workflow-scoped (the run's pinned
//! and step results), never stored on the device.

use crate::failure::FailureCode;

/// What a read of the burn-in's SLURM job decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not ended (queued, running, completing, requeued, suspended, or a
    /// state this build does not know): read again, within the stage's
    /// time limit.
    Waiting,
    /// The job completed with exit code 0: the stage's result is success.
    Passed,
    /// The job ended without passing: the stage failed with this code.
    Failed(FailureCode, String),
}

/// The base states of `job_state` that end a job, as SLURM 22.05's
/// `job_state_string` writes them (`src/common/slurm_protocol_defs.c`).
const FAULTS: &[&str] = &[
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
];

/// Reads one report of the job: its `job_state` (v0.0.38: one string;
/// v0.0.39+: a list whose first word is the base state), `exit_code` (the
/// wait status: exit status in the high byte, signal in the low one) and
/// `state_reason`.
pub fn verdict(job_state: &[String], exit_code: Option<i64>, state_reason: &str) -> Verdict {
    let base = job_state
        .first()
        .map(|s| s.trim().to_ascii_uppercase())
        .unwrap_or_default();
    let detail = || {
        let mut d = format!("SLURM job {}", job_state.join("+"));
        if let Some(code) = exit_code {
            let (status, signal) = ((code >> 8) & 0xff, code & 0x7f);
            d.push_str(&format!(", exit status {status}"));
            if signal != 0 {
                d.push_str(&format!(", signal {signal}"));
            }
        }
        if !state_reason.trim().is_empty() && state_reason != "None" {
            d.push_str(&format!(", reason {state_reason}"));
        }
        d
    };
    match base.as_str() {
        // COMPLETED is "terminated all processes on all nodes with an exit
        // code of zero"; a non-zero exit is FAILED in SLURM's own words,
        // but a COMPLETED with a non-zero code is not taken as a pass.
        "COMPLETED" if exit_code.unwrap_or(0) == 0 => Verdict::Passed,
        "COMPLETED" => Verdict::Failed(FailureCode::BurnInFailed, detail()),
        s if FAULTS.contains(&s) => Verdict::Failed(FailureCode::BurnInFailed, detail()),
        "CANCELLED" | "PREEMPTED" => Verdict::Failed(FailureCode::BurnInCancelled, detail()),
        _ => Verdict::Waiting,
    }
}

/// The SLURM job name of one device's burn-in in one job: the same on
/// every attempt of the run, so a run resumed after a crash between its
/// submission and the commit finds the job it submitted instead of
/// submitting a second one.
pub fn job_name(stage_workflow: &str, job_id: &str, device_id: &str) -> String {
    format!("fleet-{stage_workflow}-{job_id}-{device_id}")
}

/// The node constraint a submission pins the job with: the site's
/// `node_feature` template with `{node}` replaced by the SLURM node name
/// (slurmrestd v0.0.38 has no node list on a submission, so each test
/// node carries a feature naming it). `Err` when the template names no
/// node, which would let SLURM run the test on any node.
pub fn node_constraint(template: &str, node: &str) -> Result<String, String> {
    let t = template.trim();
    if !t.contains("{node}") {
        return Err(format!(
            "the node feature template {t:?} has no {{node}}: the burn-in would run on any node"
        ));
    }
    if node.is_empty()
        || !node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(format!(
            "{node:?} is not a SLURM node name a constraint can carry"
        ));
    }
    Ok(t.replace("{node}", node))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(state: &str, exit: Option<i64>) -> Verdict {
        verdict(&[state.to_string()], exit, "None")
    }

    #[test]
    fn a_job_passes_only_when_it_completed_with_exit_zero() {
        assert_eq!(v("COMPLETED", Some(0)), Verdict::Passed);
        assert_eq!(v("COMPLETED", None), Verdict::Passed);
        assert!(matches!(
            v("COMPLETED", Some(256)),
            Verdict::Failed(FailureCode::BurnInFailed, _)
        ));
    }

    #[test]
    fn every_fault_state_fails_the_stage_with_its_detail() {
        for s in FAULTS {
            let Verdict::Failed(code, message) =
                verdict(&[s.to_string()], Some(768), "NonZeroExitCode")
            else {
                panic!("{s} must fail");
            };
            assert_eq!(code, FailureCode::BurnInFailed, "{s}");
            assert!(message.contains(s), "{message}");
            assert!(message.contains("exit status 3"), "{message}");
            assert!(message.contains("NonZeroExitCode"), "{message}");
        }
        // A signal is named (exit_code 9: killed by SIGKILL).
        let Verdict::Failed(_, m) = v("FAILED", Some(9)) else {
            panic!()
        };
        assert!(m.contains("signal 9"), "{m}");
    }

    #[test]
    fn a_cancelled_or_preempted_job_is_not_a_hardware_fault() {
        for s in ["CANCELLED", "PREEMPTED"] {
            assert!(matches!(
                v(s, Some(0)),
                Verdict::Failed(FailureCode::BurnInCancelled, _)
            ));
        }
    }

    #[test]
    fn a_job_not_ended_is_read_again() {
        // "PENDING, RUNNING, COMPLETED, FAILED, ..." as slurmrestd reports
        // them: queued, running and transitional states wait; so does a
        // state a later SLURM adds (bounded by the stage's time limit).
        for s in [
            "PENDING",
            "RUNNING",
            "SUSPENDED",
            "COMPLETING",
            "CONFIGURING",
            "REQUEUED",
            "RESIZING",
            "SOMETHING_NEW",
        ] {
            assert_eq!(v(s, None), Verdict::Waiting, "{s}");
        }
        // v0.0.39+ reports a list: the base state first.
        assert_eq!(
            verdict(&["RUNNING".into(), "COMPLETING".into()], None, ""),
            Verdict::Waiting
        );
        assert_eq!(verdict(&[], None, ""), Verdict::Waiting);
    }

    #[test]
    fn the_constraint_names_the_node_or_is_refused() {
        assert_eq!(node_constraint("{node}", "gpu04").unwrap(), "gpu04");
        assert_eq!(
            node_constraint("host_{node}", "gpu04").unwrap(),
            "host_gpu04"
        );
        assert!(node_constraint("h100", "gpu04").is_err());
        assert!(node_constraint("{node}", "").is_err());
        assert!(node_constraint("{node}", "gpu04&gpu05").is_err());
        assert!(node_constraint("{node}", "a|b").is_err());
    }

    #[test]
    fn the_job_name_is_stable_per_run() {
        assert_eq!(
            job_name("single_node_test", "01J", "dev_1"),
            job_name("single_node_test", "01J", "dev_1")
        );
        assert_ne!(
            job_name("single_node_test", "01J", "dev_1"),
            job_name("multi_node_test", "01J", "dev_1")
        );
    }
}
