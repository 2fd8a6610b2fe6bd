//! The standard `process_*` metrics (read from /proc at each scrape) and
//! `fleet_build_info`, served by every service's `/metrics` beside its own.

use std::sync::OnceLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

/// Linux clock ticks per second and page size (the values every x86-64
/// and arm64 Linux uses).
const TICKS: f64 = 100.0;
const PAGE: u64 = 4096;

/// What /proc says of this process.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub threads: u64,
    pub open_fds: u64,
    pub start_time_seconds: f64,
}

/// Parses `/proc/self/stat` (fields after the command name) and the boot
/// time; pure, for the tests.
pub fn parse_stat(stat: &str, boot_time: u64) -> Option<ProcessStats> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): utime is field 14, stime 15, threads 20,
    // starttime 22, vsize 23, rss 24.
    let n = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok());
    Some(ProcessStats {
        cpu_seconds: (n(14)? + n(15)?) as f64 / TICKS,
        threads: n(20)?,
        start_time_seconds: boot_time as f64 + n(22)? as f64 / TICKS,
        virtual_bytes: n(23)?,
        resident_bytes: n(24)? * PAGE,
        open_fds: 0,
    })
}

fn read() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse().ok()))?;
    let mut s = parse_stat(&stat, boot)?;
    s.open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    Some(s)
}

#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = read() else { return Ok(()) };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_bytes as i64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes as i64,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds as i64,
            ),
            ("process_threads", "Number of OS threads", s.threads as i64),
        ] {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        let start = ConstGauge::new(s.start_time_seconds);
        start.encode(encoder.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            None,
            start.metric_type(),
        )?)?;
        Ok(())
    }
}

/// The unprefixed registry of `process_*` and `fleet_build_info`.
pub fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| {
        let mut r = Registry::default();
        r.register_collector(Box::new(ProcessCollector));
        let info: Family<Vec<(String, String)>, Gauge> = Family::default();
        info.get_or_create(&vec![(
            "version".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        )])
        .set(1);
        r.register(
            "fleet_build_info",
            "The fleet build this process runs",
            info,
        );
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_line_is_read_by_field() {
        let stat = "4242 (fleet hub) S 1 4242 4242 0 -1 4194560 5000 0 0 0 250 50 0 0 20 0 7 0 1000 123456789 3000 18446744073709551615";
        let s = parse_stat(stat, 1_700_000_000).unwrap();
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.threads, 7);
        assert_eq!(s.start_time_seconds, 1_700_000_010.0);
        assert_eq!(s.virtual_bytes, 123_456_789);
        assert_eq!(s.resident_bytes, 3000 * 4096);
        assert!(parse_stat("garbage", 0).is_none());
    }

    #[test]
    fn this_process_is_described() {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry()).unwrap();
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
            "fleet_build_info{version=",
        ] {
            assert!(out.contains(name), "{name} missing:\n{out}");
        }
    }
}
