//! Issue 18, terminal hygiene: an ordinary error is one line with its
//! causes and exit status 1, never a backtrace, and names what to run.

use std::process::Command;

#[test]
fn a_missing_database_says_fleet_migrate_in_one_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .arg("hub")
        .env("FLEET__DATABASE__URL", "postgres://postgres@127.0.0.1:5432/fleet_no_such_db")
        .env("RUST_BACKTRACE", "1")
        .env("FLEET__HUB__LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("fleet migrate"), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
