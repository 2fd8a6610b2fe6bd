//! The real SLURM 22.05 (slurmrestd v0.0.38 on 127.0.0.1:6820, nodes
//! `gpu01`..) that `tests/peers/slurm.sh start` runs (from `tests/run`).
//! `SLURM_REST_URL` and `SLURM_JWT_FILE` override the defaults. Tests read
//! it; none drains or resumes its nodes, so they share it.

use std::time::Duration;

const START: &str = "bash tests/peers/slurm.sh start (from the repository root; tests/run does it)";

pub struct RealSlurm {
    pub url: String,
    /// The file holding root's JWT.
    pub token_file: String,
}

impl RealSlurm {
    /// The peer, or a panic saying how to start it: slurmrestd answers a
    /// ping with the JWT and slurmctld is UP.
    pub async fn connect() -> RealSlurm {
        let url =
            std::env::var("SLURM_REST_URL").unwrap_or_else(|_| "http://127.0.0.1:6820".into());
        let token_file =
            std::env::var("SLURM_JWT_FILE").unwrap_or_else(|_| "/tmp/peers/slurm/jwt.token".into());
        let token = std::fs::read_to_string(&token_file)
            .unwrap_or_else(|e| panic!("the slurmrestd JWT is not readable at {token_file} ({e}): is the local SLURM running? Start it with: {START}"))
            .trim()
            .to_string();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("http client");
        let ping = http
            .get(format!("{url}/slurm/v0.0.38/ping"))
            .header("X-SLURM-USER-NAME", "root")
            .header("X-SLURM-USER-TOKEN", &token)
            .send()
            .await;
        let body: serde_json::Value = match ping {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(e) => panic!("slurmrestd is not reachable at {url}: {e}. Start it with: {START}"),
        };
        assert!(
            body["pings"][0]["ping"] == "UP",
            "slurmrestd at {url} answers but slurmctld is not UP: {body}. Restart it with: {START}"
        );
        RealSlurm { url, token_file }
    }

    /// A site's slurmrestd configuration naming this peer (version
    /// detected, the JWT read from its file on every call).
    pub fn site_config(&self) -> fleet_slurm::SiteConfig {
        fleet_slurm::SiteConfig {
            url: self.url.clone(),
            user_name: "root".into(),
            token: fleet_runtime::config::Credential {
                file: self.token_file.clone(),
                ..Default::default()
            },
            ..Default::default()
        }
    }
}
