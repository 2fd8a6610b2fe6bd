//! Issue 14, item 4: no credential is printed, by `fleet config` or by a
//! connect error, whatever way it was given.

use std::process::{Command, Stdio};

use super::shipped::*;

fn fleet(args: &[&str], env: &[(&str, String)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet"));
    cmd.args(args)
        .env_remove("FLEET_CONFIG")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run fleet");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn fleet_config_prints_no_credential() {
    let (ok, out) = fleet(
        &["config"],
        &[
            ("FLEET__NATS__USER", "hub".into()),
            ("FLEET__NATS__PASSWORD", "s3cret-nats".into()),
            ("FLEET__NATS__TOKEN", String::new()),
            (
                "FLEET__DATABASE__URL",
                "postgres://fleet:s3cret-db@127.0.0.1:5432/fleet".into(),
            ),
            (
                "FLEET__CONNECTORS__SLURM__SITES__S1__TOKEN__VALUE",
                "s3cret-jwt".into(),
            ),
        ],
    );
    assert!(ok, "{out}");
    for secret in ["s3cret-nats", "s3cret-db", "s3cret-jwt"] {
        assert!(!out.contains(secret), "{secret} printed:\n{out}");
    }
    assert!(out.contains("<redacted>"), "{out}");
    assert!(out.contains("\"user\": \"hub\""), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_name_the_user_and_never_the_password() {
    let nats = ShippedNats::start().await;
    let env = nats.env().await;
    let base = |url: String| {
        vec![
            ("FLEET__DATABASE__URL", env.common.database.url.clone()),
            ("FLEET__NATS__URL", url),
            ("FLEET__HUB__LISTEN", "127.0.0.1:0".to_string()),
        ]
    };
    // A wrong password: refused, and the error says who, not with what.
    let mut vars = base(nats.url());
    vars.push(("FLEET__NATS__USER", "hub".into()));
    vars.push(("FLEET__NATS__PASSWORD", "s3cret-wrong".into()));
    let (ok, out) = tokio::task::spawn_blocking(move || fleet(&["hub"], &vars))
        .await
        .unwrap();
    assert!(!ok, "the hub started with a wrong password:\n{out}");
    assert!(!out.contains("s3cret-wrong"), "{out}");
    assert!(out.contains("as user hub"), "{out}");
    assert!(out.to_lowercase().contains("authorization"), "{out}");

    // Credentials in the URL (ignored by NATS clients): refused at start
    // with the key's name, the password not echoed.
    let vars = base(format!("nats://hub:s3cret-url@127.0.0.1:{}", nats.port));
    let (ok, out) = tokio::task::spawn_blocking(move || fleet(&["hub"], &vars))
        .await
        .unwrap();
    assert!(!ok, "{out}");
    assert!(!out.contains("s3cret-url"), "{out}");
    assert!(out.contains("nats.url"), "{out}");
    env.cleanup().await;
}
