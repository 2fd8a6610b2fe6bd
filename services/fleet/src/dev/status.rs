//! What `fleet dev` shows: progress while the fleet is imported and
//! derived, then a summary from PostgreSQL and the hub's metrics.

use std::collections::BTreeMap;

use crate::dev::DevMesh;

/// Devices the hub knows, and those it has derived from the OpenStack
/// conditions (an applied openstack snapshot), of the simulated N.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub imported: i64,
    pub derived: i64,
    pub of: usize,
}

impl Progress {
    pub fn done(&self) -> bool {
        self.derived as usize >= self.of && self.imported as usize >= self.of
    }
}

/// How many devices the hub holds exactly as the scenario engine expects
/// them now (its ground truth, computed without the hub).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Agreement {
    /// Devices the engine simulates.
    pub of: usize,
    /// Devices whose operational status, health and connectivity all match.
    pub matching: usize,
    pub operational: usize,
    pub health: usize,
    pub connectivity: usize,
    /// Simulated agents that want a session and do not have one open yet.
    pub agents_not_open: usize,
    /// One device that does not match, with what the hub holds and what
    /// the engine expects (for the log).
    pub example: Option<String>,
}

impl Agreement {
    /// Every device matches and every agent has its session open.
    pub fn converged(&self) -> bool {
        self.of > 0 && self.matching == self.of && self.agents_not_open == 0
    }
}

#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub operational: BTreeMap<String, i64>,
    pub health: BTreeMap<String, i64>,
    /// Devices with a no-schedule reason or cordoned.
    pub no_schedule: i64,
    pub cordoned: i64,
    /// `fleet_hub_observations_total`, summed over its labels.
    pub observations_total: f64,
    /// Status events not yet published (outbox rows) and the oldest's age.
    pub outbox_rows: i64,
    pub outbox_oldest_secs: f64,
    /// Expected by the scenario engine, per operational status.
    pub truth: BTreeMap<&'static str, usize>,
    /// Expected by the scenario engine, per health status.
    pub health_truth: BTreeMap<&'static str, usize>,
    /// Devices per `provision_state`: the agents' devices go `adopting` ->
    /// `adopted` when acceptance passes against their pool's profile.
    pub provision: BTreeMap<String, i64>,
    /// Devices per `connectivity`, hub and expected (the simulated agents).
    pub connectivity: BTreeMap<String, i64>,
    pub connectivity_truth: BTreeMap<&'static str, usize>,
    /// Devices per Borneo custody state, hub and expected.
    pub custody: BTreeMap<String, i64>,
    pub custody_truth: BTreeMap<&'static str, usize>,
    /// `FrontendPortsInCustomerVrf` latches per reason, hub and expected.
    pub latches: BTreeMap<String, i64>,
    pub latch_truth: BTreeMap<&'static str, usize>,
    /// Live-fabric observations that are `True`, per type, hub and expected.
    pub fabric_true: BTreeMap<String, i64>,
    pub fabric_true_truth: BTreeMap<&'static str, usize>,
}

impl DevMesh {
    pub async fn progress(&self) -> anyhow::Result<Progress> {
        let (imported, derived): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM devices), \
                    (SELECT count(*) FROM device_source_freshness WHERE source = 'openstack')",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Progress {
            imported,
            derived,
            of: self.devices,
        })
    }

    /// Compares every device the hub holds with the engine's expectation
    /// for it: one pass over `devices`.
    pub async fn agreement(&self) -> anyhow::Result<Agreement> {
        let (truth, agents_not_open) = {
            let s = self.scenario.lock().unwrap_or_else(|e| e.into_inner());
            (s.device_truth(), s.agents_not_open())
        };
        let rows: Vec<(String, String, String, String, String)> = sqlx::query_as(
            "SELECT site_id, name, operational_status, health_status, connectivity FROM devices",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(agree(&truth, &rows, agents_not_open))
    }

    /// Devices per operational status as the hub wrote them.
    pub async fn operational_distribution(&self) -> anyhow::Result<BTreeMap<String, i64>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT operational_status, count(*) FROM devices GROUP BY 1 ORDER BY 1",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().collect())
    }

    pub async fn summary(&self) -> anyhow::Result<Summary> {
        let operational = self.operational_distribution().await?;
        let health: Vec<(String, i64)> =
            sqlx::query_as("SELECT health_status, count(*) FROM devices GROUP BY 1 ORDER BY 1")
                .fetch_all(&self.pool)
                .await?;
        let (no_schedule, cordoned): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE cardinality(no_schedule_reasons) > 0 OR cordoned), \
                    count(*) FILTER (WHERE cordoned) FROM devices",
        )
        .fetch_one(&self.pool)
        .await?;
        let (outbox_rows, outbox_oldest_secs): (i64, f64) = sqlx::query_as(
            "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0) FROM outbox",
        )
        .fetch_one(&self.pool)
        .await?;
        let pairs = |rows: Vec<(String, i64)>| rows.into_iter().collect::<BTreeMap<_, _>>();
        let connectivity = pairs(
            sqlx::query_as("SELECT connectivity, count(*) FROM devices GROUP BY 1")
                .fetch_all(&self.pool)
                .await?,
        );
        let provision = pairs(
            sqlx::query_as("SELECT provision_state, count(*) FROM devices GROUP BY 1")
                .fetch_all(&self.pool)
                .await?,
        );
        let custody = pairs(
            sqlx::query_as(
                "SELECT custody, count(*) FROM devices WHERE custody IS NOT NULL GROUP BY 1",
            )
            .fetch_all(&self.pool)
            .await?,
        );
        let latches = pairs(
            sqlx::query_as(
                "SELECT reason, count(*) FROM device_conditions \
                 WHERE type = 'FrontendPortsInCustomerVrf' GROUP BY 1",
            )
            .fetch_all(&self.pool)
            .await?,
        );
        let fabric_true = pairs(
            sqlx::query_as(
                "SELECT type, count(*) FROM device_conditions WHERE status = 'True' AND type IN \
                 ('FrontendPortsObservedInCustomerVrf', 'BackendPortsObservedInMaintenanceVrf', \
                  'NvLinkGpusObservedInRepairPartition') GROUP BY 1",
            )
            .fetch_all(&self.pool)
            .await?,
        );
        let (connectivity_truth, custody_truth, latch_truth, fabric_true_truth) = {
            let s = self.scenario.lock().unwrap_or_else(|e| e.into_inner());
            let mut f = BTreeMap::new();
            for ((t, st), n) in s.fabric_truth() {
                if st == crate::dev::engine::Tri::True {
                    f.insert(t, n);
                }
            }
            (
                s.connectivity_truth(),
                s.custody_truth(),
                s.latch_truth(),
                f,
            )
        };
        Ok(Summary {
            provision,
            connectivity,
            connectivity_truth,
            custody,
            custody_truth,
            latches,
            latch_truth,
            fabric_true,
            fabric_true_truth,
            operational,
            health: health.into_iter().collect(),
            no_schedule,
            cordoned,
            observations_total: self.hub_observations().await.unwrap_or(0.0),
            outbox_rows,
            outbox_oldest_secs,
            truth: self.ground_truth(),
            health_truth: self.health_truth(),
        })
    }

    /// `fleet_hub_observations_total` from the hub's `/metrics`.
    pub async fn hub_observations(&self) -> anyhow::Result<f64> {
        let text = http_get(&self.hub_metrics_url).await?;
        Ok(sum_metric(&text, "fleet_hub_observations"))
    }

    /// `fleet_hub_status_events_total` (StatusChanged events written) from
    /// the hub's `/metrics`.
    pub async fn hub_status_events(&self) -> anyhow::Result<f64> {
        let text = http_get(&self.hub_metrics_url).await?;
        Ok(sum_metric(&text, "fleet_hub_status_events"))
    }
}

/// Counts the hub's rows `(site, name, operational, health, connectivity)`
/// that match `truth`; a device the hub does not hold matches nothing.
pub fn agree(
    truth: &std::collections::HashMap<(String, String), crate::dev::engine::Expected>,
    rows: &[(String, String, String, String, String)],
    agents_not_open: usize,
) -> Agreement {
    let mut a = Agreement {
        of: truth.len(),
        agents_not_open,
        ..Default::default()
    };
    for (site, name, operational, health, connectivity) in rows {
        let Some(e) = truth.get(&(site.clone(), name.clone())) else {
            continue;
        };
        let o = e.operational == operational;
        let h = e.health == health;
        let c = e.connectivity == connectivity;
        a.operational += o as usize;
        a.health += h as usize;
        a.connectivity += c as usize;
        if o && h && c {
            a.matching += 1;
        } else if a.example.is_none() {
            a.example = Some(format!(
                "{site}/{name}: hub {operational}/{health}/{connectivity}, expected {}/{}/{}",
                e.operational, e.health, e.connectivity
            ));
        }
    }
    a
}

/// The sum of every sample of a counter family (`<name>_total{...} v`).
pub fn sum_metric(text: &str, family: &str) -> f64 {
    let total = format!("{family}_total");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, rest) = l.split_at(l.find(['{', ' '])?);
            (name == total).then_some(rest)
        })
        .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A plain HTTP/1.0 GET (the hub's metrics are on 127.0.0.1).
async fn http_get(url: &str) -> anyhow::Result<String> {
    Ok(http_get_full(url).await?.1)
}

/// Whether `url` answers 200.
pub(crate) async fn http_ok(url: &str) -> bool {
    matches!(http_get_full(url).await, Ok((200, _)))
}

async fn http_get_full(url: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("{url} is not http"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut s = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        tokio::net::TcpStream::connect(host),
    )
    .await??;
    s.write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(2), s.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use crate::dev::engine::Expected;

    #[test]
    fn agreement_counts_each_axis_and_a_missing_device_matches_nothing() {
        let e = |o, h, c| Expected {
            operational: o,
            health: h,
            connectivity: c,
        };
        let truth: std::collections::HashMap<(String, String), Expected> = [
            (
                ("s1".into(), "a".into()),
                e("available", "healthy", "connected"),
            ),
            (
                ("s1".into(), "b".into()),
                e("failed", "critical", "disconnected"),
            ),
            (
                ("s2".into(), "a".into()),
                e("in_use", "healthy", "connected"),
            ),
        ]
        .into_iter()
        .collect();
        let row = |s: &str, n: &str, o: &str, h: &str, c: &str| {
            (s.into(), n.into(), o.into(), h.into(), c.into())
        };
        let rows = vec![
            row("s1", "a", "available", "healthy", "connected"),
            row("s1", "b", "failed", "degraded", "disconnected"),
            row("s9", "zzz", "available", "healthy", "connected"),
        ];
        let a = super::agree(&truth, &rows, 0);
        assert_eq!((a.of, a.matching), (3, 1));
        assert_eq!((a.operational, a.health, a.connectivity), (2, 1, 2));
        assert!(!a.converged());
        assert_eq!(
            a.example.as_deref(),
            Some("s1/b: hub failed/degraded/disconnected, expected failed/critical/disconnected")
        );
        let rows = vec![
            row("s1", "a", "available", "healthy", "connected"),
            row("s1", "b", "failed", "critical", "disconnected"),
            row("s2", "a", "in_use", "healthy", "connected"),
        ];
        assert!(super::agree(&truth, &rows, 0).converged());
        assert!(
            !super::agree(&truth, &rows, 1).converged(),
            "an agent not open yet"
        );
    }

    #[test]
    fn counter_samples_are_summed() {
        let text = "# TYPE fleet_hub_observations counter\n\
            fleet_hub_observations_total{source=\"slurm\"} 12\n\
            fleet_hub_observations_total{source=\"openstack\"} 30.5\n\
            fleet_hub_observations_totalx 99\n\
            fleet_hub_rows_written_total 7\n";
        assert_eq!(super::sum_metric(text, "fleet_hub_observations"), 42.5);
    }
}
