//! The health series contract, and the pure mapping from Prometheus
//! instant-query results to snapshots. No IO.
//!
//! # The series contract
//!
//! Every series is a gauge labelled with the host (the fleet device name,
//! label `connectors.health.host_label`, default `host`) whose value is a
//! health code: `0` = Ok, `1` = Warning, `2` = Critical. Any other value is
//! unrecognised. One instant query per series reads every host of a site
//! (`<metric>{<site selector>}`); a host with several series of one metric
//! (one per PSU, fan, GPU, ...) takes the worst.
//!
//! | condition | metric | reasons (Ok / Warning / Critical / absent / unrecognised) |
//! |---|---|---|
//! | `ChassisHealth` | `chassis_health` (the composite; also the `chassis_health` mirror) | `RedfishHealthOk` / `RedfishHealthWarning` / `RedfishHealthCritical` / `RedfishTelemetryUnavailable` / `RedfishHealthUnrecognized` |
//! | `PowerSupplyHealth` | `redfish_power_supply_health` | Redfish reasons |
//! | `FanHealth` | `redfish_fan_health` | Redfish reasons |
//! | `ThermalHealth` | `redfish_thermal_health` | Redfish reasons |
//! | `MemoryHealth` | `redfish_memory_health` | Redfish reasons |
//! | `StorageHealth` | `redfish_storage_health` | Redfish reasons |
//! | `ProcessorHealth` | `redfish_processor_health` | Redfish reasons |
//! | `NetworkAdapterHealth` | `redfish_network_adapter_health` | Redfish reasons |
//! | `GpuHealth` | `nvidia_gpu_health` | `NvidiaGpuHealthOk` / `NvidiaGpuHealthDegraded` / `NvidiaGpuHealthCritical` / `NvidiaGpuTelemetryUnavailable` / `NvidiaGpuHealthUnrecognized` |
//! | `FpgaHealth` | `nvidia_fpga_health` | `NvidiaFpgaHealthOk` / `NvidiaFpgaHealthDegraded` / `NvidiaFpgaHealthCritical` / `NvidiaFpgaTelemetryUnavailable` / `NvidiaFpgaHealthUnrecognized` |
//!
//! Ok is `True`; Warning and Critical are `False`; absent and unrecognised
//! are `Unknown`. Every message opens with the exact series selector read,
//! e.g. `chassis_health{host="gpu-a1-01"} = 2 (Critical)`. The query API
//! unreadable: all ten `Unknown` `MimirUnreachable`, and the mirror empty so
//! `health_status` reads `unknown`, never `critical`.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use fleet_connector::snapshot::{condition, key, snapshot};
use fleet_domain::{ChassisHealth, ConditionStatus, ConditionType, KeyKind, Source};
use fleet_proto::v1::{self, condition_snapshot::Mirror};
use serde::Deserialize;

pub const MIMIR_UNREACHABLE: &str = "MimirUnreachable";

/// Who reports a series, which names its reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Redfish,
    NvidiaGpu,
    NvidiaFpga,
}

impl Family {
    /// The reason of a reading.
    pub fn reason(self, r: &Reading) -> &'static str {
        let [ok, warning, critical, absent, unrecognized] = match self {
            Family::Redfish => [
                "RedfishHealthOk",
                "RedfishHealthWarning",
                "RedfishHealthCritical",
                "RedfishTelemetryUnavailable",
                "RedfishHealthUnrecognized",
            ],
            Family::NvidiaGpu => [
                "NvidiaGpuHealthOk",
                "NvidiaGpuHealthDegraded",
                "NvidiaGpuHealthCritical",
                "NvidiaGpuTelemetryUnavailable",
                "NvidiaGpuHealthUnrecognized",
            ],
            Family::NvidiaFpga => [
                "NvidiaFpgaHealthOk",
                "NvidiaFpgaHealthDegraded",
                "NvidiaFpgaHealthCritical",
                "NvidiaFpgaTelemetryUnavailable",
                "NvidiaFpgaHealthUnrecognized",
            ],
        };
        match r {
            Reading::Value { health, .. } => match health {
                ChassisHealth::Ok => ok,
                ChassisHealth::Warning => warning,
                ChassisHealth::Critical => critical,
            },
            Reading::Absent => absent,
            Reading::Unrecognized { .. } => unrecognized,
        }
    }
}

/// One series of the contract.
#[derive(Debug, Clone, Copy)]
pub struct Series {
    pub condition: ConditionType,
    pub metric: &'static str,
    pub family: Family,
}

const fn s(condition: ConditionType, metric: &'static str, family: Family) -> Series {
    Series {
        condition,
        metric,
        family,
    }
}

/// The ten series, in the catalogue's order; the first is the composite.
pub const SERIES: [Series; 10] = [
    s(
        ConditionType::ChassisHealth,
        "chassis_health",
        Family::Redfish,
    ),
    s(
        ConditionType::PowerSupplyHealth,
        "redfish_power_supply_health",
        Family::Redfish,
    ),
    s(
        ConditionType::FanHealth,
        "redfish_fan_health",
        Family::Redfish,
    ),
    s(
        ConditionType::ThermalHealth,
        "redfish_thermal_health",
        Family::Redfish,
    ),
    s(
        ConditionType::MemoryHealth,
        "redfish_memory_health",
        Family::Redfish,
    ),
    s(
        ConditionType::StorageHealth,
        "redfish_storage_health",
        Family::Redfish,
    ),
    s(
        ConditionType::ProcessorHealth,
        "redfish_processor_health",
        Family::Redfish,
    ),
    s(
        ConditionType::NetworkAdapterHealth,
        "redfish_network_adapter_health",
        Family::Redfish,
    ),
    s(
        ConditionType::GpuHealth,
        "nvidia_gpu_health",
        Family::NvidiaGpu,
    ),
    s(
        ConditionType::FpgaHealth,
        "nvidia_fpga_health",
        Family::NvidiaFpga,
    ),
];

/// The value encoding: `0` Ok, `1` Warning, `2` Critical.
pub fn decode_value(raw: &str) -> Option<ChassisHealth> {
    let v: f64 = raw.trim().parse().ok()?;
    if v == 0.0 {
        Some(ChassisHealth::Ok)
    } else if v == 1.0 {
        Some(ChassisHealth::Warning)
    } else if v == 2.0 {
        Some(ChassisHealth::Critical)
    } else {
        None
    }
}

fn severity(h: ChassisHealth) -> u8 {
    match h {
        ChassisHealth::Ok => 0,
        ChassisHealth::Warning => 1,
        ChassisHealth::Critical => 2,
    }
}

/// A PromQL string literal.
fn quote(v: &str) -> String {
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The one query of a series for a whole site.
pub fn query(metric: &str, site_selector: &str) -> String {
    let extra = site_selector.trim();
    if extra.is_empty() {
        metric.to_string()
    } else {
        format!("{metric}{{{extra}}}")
    }
}

/// The exact selector of one host's series, which every message opens with.
pub fn selector(metric: &str, host_label: &str, host: &str, site_selector: &str) -> String {
    let extra = site_selector.trim();
    if extra.is_empty() {
        format!("{metric}{{{host_label}={}}}", quote(host))
    } else {
        format!("{metric}{{{host_label}={},{extra}}}", quote(host))
    }
}

/// `GET /api/v1/query`.
#[derive(Debug, Clone, Deserialize)]
pub struct QueryResponse {
    pub status: String,
    #[serde(default)]
    pub data: Option<QueryData>,
    #[serde(default, rename = "errorType")]
    pub error_type: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct QueryData {
    #[serde(rename = "resultType")]
    pub result_type: String,
    pub result: serde_json::Value,
}

/// One sample of an instant vector: labels and `[timestamp, "value"]`.
#[derive(Debug, Clone, Deserialize)]
pub struct Sample {
    #[serde(default)]
    pub metric: BTreeMap<String, String>,
    pub value: (f64, String),
}

/// The samples of an instant-vector answer; anything else is a protocol
/// error, described without the body.
pub fn vector(resp: QueryResponse) -> Result<Vec<Sample>, String> {
    if resp.status != "success" {
        return Err(format!(
            "query status {:?}: {} {}",
            resp.status,
            resp.error_type.unwrap_or_default(),
            resp.error.unwrap_or_default()
        ));
    }
    let data = resp
        .data
        .ok_or_else(|| "a successful answer without data".to_string())?;
    if data.result_type != "vector" {
        return Err(format!(
            "resultType {:?}, expected an instant vector",
            data.result_type
        ));
    }
    serde_json::from_value(data.result).map_err(|e| format!("data.result: {e}"))
}

/// What one host's series said this cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    Absent,
    /// The worst recognised value of `series` samples.
    Value {
        health: ChassisHealth,
        raw: String,
        series: usize,
    },
    /// Only values outside the encoding.
    Unrecognized {
        raw: String,
    },
}

impl Reading {
    pub fn status(&self) -> ConditionStatus {
        match self {
            Reading::Value {
                health: ChassisHealth::Ok,
                ..
            } => ConditionStatus::True,
            Reading::Value { .. } => ConditionStatus::False,
            Reading::Absent | Reading::Unrecognized { .. } => ConditionStatus::Unknown,
        }
    }

    fn message(&self, selector: &str) -> String {
        match self {
            Reading::Absent => format!("{selector} absent: no sample in this cycle's query"),
            Reading::Value {
                health,
                raw,
                series: 1,
            } => format!("{selector} = {raw} ({health})"),
            Reading::Value {
                health,
                raw,
                series,
            } => format!("{selector} = {raw} ({health}), worst of {series} series"),
            Reading::Unrecognized { raw } => {
                format!("{selector} = {raw}: not 0 (Ok), 1 (Warning) or 2 (Critical)")
            }
        }
    }
}

/// Input the mapping could not use, for the caller to log and count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// Samples of a metric without the host label.
    NoHostLabel { metric: String, count: usize },
    /// A value outside the encoding (the host's reading ignores it when
    /// another series of the metric has a valid value).
    UnrecognizedValue {
        metric: String,
        host: String,
        raw: String,
    },
}

impl Warning {
    pub fn kind(&self) -> &'static str {
        match self {
            Warning::NoHostLabel { .. } => "no_host_label",
            Warning::UnrecognizedValue { .. } => "unrecognized_value",
        }
    }
}

#[derive(Debug, Default)]
pub struct Mapped {
    pub snapshots: Vec<v1::ConditionSnapshot>,
    pub warnings: Vec<Warning>,
}

/// The labels and the site selector every message of a site uses.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub site: &'a str,
    pub host_label: &'a str,
    pub site_selector: &'a str,
}

/// One host's snapshot of `conditions`, its mirror the `chassis` composite
/// (empty: none).
fn host_conditions(
    c: &Context<'_>,
    host: &str,
    at: DateTime<Utc>,
    conditions: Vec<v1::Condition>,
    chassis: Option<ChassisHealth>,
) -> v1::ConditionSnapshot {
    let mirror = v1::HealthMirror {
        chassis_health: chassis.map(|h| h.as_str().to_string()).unwrap_or_default(),
    };
    snapshot(
        Source::HealthStatus,
        key(c.site, KeyKind::Name, host),
        at,
        conditions,
        Some(Mirror::Health(mirror)),
    )
}

/// One query's samples grouped by host: the raw values of each.
fn by_host(
    series: &Series,
    samples: &[Sample],
    host_label: &str,
    warnings: &mut Vec<Warning>,
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut unlabelled = 0;
    for s in samples {
        match s.metric.get(host_label).map(|h| h.trim()) {
            Some(h) if !h.is_empty() => out
                .entry(h.to_string())
                .or_default()
                .push(s.value.1.clone()),
            _ => unlabelled += 1,
        }
    }
    if unlabelled > 0 {
        warnings.push(Warning::NoHostLabel {
            metric: series.metric.to_string(),
            count: unlabelled,
        });
    }
    out
}

fn reading(
    series: &Series,
    host: &str,
    raws: Option<&Vec<String>>,
    warnings: &mut Vec<Warning>,
) -> Reading {
    let Some(raws) = raws.filter(|r| !r.is_empty()) else {
        return Reading::Absent;
    };
    let mut worst: Option<(ChassisHealth, &String)> = None;
    let mut valid = 0;
    for raw in raws {
        match decode_value(raw) {
            Some(h) => {
                valid += 1;
                if worst.is_none_or(|(w, _)| severity(h) > severity(w)) {
                    worst = Some((h, raw));
                }
            }
            None => warnings.push(Warning::UnrecognizedValue {
                metric: series.metric.to_string(),
                host: host.to_string(),
                raw: raw.clone(),
            }),
        }
    }
    match worst {
        Some((health, raw)) => Reading::Value {
            health,
            raw: raw.clone(),
            series: valid,
        },
        None => Reading::Unrecognized {
            raw: raws[0].clone(),
        },
    }
}

/// One host's snapshot from its ten readings.
pub fn host_snapshot(
    c: &Context<'_>,
    host: &str,
    readings: &[Reading; 10],
    at: DateTime<Utc>,
) -> v1::ConditionSnapshot {
    let conditions = SERIES
        .iter()
        .zip(readings)
        .map(|(s, r)| {
            condition(
                s.condition,
                r.status(),
                s.family.reason(r),
                r.message(&selector(s.metric, c.host_label, host, c.site_selector)),
            )
        })
        .collect();
    let chassis = match &readings[0] {
        Reading::Value { health, .. } => Some(*health),
        _ => None,
    };
    host_conditions(c, host, at, conditions, chassis)
}

/// Maps the ten query results of one site (in [`SERIES`] order): every
/// host any series names gets its ten rows.
pub fn map_site(c: &Context<'_>, results: &[Vec<Sample>; 10], at: DateTime<Utc>) -> Mapped {
    let mut out = Mapped::default();
    let grouped: Vec<BTreeMap<String, Vec<String>>> = SERIES
        .iter()
        .zip(results)
        .map(|(s, samples)| by_host(s, samples, c.host_label, &mut out.warnings))
        .collect();
    let hosts: BTreeSet<&String> = grouped.iter().flat_map(|g| g.keys()).collect();
    for host in hosts {
        let readings: [Reading; 10] = std::array::from_fn(|i| {
            reading(&SERIES[i], host, grouped[i].get(host), &mut out.warnings)
        });
        out.snapshots.push(host_snapshot(c, host, &readings, at));
    }
    out
}

/// A host no series names any more: all ten absent, the mirror empty.
pub fn vanished(c: &Context<'_>, host: &str, at: DateTime<Utc>) -> v1::ConditionSnapshot {
    host_snapshot(c, host, &std::array::from_fn(|_| Reading::Absent), at)
}

/// The query API cannot be read: all ten `Unknown` `MimirUnreachable`,
/// each message the selector then the error; the mirror empty, so
/// `health_status` goes `unknown`.
pub fn outage(
    c: &Context<'_>,
    host: &str,
    at: DateTime<Utc>,
    error: &str,
) -> v1::ConditionSnapshot {
    let conditions = SERIES
        .iter()
        .map(|s| {
            condition(
                s.condition,
                ConditionStatus::Unknown,
                MIMIR_UNREACHABLE,
                format!(
                    "{}: the query API cannot be read: {error}",
                    selector(s.metric, c.host_label, host, c.site_selector)
                ),
            )
        })
        .collect();
    host_conditions(c, host, at, conditions, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGG: &str = include_str!("../testdata/prometheus-query-agg.json");
    const VECTOR: &str = include_str!("../testdata/prometheus-query-vector.json");
    const RANGE: &str = include_str!("../testdata/prometheus-query-range.json");

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-29T16:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    const CTX: Context<'static> = Context {
        site: "s1",
        host_label: "host",
        site_selector: "",
    };

    fn samples(v: serde_json::Value) -> Vec<Sample> {
        serde_json::from_value(v).unwrap()
    }

    fn sample(host: &str, value: &str) -> serde_json::Value {
        serde_json::json!({"metric": {"__name__": "x", "host": host}, "value": [1795966954.6, value]})
    }

    fn empty() -> [Vec<Sample>; 10] {
        std::array::from_fn(|_| vec![])
    }

    fn cond(s: &v1::ConditionSnapshot, t: ConditionType) -> &v1::Condition {
        s.conditions
            .iter()
            .find(|c| c.r#type == t.as_str())
            .unwrap()
    }

    fn mirror(s: &v1::ConditionSnapshot) -> String {
        match &s.mirror {
            Some(Mirror::Health(h)) => h.chassis_health.clone(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_contract_covers_the_ten_health_types_in_order() {
        let types: Vec<ConditionType> = SERIES.iter().map(|s| s.condition).collect();
        assert_eq!(types, fleet_domain::catalogue::HEALTH_TYPES.to_vec());
        let metrics: BTreeSet<&str> = SERIES.iter().map(|s| s.metric).collect();
        assert_eq!(metrics.len(), 10);
        assert_eq!(SERIES[0].metric, "chassis_health");
    }

    #[test]
    fn value_encoding() {
        for (raw, want) in [
            ("0", Some(ChassisHealth::Ok)),
            ("1", Some(ChassisHealth::Warning)),
            ("2", Some(ChassisHealth::Critical)),
            ("2.0", Some(ChassisHealth::Critical)),
            (" 1 ", Some(ChassisHealth::Warning)),
            ("3", None),
            ("79", None),
            ("0.5", None),
            ("-1", None),
            ("NaN", None),
            ("+Inf", None),
            ("", None),
            ("ok", None),
        ] {
            assert_eq!(decode_value(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn selectors_and_queries() {
        assert_eq!(query("chassis_health", ""), "chassis_health");
        assert_eq!(
            query("chassis_health", r#"site="lon1""#),
            r#"chassis_health{site="lon1"}"#
        );
        assert_eq!(
            selector("chassis_health", "host", "gpu-a1-01", ""),
            r#"chassis_health{host="gpu-a1-01"}"#
        );
        assert_eq!(
            selector("nvidia_gpu_health", "Hostname", "gpu01", r#"site="lon1""#),
            r#"nvidia_gpu_health{Hostname="gpu01",site="lon1"}"#
        );
        assert_eq!(
            selector("chassis_health", "host", r#"we"ird\host"#, ""),
            r#"chassis_health{host="we\"ird\\host"}"#
        );
    }

    /// Every status of every family: reason, status, message, mirror.
    #[test]
    fn each_reading_of_each_series() {
        let cases: [(&str, ConditionStatus, [&str; 3]); 3] = [
            (
                "0",
                ConditionStatus::True,
                ["RedfishHealthOk", "NvidiaGpuHealthOk", "NvidiaFpgaHealthOk"],
            ),
            (
                "1",
                ConditionStatus::False,
                [
                    "RedfishHealthWarning",
                    "NvidiaGpuHealthDegraded",
                    "NvidiaFpgaHealthDegraded",
                ],
            ),
            (
                "2",
                ConditionStatus::False,
                [
                    "RedfishHealthCritical",
                    "NvidiaGpuHealthCritical",
                    "NvidiaFpgaHealthCritical",
                ],
            ),
        ];
        for (i, series) in SERIES.iter().enumerate() {
            let fam = match series.family {
                Family::Redfish => 0,
                Family::NvidiaGpu => 1,
                Family::NvidiaFpga => 2,
            };
            for (raw, status, reasons) in &cases {
                let mut r = empty();
                r[i] = samples(serde_json::json!([sample("gpu-a1-01", raw)]));
                let m = map_site(&CTX, &r, at());
                assert_eq!(m.snapshots.len(), 1);
                let snap = &m.snapshots[0];
                assert_eq!(snap.conditions.len(), 10, "every host carries ten rows");
                let c = cond(snap, series.condition);
                assert_eq!(c.status, status.as_str(), "{} {raw}", series.metric);
                assert_eq!(c.reason, reasons[fam], "{} {raw}", series.metric);
                let sel = format!("{}{{host=\"gpu-a1-01\"}}", series.metric);
                assert!(c.message.starts_with(&sel), "{}", c.message);
                // The other nine are absent, with their own selector.
                for (j, other) in SERIES.iter().enumerate().filter(|(j, _)| *j != i) {
                    let o = cond(snap, other.condition);
                    assert_eq!(o.status, "Unknown");
                    assert!(o.reason.ends_with("TelemetryUnavailable"), "{}", o.reason);
                    assert_eq!(
                        o.message,
                        format!(
                            "{}{{host=\"gpu-a1-01\"}} absent: no sample in this cycle's query",
                            other.metric
                        ),
                        "{j}"
                    );
                }
                let want_mirror = if i == 0 {
                    decode_value(raw).unwrap().as_str().to_string()
                } else {
                    String::new()
                };
                assert_eq!(mirror(snap), want_mirror);
            }
        }
    }

    #[test]
    fn the_composite_message_and_mirror() {
        let mut r = empty();
        r[0] = samples(serde_json::json!([
            sample("gpu-a1-01", "2"),
            sample("gpu-a1-02", "1"),
            sample("gpu-a1-03", "0")
        ]));
        let m = map_site(&CTX, &r, at());
        let got: Vec<(String, String, String, String)> = m
            .snapshots
            .iter()
            .map(|s| {
                let c = cond(s, ConditionType::ChassisHealth);
                (
                    s.device.as_ref().unwrap().key.clone(),
                    c.reason.clone(),
                    c.message.clone(),
                    mirror(s),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "gpu-a1-01".into(),
                    "RedfishHealthCritical".into(),
                    r#"chassis_health{host="gpu-a1-01"} = 2 (Critical)"#.into(),
                    "Critical".into()
                ),
                (
                    "gpu-a1-02".into(),
                    "RedfishHealthWarning".into(),
                    r#"chassis_health{host="gpu-a1-02"} = 1 (Warning)"#.into(),
                    "Warning".into()
                ),
                (
                    "gpu-a1-03".into(),
                    "RedfishHealthOk".into(),
                    r#"chassis_health{host="gpu-a1-03"} = 0 (Ok)"#.into(),
                    "Ok".into()
                ),
            ]
        );
        let k = m.snapshots[0].device.as_ref().unwrap();
        assert_eq!((k.site.as_str(), k.kind.as_str()), ("s1", "name"));
        assert_eq!(m.snapshots[0].source, "health-status");
    }

    /// The Prometheus peer's aggregated sample: one series per host, keyed
    /// by `Hostname`; its 79 (an XID code) is outside the encoding.
    #[test]
    fn the_aggregated_sample_as_the_gpu_series() {
        let resp: QueryResponse = serde_json::from_str(AGG).unwrap();
        let mut r = empty();
        r[8] = vector(resp).unwrap();
        let ctx = Context {
            host_label: "Hostname",
            ..CTX
        };
        let m = map_site(&ctx, &r, at());
        let got: Vec<(String, String, String)> = m
            .snapshots
            .iter()
            .map(|s| {
                let c = cond(s, ConditionType::GpuHealth);
                (
                    s.device.as_ref().unwrap().key.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                )
            })
            .collect();
        let row = |h: &str, s: &str, r: &str| (h.to_string(), s.to_string(), r.to_string());
        assert_eq!(
            got,
            vec![
                row("gpu01", "True", "NvidiaGpuHealthOk"),
                row("gpu02", "Unknown", "NvidiaGpuHealthUnrecognized"),
                row("gpu03", "True", "NvidiaGpuHealthOk"),
                row("gpu04", "True", "NvidiaGpuHealthOk"),
            ]
        );
        assert_eq!(
            cond(&m.snapshots[1], ConditionType::GpuHealth).message,
            r#"nvidia_gpu_health{Hostname="gpu02"} = 79: not 0 (Ok), 1 (Warning) or 2 (Critical)"#
        );
        assert_eq!(
            m.warnings,
            vec![Warning::UnrecognizedValue {
                metric: "nvidia_gpu_health".into(),
                host: "gpu02".into(),
                raw: "79".into()
            }]
        );
        // No chassis series: the mirror is empty (health_status unknown).
        assert!(m.snapshots.iter().all(|s| mirror(s).is_empty()));
    }

    /// The peer's per-GPU vector: several series per host take the worst;
    /// its values (temperatures) are outside the encoding, so with a valid
    /// series beside them the valid one wins.
    #[test]
    fn several_series_per_host_take_the_worst() {
        let resp: QueryResponse = serde_json::from_str(VECTOR).unwrap();
        let mut peer = vector(resp).unwrap();
        assert_eq!(peer.len(), 2);
        let mut r = empty();
        r[2] = samples(serde_json::json!([
            sample("gpu01", "0"),
            sample("gpu01", "1"),
            sample("gpu01", "0")
        ]));
        peer.extend(samples(serde_json::json!([
            {"metric": {"Hostname": "gpu01", "gpu": "2"}, "value": [1.0, "1"]}
        ])));
        r[8] = peer;
        let ctx = Context {
            host_label: "Hostname",
            ..CTX
        };
        let m = map_site(&ctx, &r, at());
        // `host` is not the label here: the fan series is unlabelled.
        assert!(m.warnings.contains(&Warning::NoHostLabel {
            metric: "redfish_fan_health".into(),
            count: 3
        }));
        assert_eq!(m.snapshots.len(), 1);
        let gpu = cond(&m.snapshots[0], ConditionType::GpuHealth);
        assert_eq!(gpu.reason, "NvidiaGpuHealthDegraded");
        assert_eq!(
            gpu.message,
            r#"nvidia_gpu_health{Hostname="gpu01"} = 1 (Warning)"#
        );
        let mut r = empty();
        r[2] = samples(serde_json::json!([
            sample("gpu01", "0"),
            sample("gpu01", "2"),
            sample("gpu01", "1")
        ]));
        let m = map_site(&CTX, &r, at());
        let fan = cond(&m.snapshots[0], ConditionType::FanHealth);
        assert_eq!(fan.reason, "RedfishHealthCritical");
        assert_eq!(
            fan.message,
            r#"redfish_fan_health{host="gpu01"} = 2 (Critical), worst of 3 series"#
        );
    }

    #[test]
    fn site_selector_joins_every_message() {
        let ctx = Context {
            site_selector: r#"site="lon1""#,
            ..CTX
        };
        let mut r = empty();
        r[0] = samples(serde_json::json!([sample("gpu-a1-01", "0")]));
        let m = map_site(&ctx, &r, at());
        for c in &m.snapshots[0].conditions {
            assert!(
                c.message.contains(r#"{host="gpu-a1-01",site="lon1"}"#),
                "{}",
                c.message
            );
        }
    }

    #[test]
    fn outage_and_vanished() {
        let s = outage(
            &CTX,
            "gpu-a1-01",
            at(),
            "cannot connect to http://mimir/prometheus/api/v1/query",
        );
        assert_eq!(s.conditions.len(), 10);
        for (series, c) in SERIES.iter().zip(&s.conditions) {
            assert_eq!(c.r#type, series.condition.as_str());
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("Unknown", MIMIR_UNREACHABLE)
            );
            assert!(
                c.message
                    .starts_with(&format!("{}{{host=\"gpu-a1-01\"}}: ", series.metric)),
                "{}",
                c.message
            );
            assert!(c.message.contains("cannot connect"));
        }
        assert_eq!(mirror(&s), "", "never critical: the mirror is emptied");
        let v = vanished(&CTX, "gpu-a1-01", at());
        assert!(v.conditions.iter().all(|c| c.status == "Unknown"));
        assert_eq!(
            cond(&v, ConditionType::GpuHealth).reason,
            "NvidiaGpuTelemetryUnavailable"
        );
        assert_eq!(mirror(&v), "");
    }

    #[test]
    fn answers_that_are_not_instant_vectors() {
        let range: QueryResponse = serde_json::from_str(RANGE).unwrap();
        assert!(vector(range).unwrap_err().contains("resultType \"matrix\""));
        let err: QueryResponse = serde_json::from_value(serde_json::json!({
            "status": "error", "errorType": "bad_data", "error": "parse error at char 5"
        }))
        .unwrap();
        let e = vector(err).unwrap_err();
        assert!(e.contains("bad_data") && e.contains("parse error"), "{e}");
        let scalar: QueryResponse = serde_json::from_value(serde_json::json!({
            "status": "success", "data": {"resultType": "scalar", "result": [1.0, "1"]}
        }))
        .unwrap();
        assert!(vector(scalar).is_err());
        let bad_sample: QueryResponse = serde_json::from_value(serde_json::json!({
            "status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": "x"}]}
        }))
        .unwrap();
        assert!(vector(bad_sample).unwrap_err().starts_with("data.result"));
        for body in ["", "{", r#"{"data": {}}"#, "[]"] {
            assert!(
                serde_json::from_str::<QueryResponse>(body).is_err(),
                "{body}"
            );
        }
        // A host with no label value at all is skipped, not keyed "".
        let mut r = empty();
        r[0] = samples(serde_json::json!([sample("", "2"), sample(" ", "2")]));
        let m = map_site(&CTX, &r, at());
        assert!(m.snapshots.is_empty());
        assert_eq!(
            m.warnings,
            vec![Warning::NoHostLabel {
                metric: "chassis_health".into(),
                count: 2
            }]
        );
    }
}
