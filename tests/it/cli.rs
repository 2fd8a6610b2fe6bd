//! The `fleet` binary's commands. Issue 18, terminal hygiene: an ordinary
//! error is one line with its causes and exit status 1, never a backtrace,
//! and names what to run. The operator CLI against the API (devices,
//! impairments, inventory, allocations and pools) and `fleet token create`.

use std::net::SocketAddr;
use std::process::Command;

use serde_json::{json, Value};

use crate::support::*;

#[test]
fn a_missing_database_says_fleet_migrate_in_one_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .arg("hub")
        .env(
            "FLEET__DATABASE__URL",
            "postgres://postgres@127.0.0.1:5432/fleet_no_such_db",
        )
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

/// `fleet probe` (the containers' healthcheck): 0 on 2xx, 1 otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_says_whether_an_endpoint_is_ready() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 512];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).to_string();
            let status = if req.starts_with("GET /readyz ") {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            let _ = s
                .write_all(format!("HTTP/1.0 {status}\r\n\r\n").as_bytes())
                .await;
        }
    });
    let run = |target: String| {
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_fleet"))
                .args(["probe", &target])
                .output()
                .unwrap()
                .status
                .code()
        })
    };
    assert_eq!(run(format!("{addr}/readyz")).await.unwrap(), Some(0));
    assert_eq!(run(format!("{addr}/other")).await.unwrap(), Some(1));
    assert_eq!(run("127.0.0.1:1/readyz".into()).await.unwrap(), Some(1));
}

/// Under `-o json` an error is JSON too.
#[test]
fn errors_are_json_under_output_json() {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .args(["devices", "list", "-o", "json"])
        .env("FLEET_API_URL", "http://127.0.0.1:1")
        .env("FLEET_TOKEN", "x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stderr)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot reach the API"),
        "{v}"
    );
}

/// `fleet devices list|show|cordon` and `fleet impairments create|list`
/// against the API, reading the API's own types: tables and JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_and_impairments_through_the_cli() {
    let env = TestEnv::new().await;
    let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
    // A standalone-Ironic site: the cordon is the hub's hold alone.
    sqlx::query("UPDATE sites SET placement_enabled = false WHERE id = 's1'")
        .execute(&env.pool)
        .await
        .unwrap();
    let (_w, w_trigger, w_task) = start_workflow(&env, |_| {}).await;
    let id = env.create_device("s1", "gpu-cli-01").await;
    let (addr, api_trigger) = start_api(&env.common, &Default::default()).await;
    let t = token(
        &env,
        &[
            Scope::DeviceRead,
            Scope::DeviceWrite,
            Scope::OperationsWrite,
        ],
    )
    .await;

    let (ok, out, err) = cli(addr, &t, &["devices", "list"]).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("ID"), "{out}");
    assert!(out.contains(&id) && out.contains("gpu-cli-01"), "{out}");

    let (ok, out, err) = cli(
        addr,
        &t,
        &["devices", "cordon", &id, "--reason", "cli test"],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("cordoned true"), "{out}");

    let (ok, out, err) = cli(addr, &t, &["devices", "show", &id]).await;
    assert!(ok, "{err}");
    assert!(out.contains("cordon_reason        cli test"), "{out}");
    assert!(out.contains("recent lifecycle events:"), "{out}");
    assert!(out.contains("cordoned"), "{out}");
    let (ok, out, err) = cli(addr, &t, &["devices", "show", &id, "-o", "json"]).await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["device"]["id"], id.as_str());
    assert_eq!(v["device"]["cordoned"], true);
    assert!(v["lifecycle_events"]
        .as_array()
        .is_some_and(|e| !e.is_empty()));

    let (ok, out, err) = cli(
        addr,
        &t,
        &[
            "impairments",
            "create",
            &id,
            "--reason",
            "cli test",
            "--watch",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("accepted: 1 device(s), cli test"), "{out}");
    assert!(
        out.contains("cordoned: 1 device(s), cli test"),
        "--watch follows it: {out}"
    );
    assert!(out.contains("DEVICE") && out.contains(&id), "{out}");
    let (ok, out, err) = cli(addr, &t, &["impairments", "list"]).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("ID") && out.contains("cli test"), "{out}");

    api_trigger.trigger();
    w_trigger.trigger();
    let _ = w_task.await;
    hub_trigger.trigger();
    let _ = hub_task.await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sites_tenants_and_pools_through_the_cli() {
    let env = TestEnv::new().await;
    let (_hub, hub_trigger, hub_task) = start_hub(&env).await;
    let (addr, api_trigger) = start_api(&env.common, &Default::default()).await;
    let t = token(&env, &[Scope::Admin, Scope::DeviceRead]).await;

    for args in [
        &[
            "sites",
            "create",
            "dc7",
            "--name",
            "site seven",
            "--inventory-only",
        ][..],
        &["tenants", "create", "t7", "--name", "tenant seven"],
        &[
            "pools",
            "create",
            "p7",
            "--site",
            "dc7",
            "--kind",
            "metal-host",
            "--owner",
            "t7",
            "--gpus",
            "8",
            "--gpu-model",
            "H100",
        ],
        &["pools", "update", "p7", "--gpus", "4"],
    ] {
        let (ok, out, err) = cli(addr, &t, args).await;
        assert!(ok, "{args:?}: {err}");
        assert!(out.starts_with("ID"), "{out}");
    }
    let (ok, out, err) = cli(addr, &t, &["sites", "list"]).await;
    assert!(ok, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("dc7"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("site seven") && row.contains("true"), "{row}");
    let (ok, out, err) = cli(addr, &t, &["pools", "list", "--site", "dc7", "-o", "json"]).await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["hardware_profile"]["gpu_count"], 4);
    assert_eq!(v[0]["owner_tenant_id"], "t7");

    // A refusal names the API's code and changes nothing.
    let (ok, _, err) = cli(
        addr,
        &t,
        &["pools", "create", "p8", "--site", "dc7", "--kind", "gpu"],
    )
    .await;
    assert!(!ok && err.contains("INVALID_ARGUMENT"), "{err}");
    let (ok, _, err) = cli(addr, &t, &["tenants", "delete", "t7"]).await;
    assert!(!ok && err.contains("INVALID_STATE"), "{err}");
    for args in [
        &["pools", "delete", "p7"][..],
        &["tenants", "delete", "t7"],
        &["sites", "delete", "dc7"],
    ] {
        let (ok, _, err) = cli(addr, &t, args).await;
        assert!(ok, "{args:?}: {err}");
    }
    let (ok, _, err) = cli(addr, &t, &["sites", "show", "dc7"]).await;
    assert!(!ok && err.contains("NOT_FOUND"), "{err}");

    api_trigger.trigger();
    stop(hub_trigger, hub_task).await;
    env.cleanup().await;
}

/// A command line's words (none of them with a space inside).
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

fn fleet_cli(addr: SocketAddr, t: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fleet"))
        .args(args)
        .env("FLEET_API_URL", format!("http://{addr}"))
        .env("FLEET_TOKEN", t)
        .env("FLEET__LOG__FILTER", "warn")
        .output()
        .expect("fleet runs")
}

pub async fn cli(addr: SocketAddr, t: &str, args: &[&str]) -> (bool, String, String) {
    let (t, args): (String, Vec<String>) =
        (t.to_string(), args.iter().map(|a| a.to_string()).collect());
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fleet_cli(addr, &t, &args)
    })
    .await
    .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// `fleet allocations create|show|list|release` and `fleet pools
/// capacity` against the API, table and JSON, and their errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocations_cli_commands() {
    let env = TestEnv::new().await;
    seed_pool(&env, "p1", 2, 8).await;
    let (_placer, placer_trigger, placer_task) = start_placer(&env).await;
    let (addr, api_trigger) = start_api(&env.common, &api_config()).await;
    let t = token(&env, &[Scope::DeviceRead, Scope::OperationsWrite]).await;
    let read = token(&env, &[Scope::DeviceRead]).await;

    let (ok, out, err) = cli(
        addr,
        &t,
        &words("allocations create --pool p1 --tenant t1 --gpus 3 -o json"),
    )
    .await;
    assert!(ok, "{err}");
    let a: Value = serde_json::from_str(&out).unwrap();
    let id = a["id"].as_str().unwrap().to_string();
    assert_eq!(a["atoms"].as_array().unwrap().len(), 3);

    let (ok, out, err) = cli(addr, &t, &["pools", "capacity", "p1"]).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("pool p1 (2 devices)\n"), "{out}");
    assert!(out.contains("schedulable_available  13\n"), "{out}");
    assert!(out.contains("schedulable_allocated  3\n"), "{out}");
    assert!(out.contains("total                  16\n"), "{out}");
    let (ok, out, _) = cli(addr, &t, &words("pools capacity p1 -o json")).await;
    assert!(ok);
    let c: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (c["schedulable_allocated"].as_i64(), c["total"].as_i64()),
        (Some(3), Some(16))
    );

    let (ok, out, err) = cli(addr, &t, &["allocations", "show", &id]).await;
    assert!(ok, "{err}");
    assert!(out.contains(&format!("id               {id}\n")), "{out}");
    assert!(out.contains("status           active\n"), "{out}");
    assert!(out.contains("DEVICE"), "{out}");

    let (ok, out, err) = cli(addr, &t, &words("allocations list --tenant t1")).await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("ID"), "{out}");
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[1].starts_with(&id) && lines[1].contains("active"),
        "{out}"
    );
    assert!(err.contains("1 allocations"), "{err}");

    // Errors name the code, the HTTP status and what to do.
    let (ok, _, err) = cli(
        addr,
        &t,
        &words("allocations create --pool p1 --tenant t1 --gpus 14"),
    )
    .await;
    assert!(!ok);
    assert!(err.contains("INSUFFICIENT_CAPACITY (HTTP 409)"), "{err}");
    assert!(err.contains("fleet pools capacity"), "{err}");
    let (ok, _, err) = cli(addr, &t, &["pools", "capacity", "nope"]).await;
    assert!(!ok);
    assert!(err.contains("NOT_FOUND (HTTP 404)"), "{err}");
    let (ok, _, err) = cli(addr, &read, &["allocations", "release", &id]).await;
    assert!(!ok);
    assert!(err.contains("FORBIDDEN (HTTP 403)"), "{err}");
    let (ok, _, err) = cli(addr, &t, &words("allocations list --status gone")).await;
    assert!(!ok);
    assert!(err.contains("INVALID_ARGUMENT (HTTP 400)"), "{err}");

    let (ok, out, err) = cli(
        addr,
        &t,
        &words(&format!("allocations release {id} --tenant t1 -o json")),
    )
    .await;
    assert!(ok, "{err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["status"], "released");
    let (ok, out, _) = cli(addr, &t, &words("allocations list --status active -o json")).await;
    assert!(ok);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), json!([]));

    // The placer gone: UNAVAILABLE with the hint.
    stop(placer_trigger, placer_task).await;
    let (ok, _, err) = cli(addr, &t, &["pools", "capacity", "p1"]).await;
    assert!(!ok);
    assert!(
        err.contains("UNAVAILABLE (HTTP 503)") && err.contains("placer"),
        "{err}"
    );

    api_trigger.trigger();
    env.cleanup().await;
}

/// `fleet token create` prints a token once and stores only its hash;
/// an unknown scope is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_token_command_creates_a_hashed_token() {
    let env = TestEnv::new().await;
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_fleet"))
            .args(args)
            .env("FLEET__DATABASE__URL", &env.common.database.url)
            .env("FLEET__LOG__FILTER", "warn")
            .output()
            .expect("fleet runs")
    };
    let out = run(&[
        "token",
        "create",
        "--scopes",
        "device:read,operations:write",
        "--description",
        "ops",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let (scopes, description): (Vec<String>, String) =
        sqlx::query_as("SELECT scopes, description FROM api_tokens WHERE token_sha256 = $1")
            .bind(fleet_api::auth::hash_token(&token))
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(scopes, vec!["device:read", "operations:write"]);
    assert_eq!(description, "ops");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM api_tokens WHERE token_sha256 = $1")
        .bind(&token)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(stored, 0, "the token itself is never stored");
    let (addr, trigger) = start_api(&env.common, &api_config()).await;
    assert_eq!(get(addr, "/api/v1/devices/", &token).await.status, 200);
    assert_eq!(
        send(
            addr,
            "POST",
            "/api/v1/devices/x/cordon",
            &token,
            json!({"version": 1, "reason": "r"})
        )
        .await
        .status,
        403
    );
    trigger.trigger();
    let bad = run(&["token", "create", "--scopes", "root"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown scope"));
    env.cleanup().await;
}
