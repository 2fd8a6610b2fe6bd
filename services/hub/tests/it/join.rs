//! `join` with `adopt`: the gateway's acceptance passed, so a device in
//! `adopting` is adopted in the join's own transaction; a device in any
//! other provision state is left as it is, and without `adopt` nothing is
//! adopted.

use fleet_proto::v1;
use v1::hub_command::Command as C;

use crate::support::*;

fn join(name: &str, key: char, serial: &str, adopt: bool) -> C {
    C::Join(v1::JoinDevice {
        site: "s1".into(),
        name: name.into(),
        hardware_key: key.to_string().repeat(64),
        hardware_key_trusted: true,
        serial: serial.into(),
        gpu_count: 8,
        adopt,
        ..Default::default()
    })
}

fn joined(r: &v1::HubReply) -> v1::Joined {
    match &r.record {
        Some(v1::hub_reply::Record::Joined(j)) => j.clone(),
        other => panic!("expected joined, got {other:?} ({:?})", r.error),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_with_adopt_adopts_an_adopting_device_in_its_own_transaction() {
    let (env, hub) = start().await;

    // A new machine, acceptance passed: created and adopted at once.
    let r = env
        .command("join", 0, join("gpu-a", 'a', "SER-A", true))
        .await;
    let a = joined(&r);
    let dev = a.device.clone().unwrap();
    assert_eq!(dev.provision_state, "adopted", "{r:?}");
    assert_eq!(
        env.device_field(&dev.id, "provision_state").await,
        "adopted"
    );
    // The device's provision-state moves, oldest first, with their causes.
    let moves: Vec<(String, String)> = rows(
        &env,
        "SELECT value, cause FROM device_lifecycle_events WHERE device_id = $1 AND kind = 'provision' ORDER BY id",
        &dev.id,
    )
    .await;
    assert_eq!(
        moves.last().map(|m| m.0.as_str()),
        Some("adopted"),
        "the adoption is in the lifecycle log: {moves:?}"
    );
    assert!(
        moves
            .iter()
            .all(|(_, cause)| cause.starts_with("command:join")),
        "every move is the join's: {moves:?}"
    );

    // Acceptance did not pass: the device stays adopting.
    let r = env
        .command("join", 0, join("gpu-b", 'b', "SER-B", false))
        .await;
    let b = joined(&r).device.unwrap();
    assert_eq!(b.provision_state, "adopting");
    assert_eq!(env.device_field(&b.id, "provision_state").await, "adopting");

    // The same machine again, now accepted: the re-join adopts it.
    let r = env
        .command("join", 0, join("gpu-b", 'b', "SER-B", true))
        .await;
    let again = joined(&r);
    assert!(again.rejoined, "{again:?}");
    let b2 = again.device.unwrap();
    assert_eq!(
        (b2.id.as_str(), b2.provision_state.as_str()),
        (b.id.as_str(), "adopted")
    );

    // A re-join of an adopted device with adopt: nothing to adopt, no error.
    let version = env.device_field(&dev.id, "version").await;
    let r = env
        .command("join", 0, join("gpu-a", 'a', "SER-A", true))
        .await;
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(joined(&r).device.unwrap().provision_state, "adopted");
    assert_ne!(
        env.device_field(&dev.id, "version").await,
        version,
        "the re-join bumped it"
    );

    // A device NetBox imported, claimed with adopt: adopted with the
    // claim (what `fleet dev`'s agents do).
    let imported = |name: &str, serial: &str, provision_state: &str| v1::CreateDevice {
        site: "s1".into(),
        name: name.into(),
        serial: serial.into(),
        provision_state: provision_state.into(),
        ..Default::default()
    };
    let c = env.create_device_with(imported("gpu-c", "SER-C", "")).await;
    assert_eq!(env.device_field(&c, "provision_state").await, "adopting");
    let r = env
        .command("join", 0, join("gpu-c", 'c', "SER-C", true))
        .await;
    let claimed = joined(&r);
    assert!(claimed.claimed, "{claimed:?}");
    assert_eq!(claimed.device.unwrap().id, c);
    assert_eq!(env.device_field(&c, "provision_state").await, "adopted");

    // One in another provision state keeps it: adopt moves only `adopting`.
    let d = env
        .create_device_with(imported("gpu-d", "SER-D", "ready"))
        .await;
    let r = env
        .command("join", 0, join("gpu-d", 'd', "SER-D", true))
        .await;
    assert!(joined(&r).claimed, "{r:?}");
    assert_eq!(env.device_field(&d, "provision_state").await, "ready");

    hub.stop(env).await;
}
