//! The simulated slurmrestd's batch jobs (v0.0.38, per site under
//! `/<site>/`): what the burn-in workflows submit, read, list and cancel.
//! A job waits in the queue for [`QUEUED`], runs for [`RUNS`], then ends
//! `COMPLETED`, or `FAILED` with exit status 1 on a node whose chassis
//! health is not Ok (the test finds the fault), so the standup matrix moves
//! while `fleet dev` runs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::dev::servers::{body, slurm_meta, slurm_not_found, App};

pub const QUEUED: Duration = Duration::from_secs(3);
pub const RUNS: Duration = Duration::from_secs(12);

/// One submitted job.
#[derive(Debug, Clone)]
pub struct SimJob {
    pub name: String,
    pub site: String,
    pub node: String,
    submitted: Instant,
    /// The node's health when the job started: the test fails on a fault.
    passes: bool,
    cancelled: Option<Instant>,
    time_limit: Duration,
}

/// The jobs slurmctld holds.
#[derive(Debug, Default)]
pub struct Jobs {
    next: u64,
    pub jobs: BTreeMap<u64, SimJob>,
}

impl SimJob {
    /// `(job_state, exit_code, state_reason)` now.
    fn state(&self, now: Instant) -> (&'static str, i64, &'static str) {
        let age = now - self.submitted;
        if let Some(at) = self.cancelled {
            if at - self.submitted < QUEUED + RUNS {
                return ("CANCELLED", 0, "None");
            }
        }
        if age < QUEUED {
            ("PENDING", 0, "Priority")
        } else if age < QUEUED + RUNS.min(self.time_limit) {
            ("RUNNING", 0, "None")
        } else if RUNS > self.time_limit {
            ("TIMEOUT", 0, "None")
        } else if self.passes {
            ("COMPLETED", 0, "None")
        } else {
            ("FAILED", 256, "NonZeroExitCode")
        }
    }

    fn json(&self, id: u64, now: Instant) -> Value {
        let (state, exit, reason) = self.state(now);
        json!({
            "job_id": id, "name": self.name, "job_state": state, "exit_code": exit,
            "state_reason": reason, "nodes": if state == "PENDING" { "" } else { &self.node },
            "partition": "maintenance", "user_name": "root",
        })
    }
}

pub(crate) fn routes(r: Router<App>) -> Router<App> {
    r.route("/{site}/slurm/{v}/job/submit", post(submit))
        .route("/{site}/slurm/{v}/job/{id}", get(read).delete(cancel))
        .route("/{site}/slurm/{v}/jobs", get(list))
}

fn refused(status: StatusCode, number: i64, error: &str) -> Response {
    body(
        status,
        json!({"meta": slurm_meta(), "errors": [{"error_number": number, "error": error}]}),
    )
}

async fn submit(
    State(app): State<App>,
    Path((site, v)): Path<(String, String)>,
    Json(b): Json<Value>,
) -> Response {
    if v != "v0.0.38" {
        return slurm_not_found();
    }
    let job = &b["job"];
    let (Some(script), Some(name)) = (b["script"].as_str(), job["name"].as_str()) else {
        return refused(
            StatusCode::BAD_REQUEST,
            9001,
            "script and job.name are required",
        );
    };
    if !script.starts_with("#!") || job["environment"].as_object().is_none() {
        return refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            2136,
            "Batch job submission failed: the script needs a #! and the job an environment",
        );
    }
    let node = job["constraints"].as_str().unwrap_or("").to_string();
    let mut s = app.lock();
    if s.outages.slurm {
        return refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            1007,
            "simulated outage: Unable to contact slurm controller (connect failure)",
        );
    }
    let Some(health) = s
        .by_name(&node)
        .filter(|d| d.site == site)
        .map(|d| d.health)
    else {
        return refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            2072,
            "Batch job submission failed: Invalid feature specification",
        );
    };
    let minutes = job["time_limit"].as_u64().unwrap_or(60).max(1);
    let jobs = &mut s.slurm_jobs;
    jobs.next += 1;
    let id = 1000 + jobs.next;
    jobs.jobs.insert(
        id,
        SimJob {
            name: name.to_string(),
            site,
            node,
            submitted: Instant::now(),
            passes: health == 0,
            cancelled: None,
            time_limit: Duration::from_secs(minutes * 60),
        },
    );
    body(
        StatusCode::OK,
        json!({"meta": slurm_meta(), "errors": [], "job_id": id, "step_id": "batch", "job_submit_user_msg": ""}),
    )
}

async fn read(
    State(app): State<App>,
    Path((site, v, id)): Path<(String, String, String)>,
) -> Response {
    if v != "v0.0.38" {
        return slurm_not_found();
    }
    let s = app.lock();
    let id: u64 = id.parse().unwrap_or(0);
    match s.slurm_jobs.jobs.get(&id).filter(|j| j.site == site) {
        Some(j) => body(
            StatusCode::OK,
            json!({"meta": slurm_meta(), "errors": [], "jobs": [j.json(id, Instant::now())]}),
        ),
        None => refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            2017,
            "Invalid job id specified",
        ),
    }
}

async fn list(State(app): State<App>, Path((site, v)): Path<(String, String)>) -> Response {
    if v != "v0.0.38" {
        return slurm_not_found();
    }
    let s = app.lock();
    let now = Instant::now();
    let jobs: Vec<Value> = s
        .slurm_jobs
        .jobs
        .iter()
        .filter(|(_, j)| j.site == site)
        .map(|(id, j)| j.json(*id, now))
        .collect();
    body(
        StatusCode::OK,
        json!({"meta": slurm_meta(), "errors": [], "jobs": jobs}),
    )
}

async fn cancel(
    State(app): State<App>,
    Path((site, v, id)): Path<(String, String, String)>,
) -> Response {
    if v != "v0.0.38" {
        return slurm_not_found();
    }
    let mut s = app.lock();
    let id: u64 = id.parse().unwrap_or(0);
    match s.slurm_jobs.jobs.get_mut(&id).filter(|j| j.site == site) {
        Some(j) => {
            j.cancelled.get_or_insert_with(Instant::now);
            body(StatusCode::OK, json!({"meta": slurm_meta(), "errors": []}))
        }
        None => refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            2017,
            "Invalid job id specified",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(passes: bool, minutes: u64) -> SimJob {
        SimJob {
            name: "n".into(),
            site: "s".into(),
            node: "gpu".into(),
            submitted: Instant::now(),
            passes,
            cancelled: None,
            time_limit: Duration::from_secs(minutes * 60),
        }
    }

    #[test]
    fn a_job_queues_runs_and_ends_by_its_nodes_health() {
        let j = job(true, 30);
        let t = j.submitted;
        assert_eq!(j.state(t).0, "PENDING");
        assert_eq!(j.state(t + QUEUED).0, "RUNNING");
        assert_eq!(j.state(t + QUEUED + RUNS).0, "COMPLETED");
        let f = SimJob {
            submitted: t,
            ..job(false, 30)
        };
        assert_eq!(
            f.state(t + QUEUED + RUNS),
            ("FAILED", 256, "NonZeroExitCode")
        );
        let c = SimJob {
            submitted: t,
            cancelled: Some(t + QUEUED),
            ..job(true, 30)
        };
        assert_eq!(c.state(t + QUEUED + RUNS).0, "CANCELLED");
        let short = SimJob {
            submitted: t,
            time_limit: RUNS / 2,
            ..job(true, 30)
        };
        assert_eq!(short.state(t + QUEUED + RUNS).0, "TIMEOUT");
    }
}
