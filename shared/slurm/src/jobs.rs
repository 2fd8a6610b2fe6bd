//! SLURM batch jobs over slurmrestd v0.0.38 (SLURM 22.05), as the burn-in
//! workflows submit and follow them: `POST /slurm/v0.0.38/job/submit`,
//! `GET /slurm/v0.0.38/job/{id}`, `GET /slurm/v0.0.38/jobs` (to find a
//! run's job by name after a crash) and `DELETE /slurm/v0.0.38/job/{id}`.
//! Later versions change the submission's shape (v0.0.39's `environment`
//! is a list, v0.0.40's `job_state` a list): they are refused with a clear
//! error until this build speaks them.

use std::collections::BTreeMap;

use fleet_connector::paginate::join;
use fleet_connector::SourceError;
use reqwest::Url;
use serde::{Deserialize, Serialize};

use crate::{ApiVersion, Slurmrestd};

/// One submission: the `job` of `POST /slurm/v0.0.38/job/submit`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Submission {
    pub name: String,
    /// The batch script (its first line a `#!`).
    #[serde(skip)]
    pub script: String,
    /// The node feature that pins the job to the device's node.
    pub constraints: String,
    pub nodes: String,
    /// Minutes; SLURM ends the job `TIMEOUT` after it.
    pub time_limit: u32,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub partition: String,
    pub comment: String,
    pub current_working_directory: String,
    /// v0.0.38 refuses a submission without an environment.
    pub environment: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct SubmitBody<'a> {
    script: &'a str,
    job: &'a Submission,
}

#[derive(Debug, Deserialize)]
struct SubmitAnswer {
    #[serde(default)]
    job_id: Option<u64>,
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

/// One job as `GET /slurm/v0.0.38/job/{id}` and `/jobs` report it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Job {
    pub job_id: u64,
    #[serde(default)]
    pub name: String,
    /// v0.0.38: one string; read as a list so v0.0.39+'s fits.
    #[serde(default, deserialize_with = "one_or_many")]
    pub job_state: Vec<String>,
    #[serde(default)]
    pub exit_code: Option<i64>,
    #[serde(default)]
    pub state_reason: String,
    /// The nodes it ran (or runs) on.
    #[serde(default)]
    pub nodes: String,
    #[serde(default)]
    pub submit_time: Option<i64>,
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match Option::<crate::OneOrMany>::deserialize(d)? {
        None => vec![],
        Some(crate::OneOrMany::One(s)) => vec![s],
        Some(crate::OneOrMany::Many(v)) => v,
    })
}

#[derive(Debug, Deserialize)]
struct JobsAnswer {
    #[serde(default)]
    jobs: Vec<Job>,
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

fn refused(what: &str, errors: &[serde_json::Value]) -> SourceError {
    SourceError::Protocol(format!(
        "slurmrestd refused {what}: {}",
        fleet_connector::error::body_excerpt(&serde_json::json!({ "errors": errors }).to_string())
    ))
}

impl Slurmrestd {
    /// The version, when this build submits jobs through it.
    async fn job_version(&mut self) -> Result<ApiVersion, SourceError> {
        let v = self.version().await?;
        if v.0 != 38 {
            return Err(SourceError::Config(format!(
                "slurmrestd {v} at site {}: this build submits burn-in jobs through v0.0.38 \
                 (SLURM 22.05) only; set {}.api_version = \"v0.0.38\" if the server serves it",
                self.site, self.key
            )));
        }
        Ok(v)
    }

    fn job_url(&self, v: ApiVersion, id: u64) -> Url {
        join(&self.base, &format!("slurm/{v}/job/{id}"))
    }

    /// `POST /slurm/v0.0.38/job/submit`, sent once (a repeat would be a
    /// second job): the new job's id. A timeout leaves the outcome unknown;
    /// the caller looks the job up by name before it submits again.
    pub async fn submit_job(&mut self, job: &Submission) -> Result<u64, SourceError> {
        let v = self.job_version().await?;
        let auth = self.auth()?;
        let url = join(&self.base, &format!("slurm/{v}/job/submit"));
        let body = SubmitBody {
            script: &job.script,
            job,
        };
        let resp = self
            .http
            .send_once(url.as_str(), |c| {
                auth.apply(c.post(url.clone()).json(&body))
            })
            .await?;
        let a: SubmitAnswer = self.http.decode(url.as_str(), resp).await?;
        match a.job_id {
            Some(id) if a.errors.is_empty() => Ok(id),
            _ => Err(refused(
                &format!("the submission of {}", job.name),
                &a.errors,
            )),
        }
    }

    /// `GET /slurm/v0.0.38/job/{id}`; `None` when slurmctld no longer
    /// knows the job (errno 2017, "Invalid job id specified").
    pub async fn job(&mut self, id: u64) -> Result<Option<Job>, SourceError> {
        let v = self.job_version().await?;
        let auth = self.auth()?;
        let url = self.job_url(v, id);
        let a: JobsAnswer = match self
            .http
            .json(url.as_str(), |c| auth.apply(c.get(url.clone())))
            .await
        {
            Ok(a) => a,
            Err(SourceError::Status { status, body, .. })
                if (status == 404 || status == 500) && body.contains("Invalid job id") =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let found = a.jobs.into_iter().find(|j| j.job_id == id);
        if found.is_none() && !a.errors.is_empty() {
            let unknown = a
                .errors
                .iter()
                .any(|e| e["error_number"] == 2017 || e.to_string().contains("Invalid job id"));
            if !unknown {
                return Err(refused(&format!("the read of job {id}"), &a.errors));
            }
        }
        Ok(found)
    }

    /// The jobs named `name` (`GET /slurm/v0.0.38/jobs`, which lists every
    /// job slurmctld still holds), newest first.
    pub async fn jobs_named(&mut self, name: &str) -> Result<Vec<Job>, SourceError> {
        let v = self.job_version().await?;
        let auth = self.auth()?;
        let url = join(&self.base, &format!("slurm/{v}/jobs"));
        let a: JobsAnswer = self
            .http
            .json(url.as_str(), |c| auth.apply(c.get(url.clone())))
            .await?;
        if a.jobs.is_empty() && !a.errors.is_empty() {
            return Err(refused("the job list", &a.errors));
        }
        let mut jobs: Vec<Job> = a.jobs.into_iter().filter(|j| j.name == name).collect();
        jobs.sort_by(|a, b| b.job_id.cmp(&a.job_id));
        Ok(jobs)
    }

    /// `DELETE /slurm/v0.0.38/job/{id}` (SIGKILL, as `scancel`). A job
    /// slurmctld no longer knows, or one already ended, is not an error.
    pub async fn cancel_job(&mut self, id: u64) -> Result<(), SourceError> {
        let v = self.job_version().await?;
        let auth = self.auth()?;
        let url = self.job_url(v, id);
        match self
            .http
            .send(url.as_str(), |c| auth.apply(c.delete(url.clone())))
            .await
        {
            Ok(_) => Ok(()),
            Err(SourceError::Status { body, .. })
                if body.contains("Invalid job id") || body.contains("already completed") =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_submission_is_the_v0_0_38_shape() {
        let job = Submission {
            name: "fleet-single_node_test-j-d".into(),
            script: "#!/bin/bash\nexit 0\n".into(),
            constraints: "gpu04".into(),
            nodes: "1".into(),
            time_limit: 30,
            partition: String::new(),
            comment: "fleet job j device d".into(),
            current_working_directory: "/tmp".into(),
            environment: [("PATH".to_string(), "/usr/bin:/bin".to_string())]
                .into_iter()
                .collect(),
        };
        let body = serde_json::to_value(SubmitBody {
            script: &job.script,
            job: &job,
        })
        .unwrap();
        assert_eq!(body["script"], "#!/bin/bash\nexit 0\n");
        assert_eq!(body["job"]["constraints"], "gpu04");
        assert_eq!(body["job"]["environment"]["PATH"], "/usr/bin:/bin");
        assert!(body["job"].get("script").is_none());
        assert!(body["job"].get("partition").is_none());
    }

    #[test]
    fn a_job_reads_as_v0_0_38_and_v0_0_40_report_it() {
        let old: Job = serde_json::from_value(serde_json::json!({
            "job_id": 7, "name": "n", "job_state": "FAILED", "exit_code": 768,
            "state_reason": "NonZeroExitCode", "nodes": "gpu04"
        }))
        .unwrap();
        assert_eq!(old.job_state, vec!["FAILED"]);
        let new: Job = serde_json::from_value(serde_json::json!({
            "job_id": 7, "job_state": ["RUNNING", "COMPLETING"]
        }))
        .unwrap();
        assert_eq!(new.job_state, vec!["RUNNING", "COMPLETING"]);
    }
}
