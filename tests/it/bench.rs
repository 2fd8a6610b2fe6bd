//! The benchmarks run (`fleet bench hub|placer|api|workflow`) at a toy size, so a
//! change that breaks one (a renamed configuration key, a schema it seeds)
//! fails here instead of on the next person who measures. No figure is
//! asserted: performance is measured by running them in full
//! (docs/benchmarks.md), never by timed assertions in tests.

use std::process::Command;

use crate::support::{admin_url, nats_url};

fn bench(args: &[&str], expect: &str) {
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
}

#[test]
fn the_hub_benchmark_runs() {
    bench(
        &[
            "hub",
            "--devices",
            "300",
            "--latency-samples",
            "30",
            "--naive-conditions",
            "60",
        ],
        "| freshness-only snapshots/s: whole phase; steady |",
    );
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
