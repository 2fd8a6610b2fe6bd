//! Issue 18, terminal hygiene: an ordinary error is one line with its
//! causes and exit status 1, never a backtrace, and names what to run.

use std::process::Command;

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
    use crate::allocations::cli;
    use crate::api::{start_api, token};
    use crate::support::TestEnv;
    use fleet_api::Scope;

    let env = TestEnv::new().await;
    let (_hub, hub_trigger, hub_task) = crate::support::start_hub(&env).await;
    // A standalone-Ironic site: the cordon is the hub's hold alone.
    sqlx::query("UPDATE sites SET placement_enabled = false WHERE id = 's1'")
        .execute(&env.pool)
        .await
        .unwrap();
    let (_w, w_trigger, w_task) = crate::support::start_workflow(&env, |_| {}).await;
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
    use crate::allocations::cli;
    use crate::api::{start_api, token};
    use crate::support::TestEnv;
    use fleet_api::Scope;

    let env = TestEnv::new().await;
    let (_hub, hub_trigger, hub_task) = crate::support::start_hub(&env).await;
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
    hub_trigger.trigger();
    hub_task.await.unwrap();
    env.cleanup().await;
}
