//! Issue 15, item 3: ownership enforced by PostgreSQL, not assumed. Each
//! service works as its own role (`migrations/0007_roles.sql`); only the
//! hub's role writes devices and their conditions, lifecycle events are
//! append-only even for the hub, credentials are read by their owner only,
//! and the placer locks device rows only through `lock_devices`.

use fleet_store::Role;
use sqlx::PgPool;

use crate::support::start_hub;
use crate::support::*;

/// The SQLSTATE `sql` fails with as `role`, `None` when it succeeds. Every
/// statement runs in a transaction that is rolled back: nothing changes.
async fn try_as(pool: &PgPool, sql: &str) -> Option<String> {
    let mut tx = pool.begin().await.expect("begin");
    let outcome = sqlx::query(sql).execute(&mut *tx).await;
    let _ = tx.rollback().await;
    match outcome {
        Ok(_) => None,
        Err(sqlx::Error::Database(e)) => e.code().map(|c| c.to_string()),
        Err(e) => panic!("{sql}: {e}"),
    }
}

const INSUFFICIENT_PRIVILEGE: &str = "42501";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_hubs_role_writes_devices_and_conditions() {
    let env = TestEnv::new().await;
    let (_hub, trigger, task) = start_hub(&env).await;
    let id = env.create_device("s1", "gpu-roles-01").await;
    let update_device = format!("UPDATE devices SET cordoned = NOT cordoned WHERE id = '{id}'");
    let insert_device =
        "INSERT INTO devices (id, site_id, name) VALUES ('intruder', 's1', 'intruder')";
    let write_condition = format!(
        "INSERT INTO device_conditions (device_id, type, status, source, condition_of, durable, \
         observed_at, received_at, last_transition_at) \
         VALUES ('{id}', 'Intruded', 'True', 'test', 'none', false, now(), now(), now())"
    );
    let freshness = format!("DELETE FROM device_source_freshness WHERE device_id = '{id}'");
    for role in Role::ALL {
        let pool = fleet_store::connect_as(&env.common.database.url, 1, Some(role))
            .await
            .unwrap_or_else(|e| panic!("connect as {}: {e}", role.name()));
        let who: String = sqlx::query_scalar("SELECT current_user::text")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(who, role.name(), "the session works as the role");
        // Every role reads devices.
        let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM devices")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(seen, 1, "{} reads devices", role.name());
        let expected = (role != Role::Hub).then(|| INSUFFICIENT_PRIVILEGE.to_string());
        for sql in [
            update_device.as_str(),
            insert_device,
            write_condition.as_str(),
        ] {
            assert_eq!(
                try_as(&pool, sql).await,
                expected,
                "{} runs {sql}",
                role.name()
            );
        }
        // Nobody deletes freshness or rewrites the append-only lifecycle.
        for sql in [
            freshness.as_str(),
            "UPDATE device_lifecycle_events SET value = 'rewritten'",
            "DELETE FROM device_lifecycle_events",
        ] {
            assert_eq!(
                try_as(&pool, sql).await.as_deref(),
                Some(INSUFFICIENT_PRIVILEGE),
                "{} runs {sql}",
                role.name()
            );
        }
        // Credentials: the API's tokens for the API, join tokens and agent
        // credentials for the gateway.
        for (table, owner) in [
            ("api_tokens", Role::Api),
            ("join_tokens", Role::Gateway),
            ("agent_credentials", Role::Gateway),
        ] {
            let sql = format!("SELECT count(*) FROM {table}");
            let expected = (role != owner).then(|| INSUFFICIENT_PRIVILEGE.to_string());
            assert_eq!(
                try_as(&pool, &sql).await,
                expected,
                "{} reads {table}",
                role.name()
            );
        }
        // Row locks on devices: the placer through lock_devices only (the
        // hub owns the function and may lock its rows anyway).
        let lock = format!("SELECT * FROM lock_devices(ARRAY['{id}'], false)");
        let expected =
            (!matches!(role, Role::Placer | Role::Hub)).then(|| INSUFFICIENT_PRIVILEGE.to_string());
        assert_eq!(
            try_as(&pool, &lock).await,
            expected,
            "{} locks",
            role.name()
        );
        if role == Role::Placer {
            let direct = format!("SELECT id FROM devices WHERE id = '{id}' FOR UPDATE");
            assert_eq!(
                try_as(&pool, &direct).await.as_deref(),
                Some(INSUFFICIENT_PRIVILEGE),
                "the placer locks devices only through lock_devices"
            );
        }
        pool.close().await;
    }
    // Nothing above changed the device.
    assert_eq!(env.device_field(&id, "cordoned").await, "false");
    trigger.trigger();
    let _ = task.await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_outside_the_role_cannot_connect_as_it() {
    let env = TestEnv::new().await;
    let user = format!("fleet_outsider_{}", &env.db_name["fleet_test_".len()..]);
    let admin = &env.pool;
    sqlx::query(&format!("CREATE ROLE \"{user}\" LOGIN"))
        .execute(admin)
        .await
        .unwrap();
    let url = &env.common.database.url;
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    let url = format!("{scheme}://{user}@{host}");
    let refused = fleet_store::connect_as(&url, 1, Some(Role::Hub)).await;
    sqlx::query(&format!("DROP ROLE \"{user}\""))
        .execute(admin)
        .await
        .unwrap();
    let err = refused.expect_err("a user that is not a member of fleet_hub is refused");
    assert!(
        format!("{err}").contains("permission denied to set role"),
        "the refusal names the cause: {err}"
    );
    env.cleanup().await;
}

/// compose's per-service login users (`compose/postgres-roles.sql`, run by
/// the postgres image at first start): each logs in and is a member of its
/// own role and of no other. Run here with psql, as the image runs it, in a
/// transaction that is rolled back, so the machine keeps no such user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_login_users_are_members_of_their_role_only() {
    let env = TestEnv::new().await;
    let script = repo("compose/postgres-roles.sql");
    let mut cmd = std::process::Command::new("psql");
    cmd.arg(&env.common.database.url)
        .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for r in ["hub", "api", "placer", "gateway", "radar", "workflow"] {
        cmd.args(["-v", &format!("{r}_password=test-{r}")]);
    }
    let mut child = cmd
        .spawn()
        .expect("psql runs (tests/run installs PostgreSQL's client)");
    let input = format!(
        "BEGIN;\n\\i {script}\n\
         SELECT u.rolname || ' ' || u.rolcanlogin || ' ' || \
           string_agg(r.rolname, ',' ORDER BY r.rolname) FILTER (WHERE pg_has_role(u.oid, r.oid, 'MEMBER')) \
         FROM pg_roles u CROSS JOIN pg_roles r \
         WHERE u.rolname LIKE 'fleet\\_%\\_login' AND r.rolname IN \
           ('fleet_hub', 'fleet_api', 'fleet_placer', 'fleet_gateway', 'fleet_radar', 'fleet_workflow') \
         GROUP BY u.rolname, u.rolcanlogin ORDER BY u.rolname;\n\
         ROLLBACK;\n"
    );
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        rows,
        [
            "fleet_api_login true fleet_api",
            "fleet_gateway_login true fleet_gateway",
            "fleet_hub_login true fleet_hub",
            "fleet_placer_login true fleet_placer",
            "fleet_radar_login true fleet_radar",
            "fleet_workflow_login true fleet_workflow",
        ]
    );
    // Rolled back: no login user is left on the machine.
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_roles WHERE rolname LIKE 'fleet\\_%\\_login'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(left, 0);
    env.cleanup().await;
}

/// Only the workflow service's role writes its jobs (issue 15, item 3:
/// "the workflow service its jobs").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_workflow_role_writes_jobs_and_impairment_events() {
    let env = TestEnv::new().await;
    for role in Role::ALL {
        let pool = fleet_store::connect_as(&env.common.database.url, 1, Some(role))
            .await
            .unwrap_or_else(|e| panic!("connect as {}: {e}", role.name()));
        let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(seen, 0, "{} reads jobs", role.name());
        let expected = (role != Role::Workflow).then(|| INSUFFICIENT_PRIVILEGE.to_string());
        assert_eq!(
            try_as(
                &pool,
                "INSERT INTO jobs (id, workflow, created_by) VALUES ('job_x', 'image_node', 'intruder')"
            )
            .await,
            expected,
            "{} inserts a job",
            role.name()
        );
        assert_eq!(
            try_as(&pool, "UPDATE job_devices SET status = 'succeeded'").await,
            expected,
            "{} updates job devices",
            role.name()
        );
        // Impairment events are the workflow service's too (the API asks
        // it; it no longer writes them itself).
        assert_eq!(
            try_as(
                &pool,
                "INSERT INTO impairment_events (id, status, reason, created_by) VALUES ('imp_x', 'accepted', 'r', 'intruder')"
            )
            .await,
            expected,
            "{} inserts an impairment event",
            role.name()
        );
        assert_eq!(
            try_as(
                &pool,
                "UPDATE impairment_event_devices SET status = 'cleared'"
            )
            .await,
            expected,
            "{} updates impairment event devices",
            role.name()
        );
        pool.close().await;
    }
    env.cleanup().await;
}

/// Sites, tenants, pools and hardware profiles are the hub's (its
/// inventory commands): every other role only reads them, Radar writes its
/// one tenant column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_hubs_role_writes_the_inventory() {
    let env = TestEnv::new().await;
    for role in Role::ALL {
        let pool = fleet_store::connect_as(&env.common.database.url, 1, Some(role))
            .await
            .unwrap_or_else(|e| panic!("connect as {}: {e}", role.name()));
        let expected = (role != Role::Hub).then(|| INSUFFICIENT_PRIVILEGE.to_string());
        for sql in [
            "INSERT INTO sites (id, name) VALUES ('s9', 'intruder')",
            "UPDATE sites SET inventory_only = true",
            "DELETE FROM sites WHERE id = 's2'",
            "INSERT INTO tenants (id, name) VALUES ('t9', 'intruder')",
            "UPDATE tenants SET name = 'intruder'",
            "INSERT INTO pools (id, site_id, kind) VALUES ('p9', 's1', 'metal-host')",
            "DELETE FROM pool_hardware_profiles",
        ] {
            assert_eq!(try_as(&pool, sql).await, expected, "{}: {sql}", role.name());
        }
        pool.close().await;
    }
    env.cleanup().await;
}
