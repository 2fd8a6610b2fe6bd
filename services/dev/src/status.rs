//! What `fleet dev` shows: progress while the fleet is imported and
//! derived, then a summary from PostgreSQL and the hub's metrics.

use std::collections::BTreeMap;

use crate::DevMesh;

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
                if st == crate::engine::Tri::True {
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

/// A plain HTTP/1.0 GET with an `Authorization` header; the body of a
/// 200, an error otherwise.
pub(crate) async fn http_get_auth(url: &str, authorization: &str) -> anyhow::Result<String> {
    let (status, body) = http_request(url, Some(authorization)).await?;
    anyhow::ensure!(status == 200, "GET {url}: HTTP {status}");
    Ok(body)
}

async fn http_get_full(url: &str) -> anyhow::Result<(u16, String)> {
    http_request(url, None).await
}

async fn http_request(url: &str, authorization: Option<&str>) -> anyhow::Result<(u16, String)> {
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
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    s.write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n{auth}\r\n").as_bytes())
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
