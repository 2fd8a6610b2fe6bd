//! The benchmarks run (`fleet bench hub|placer|api|workflow`) at a toy size, so a
//! change that breaks one (a renamed configuration key, a schema it seeds)
//! fails here instead of on the next person who measures. No figure is
//! asserted: performance is measured by running them in full
//! (docs/benchmarks.md), never by timed assertions in tests.

use std::process::Command;

use crate::support::{admin_url, nats_url};

fn bench(args: &[&str], expect: &str) -> String {
    let base = admin_url();
    let base = base.rsplit_once('/').map_or(base.as_str(), |(b, _)| b);
    let out = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .arg("bench")
        .args(args)
        .env("FLEET__DATABASE__URL", format!("{base}/fleet"))
        .env("FLEET__NATS__URL", nats_url())
        .env("FLEET__LOG__FILTER", "warn")
        .output()
        .expect("fleet bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "fleet bench {args:?} failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(expect),
        "fleet bench {args:?} reports {expect:?}:\n{stdout}"
    );
    stdout.into_owned()
}

#[test]
fn the_hub_benchmark_runs() {
    let trace = std::env::temp_dir().join(format!("fleet-bench-trace-{}.csv", std::process::id()));
    let report = bench(
        &[
            "hub",
            "--devices",
            "300",
            "--latency-samples",
            "30",
            "--naive-conditions",
            "60",
            "--latency-trace",
            trace.to_str().expect("a UTF-8 temp path"),
        ],
        "| publish -> StatusChanged, the changing mix at half its rate:",
    );
    // The floor under the initial load: the spec's rows written alone, a
    // rate and its share of the raw upsert.
    let floor = report
        .lines()
        .find(|l| l.starts_with("| a first snapshot's rows alone"))
        .unwrap_or_else(|| panic!("the floor's row is reported:\n{report}"));
    assert!(
        floor.contains(" of the raw upsert) |"),
        "the floor's share of the raw upsert:\n{floor}"
    );
    // One line a flip of each latency phase, in publish order.
    let csv = std::fs::read_to_string(&trace).expect("the latency trace is written");
    let _ = std::fs::remove_file(&trace);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "phase,sent_ms,device_id,latency_ms");
    for phase in ["mixed", "flips"] {
        let sent: Vec<f64> = lines[1..]
            .iter()
            .filter(|l| l.starts_with(&format!("{phase},")))
            .map(|l| {
                l.split(',')
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .expect("sent_ms")
            })
            .collect();
        assert_eq!(sent.len(), 30, "{phase} flips in the trace:\n{csv}");
        assert!(
            sent.windows(2).all(|w| w[0] <= w[1]),
            "{phase} in publish order:\n{csv}"
        );
    }
}

#[test]
fn the_placer_benchmark_runs() {
    bench(
        &[
            "placer",
            "--devices",
            "50",
            "--requesters",
            "2",
            "--seconds",
            "2",
        ],
        "double",
    );
}

#[test]
fn the_api_benchmark_runs() {
    bench(
        &[
            "api",
            "--devices",
            "500",
            "--concurrency",
            "2",
            "--seconds",
            "1",
        ],
        "p99",
    );
}

/// The workflow benchmark runs end to end on a small fleet: every event
/// cordoned and cleared, or it exits non-zero (it checks the simulated
/// Placement and the hub's rows itself).
#[test]
fn the_workflow_benchmark_runs() {
    bench(
        &["workflow", "--devices", "120", "--per-event", "50"],
        "devices/s",
    );
}
