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

/// A trusted join of `name` in site `site` with the hardware key `key`
/// (repeated to 64 hex digits) and `gpus` GPUs, acceptance passed.
fn agent(site: &str, name: &str, key: &str, serial: &str, gpus: i32) -> v1::JoinDevice {
    v1::JoinDevice {
        site: site.into(),
        name: name.into(),
        hardware_key: key.repeat(64 / key.len()),
        hardware_key_trusted: true,
        serial: serial.into(),
        gpu_count: gpus,
        adopt: true,
        ..Default::default()
    }
}

/// Devices NetBox imported (no key) and agents already joined, the same
/// in every environment of the batch tests.
async fn fleet_before_the_joins(env: &TestEnv) {
    // The environment has sites s1 and s2.
    for (name, serial, state) in [
        ("gpu-c", "SER-C", ""),
        ("gpu-d", "SER-D", "ready"),
        ("gpu-m", "SER-M", ""),
        ("gpu-t", "SER-T", ""),
    ] {
        env.create_device_with(v1::CreateDevice {
            site: "s1".into(),
            name: name.into(),
            serial: serial.into(),
            provision_state: state.into(),
            ..Default::default()
        })
        .await;
    }
    for j in [
        agent("s1", "gpu-r", "a1", "SER-R", 8),
        agent("s2", "gpu-s", "b2", "SER-S", 8),
    ] {
        let r = env.command("join", 0, C::Join(j)).await;
        assert!(r.error.is_none(), "{r:?}");
    }
}

/// The joins of the batch tests, in order, each with what a join does.
fn the_joins() -> Vec<v1::JoinDevice> {
    let untrusted = v1::JoinDevice {
        hardware_key_trusted: false,
        ..agent("s1", "gpu-u", "c3", "SER-U", 8)
    };
    vec![
        agent("s1", "gpu-c", "d4", "SER-C", 8), // claims the imported gpu-c, adopts it
        agent("s1", "gpu-d", "e5", "SER-D", 8), // claims gpu-d, which stays ready
        agent("s1", "gpu-r", "a1", "SER-R", 4), // re-joins gpu-r: generation 2, 4 GPUs
        agent("s1", "gpu-n", "f6", "SER-N", 8), // a new machine: created
        agent("s1", "gpu-x", "zz", "SER-X", 8), // not a hex key: refused
        agent("s1", "gpu-c", "d4", "SER-C", 2), // gpu-c's key again: re-joins it
        agent("s1", "gpu-t", "07", "SER-T", 8), // claims gpu-t
        agent("s1", "gpu-t", "18", "SER-T", 8), // another key, gpu-t taken: refused (CONFLICT)
        agent("s1", "gpu-m", "29", "SER-Q", 8), // gpu-m's serial differs: refused
        agent("s1", "gpu-s", "b2", "SER-S", 8), // gpu-s's key is of site s2: refused
        untrusted,                              // an untrusted key: created
    ]
}

/// What a join's answer says, without the ids a creation draws.
fn outcome(r: &Result<v1::Joined, v1::HubError>) -> String {
    match r {
        Ok(j) => {
            let d = j.device.clone().unwrap_or_default();
            format!(
                "{} rejoined={} claimed={} trusted={} {} gen={} v={}",
                d.name,
                j.rejoined,
                j.claimed,
                j.hardware_key_trusted,
                d.provision_state,
                d.identity_generation,
                d.version
            )
        }
        Err(e) => format!("{:?}", fleet_proto::error_code_of(e.code)),
    }
}

/// Every device and lifecycle row, by device name (ids differ between
/// environments), and the StatusChanged events written.
async fn stored(env: &TestEnv) -> (Vec<String>, Vec<String>, i64) {
    let devices: Vec<(String,)> = sqlx::query_as(
        "SELECT concat_ws(' ', site_id, name, provision_state, identity_generation, \
                gpu_count, hardware_key, hardware_key_trusted, version) \
         FROM devices ORDER BY site_id, name, id",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let lifecycle: Vec<(String,)> = sqlx::query_as(
        "SELECT concat_ws(' ', d.name, e.kind, e.value, e.cause) \
         FROM device_lifecycle_events e JOIN devices d ON d.id = e.device_id \
         ORDER BY d.name, e.id",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM device_lifecycle_events")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    (
        devices.into_iter().map(|r| r.0).collect(),
        lifecycle.into_iter().map(|r| r.0).collect(),
        events,
    )
}

/// One of the [`stored`] devices starts with `prefix`.
fn assert_stored(devices: &[String], prefix: &str) {
    assert!(
        devices.iter().any(|d| d.starts_with(prefix)),
        "no stored device starts with {prefix:?}: {devices:#?}"
    );
}

fn results(r: &v1::HubReply) -> Vec<Result<v1::Joined, v1::HubError>> {
    match &r.record {
        Some(v1::hub_reply::Record::Joins(j)) => j
            .results
            .iter()
            .map(|x| match (&x.joined, &x.error) {
                (_, Some(e)) => Err(e.clone()),
                (Some(j), None) => Ok(j.clone()),
                (None, None) => panic!("a result with neither: {x:?}"),
            })
            .collect(),
        other => panic!("expected joins, got {other:?} ({:?})", r.error),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_devices_answers_and_stores_what_the_joins_one_by_one_do() {
    // One by one, through `join`.
    let (env, hub) = start().await;
    fleet_before_the_joins(&env).await;
    let mut single = vec![];
    for j in the_joins() {
        let r = env.command("join", 0, C::Join(j)).await;
        single.push(match (r.error, r.record) {
            (Some(e), _) => Err(e),
            (None, Some(v1::hub_reply::Record::Joined(j))) => Ok(j),
            other => panic!("a join answered {other:?}"),
        });
    }
    let single_rows = stored(&env).await;
    hub.stop(env).await;

    // All at once, through `join_devices`.
    let (env, hub) = start().await;
    fleet_before_the_joins(&env).await;
    let r = env
        .command(
            "join_devices",
            0,
            C::JoinDevices(v1::JoinDevices { joins: the_joins() }),
        )
        .await;
    assert!(r.error.is_none(), "{r:?}");
    let batched = results(&r);
    let batched_rows = stored(&env).await;

    let single: Vec<String> = single.iter().map(outcome).collect();
    let batched: Vec<String> = batched.iter().map(outcome).collect();
    assert_eq!(batched, single);
    // What each join is expected to do (the comments of `the_joins`).
    let expect = [
        "gpu-c rejoined=false claimed=true trusted=true adopted",
        "gpu-d rejoined=false claimed=true trusted=true ready",
        "gpu-r rejoined=true claimed=false trusted=true adopted gen=2",
        "gpu-n rejoined=false claimed=false trusted=true adopted gen=1",
        "InvalidArgument",
        "gpu-c rejoined=true claimed=false trusted=true adopted gen=2",
        "gpu-t rejoined=false claimed=true trusted=true adopted",
        "Conflict",
        "Conflict",
        "Conflict",
        "gpu-u rejoined=false claimed=false trusted=false adopted gen=1",
    ];
    for (got, want) in batched.iter().zip(expect) {
        assert!(got.starts_with(want), "{got} is not {want}: {batched:#?}");
    }
    assert_eq!(batched_rows, single_rows);
    hub.stop(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_fails_as_a_whole_is_joined_one_by_one() {
    let (env, hub) = start().await;
    fleet_before_the_joins(&env).await;
    // Any write of 13 GPUs fails: the batch's claim statement does, and
    // with it the batch's transaction.
    sqlx::query(
        "CREATE FUNCTION refuse_13() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'no 13'; END $$",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse_13 BEFORE UPDATE ON devices FOR EACH ROW \
         WHEN (NEW.gpu_count = 13) EXECUTE FUNCTION refuse_13()",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let joins = vec![
        agent("s1", "gpu-c", "d4", "SER-C", 8),
        agent("s1", "gpu-d", "e5", "SER-D", 13),
        agent("s1", "gpu-r", "a1", "SER-R", 4),
    ];
    let r = env
        .command("join_devices", 0, C::JoinDevices(v1::JoinDevices { joins }))
        .await;
    assert!(r.error.is_none(), "{r:?}");
    let got: Vec<String> = results(&r).iter().map(outcome).collect();
    assert!(
        got[0].starts_with("gpu-c rejoined=false claimed=true"),
        "{got:?}"
    );
    assert!(got[1].starts_with("Unavailable"), "{got:?}");
    assert!(got[2].starts_with("gpu-r rejoined=true"), "{got:?}");
    // The refused claim changed nothing; the others are stored.
    let (devices, _, _) = stored(&env).await;
    assert_stored(&devices, "s1 gpu-d ready 1 ");
    assert_stored(&devices, "s1 gpu-r adopted 2 4 ");
    hub.stop(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_devices_refuses_an_empty_or_oversized_batch_and_changes_nothing() {
    let (env, hub) = start().await;
    fleet_before_the_joins(&env).await;
    let before = stored(&env).await;
    for n in [0, 1001] {
        let joins = (0..n)
            .map(|i| agent("s1", &format!("gpu-{i}"), "ab", "SER", 8))
            .collect();
        let r = env
            .command("join_devices", 0, C::JoinDevices(v1::JoinDevices { joins }))
            .await;
        refusal(r, fleet_proto::ErrorCode::InvalidArgument);
    }
    assert_eq!(stored(&env).await, before);
    hub.stop(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_whose_device_is_held_waits_alone() {
    let (env, hub) = start().await;
    fleet_before_the_joins(&env).await;
    let held: String = scalar(&env, "SELECT id FROM devices WHERE name = $1", "gpu-d").await;
    let holder = hold(&env, &held).await;
    let joins = vec![
        agent("s1", "gpu-c", "d4", "SER-C", 8),
        agent("s1", "gpu-d", "e5", "SER-D", 8),
        agent("s1", "gpu-r", "a1", "SER-R", 4),
    ];
    let asking = env.command("join_devices", 0, C::JoinDevices(v1::JoinDevices { joins }));
    let answered = std::sync::atomic::AtomicBool::new(false);
    let asked = async {
        let r = asking.await;
        answered.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    };
    let meanwhile = async {
        // The batch's other two are claimed and re-joined while gpu-d is held.
        let devices = eventually("the batch's free devices joined", || async {
            let (devices, _, _) = stored(&env).await;
            (devices
                .iter()
                .any(|d| d.starts_with("s1 gpu-c adopted 1 8 d4d4"))
                && devices
                    .iter()
                    .any(|d| d.starts_with("s1 gpu-r adopted 2 4 ")))
            .then_some(devices)
        })
        .await;
        let d = devices.iter().find(|d| d.starts_with("s1 gpu-d ")).unwrap();
        assert!(
            d.starts_with("s1 gpu-d ready 1 ") && !d.contains("e5e5"),
            "the held device is untouched: {d}"
        );
        assert!(
            !answered.load(std::sync::atomic::Ordering::SeqCst),
            "the held join is still waiting"
        );
        holder.commit().await.unwrap();
    };
    let (r, ()) = tokio::join!(asked, meanwhile);
    assert!(r.error.is_none(), "{r:?}");
    let got: Vec<String> = results(&r).iter().map(outcome).collect();
    assert!(
        got[0].starts_with("gpu-c rejoined=false claimed=true"),
        "{got:?}"
    );
    assert!(
        got[1].starts_with("gpu-d rejoined=false claimed=true"),
        "{got:?}"
    );
    assert!(got[2].starts_with("gpu-r rejoined=true"), "{got:?}");
    let (devices, _, _) = stored(&env).await;
    assert_stored(&devices, "s1 gpu-d ready 1 8 e5e5");
    hub.stop(env).await;
}
