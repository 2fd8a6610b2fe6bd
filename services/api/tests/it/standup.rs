//! `GET /api/v1/sites/{id}/standup-pipeline/`: the seed's placement rules
//! through the API, over devices and job history as the hub and the
//! workflow service store them (written here as fixtures: the rows are the
//! input of a read-path derivation).

use serde_json::{json, Value};

use crate::support::*;
use fleet_api::Scope;

/// A device of site s1 and its job history: `(workflow, status or "",
/// failure_code)` in creation order, a minute apart.
struct Fixture {
    name: &'static str,
    rack: &'static str,
    class: &'static str,
    operational: &'static str,
    jobs: Vec<(&'static str, &'static str)>,
}

async fn insert(env: &TestEnv, n: &mut i64, f: &Fixture) {
    let id = format!("dev_{}", f.name);
    sqlx::query(
        "INSERT INTO devices (id, name, site_id, rack, device_class, operational_status) \
         VALUES ($1, $2, 's1', NULLIF($3, ''), $4, $5)",
    )
    .bind(&id)
    .bind(f.name)
    .bind(f.rack)
    .bind(f.class)
    .bind(f.operational)
    .execute(&env.pool)
    .await
    .unwrap();
    for (workflow, status) in &f.jobs {
        *n += 1;
        let job = format!("job_{:03}", *n);
        sqlx::query(
            "INSERT INTO jobs (id, workflow, status, created_by, created_at) \
             VALUES ($1, $2, 'running', 'test', now() - interval '1 day' + $3 * interval '1 minute')",
        )
        .bind(&job)
        .bind(workflow)
        .bind(*n as i32)
        .execute(&env.pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO job_devices (job_id, device_id, status, failure_code) \
             VALUES ($1, $2, NULLIF($3, ''), CASE WHEN $3 = 'failed' THEN 'TEST_FAILED' END)",
        )
        .bind(&job)
        .bind(&id)
        .bind(status)
        .execute(&env.pool)
        .await
        .unwrap();
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// Every cell of a pipeline page, rack by rack.
fn cells_of(page: &Value) -> Vec<&Value> {
    page["racks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["devices"].as_array().unwrap())
        .collect()
}

/// Where a cell stands: its stage, status, available actions and
/// suppression reasons.
type Placement<'a> = (&'a str, &'a str, Vec<String>, Vec<String>);

/// The cell of the device `name`, and where it stands.
fn placed<'a>(cells: &[&'a Value], name: &str) -> (&'a Value, Placement<'a>) {
    let c = *cells
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{name}: no cell"));
    let got = (
        c["stage"].as_str().unwrap(),
        c["status"].as_str().unwrap(),
        strings(&c["available_actions"]),
        strings(&c["action_suppression_reasons"]),
    );
    (c, got)
}

#[tokio::test]
async fn api_standup_pipeline_places_every_device_as_the_seed_says() {
    let env = TestEnv::new().await;
    let mut config = api_config();
    config.standup.sites.insert("s1".into(), Default::default());
    let (addr, served) = Served::api(&env, &config).await;
    let read = token(&env, &[Scope::DeviceRead]).await;

    const EN: &str = "enrollment";
    const MTC: &str = "move_to_test_cluster";
    const SNT: &str = "single_node_test";
    let gpu = |name, operational, jobs| Fixture {
        name,
        rack: "r1",
        class: "gpu_compute",
        operational,
        jobs,
    };
    // Each row: the seed sentence, the device, and the cell it must get:
    // (stage, status, available_actions, action_suppression_reasons).
    type Want = (
        &'static str,
        &'static str,
        Vec<&'static str>,
        Vec<&'static str>,
    );
    let cases: Vec<(&str, Fixture, Want)> = vec![
        ("'A fresh device is column=enrolment, status=not_started'",
         gpu("fresh", "unknown", vec![]),
         ("enrolment", "not_started", vec![EN], vec![])),
        ("'a completed enrolment appears under quarantine'",
         gpu("enrolled", "unknown", vec![(EN, "succeeded")]),
         ("quarantine", "not_started", vec![MTC], vec![])),
        ("'An in-flight cell never offers actions'",
         gpu("testing", "quarantine", vec![(EN, "succeeded"), (MTC, "running")]),
         ("quarantine", "running", vec![], vec!["concurrent_workflow_running"])),
        ("a job that has not started the device is pending",
         gpu("queued", "quarantine", vec![(EN, "succeeded"), (MTC, "")]),
         ("quarantine", "pending", vec![], vec!["concurrent_workflow_running"])),
        ("'Interrupted executions (cancelled / terminated / superseded) never own the cell status'",
         gpu("failed-then-cancelled", "quarantine", vec![(EN, "succeeded"), (MTC, "failed"), (MTC, "cancelled")]),
         ("quarantine", "failed", vec![MTC], vec![])),
        ("'If it does have an earlier success, the interruption does not revoke it.'",
         gpu("passed-then-superseded", "quarantine", vec![(EN, "succeeded"), (MTC, "succeeded"), (MTC, "superseded")]),
         ("single_node_test", "not_started", vec![SNT], vec![])),
        ("'The prefix clamp then prevents the cell from appearing beyond the first incomplete stage'",
         gpu("re-enrolled", "unknown", vec![(EN, "succeeded"), (MTC, "succeeded"), (EN, "failed")]),
         ("enrolment", "failed", vec![EN], vec![])),
        ("'If operational_status is available or in_use, the device is placed at its effective terminal stage with status=succeeded ... newer failed ... Jobs ... do not move the cell'",
         gpu("handed-over", "available", vec![(EN, "succeeded"), (MTC, "failed")]),
         ("release", "succeeded", vec![], vec!["no_next_stage"])),
        ("'A customer-ready terminal cell whose newest placement-relevant workflow is still pending or running reports both concurrent_workflow_running and no_next_stage'",
         gpu("in-use-and-testing", "in_use", vec![(MTC, "running")]),
         ("release", "succeeded", vec![], vec!["concurrent_workflow_running", "no_next_stage"])),
        ("'CPU hypervisors terminate at enrolment.'",
         Fixture { name: "hv-enrolled", rack: "r1", class: "cpu_hypervisor", operational: "unknown", jobs: vec![(EN, "succeeded")] },
         ("enrolment", "succeeded", vec![], vec!["no_next_stage"])),
        ("'... (release for customer hosts, enrolment for hypervisors)'",
         Fixture { name: "hv-in-use", rack: "r1", class: "cpu_hypervisor", operational: "in_use", jobs: vec![] },
         ("enrolment", "succeeded", vec![], vec!["no_next_stage"])),
        ("'CPU bare-metal always includes quarantine ... a policy adds single-node acceptance'",
         Fixture { name: "cpu-tested", rack: "r2", class: "cpu_baremetal", operational: "quarantine", jobs: vec![(EN, "succeeded"), (MTC, "succeeded")] },
         ("single_node_test", "not_started", vec![SNT], vec![])),
    ];
    let mut n = 0;
    for (_, f, _) in &cases {
        insert(&env, &mut n, f).await;
    }
    // "Switches have no pipeline: they are excluded from device cells, and
    // a rack of only switches is omitted from the response entirely."
    for (name, rack) in [("leaf-r1", "r1"), ("leaf-r9", "r9")] {
        let f = Fixture {
            name,
            rack,
            class: "switch",
            operational: "unknown",
            jobs: vec![(EN, "succeeded")],
        };
        insert(&env, &mut n, &f).await;
    }

    let page = get(addr, "/api/v1/sites/s1/standup-pipeline/", &read)
        .await
        .expect(200);
    assert_eq!(
        strings(&page["stages"]),
        [
            "enrolment",
            "quarantine",
            "single_node_test",
            "multi_node_test",
            "release"
        ]
    );
    let racks = field(&page["racks"], "rack");
    assert_eq!(racks, ["r1", "r2"], "the switch-only rack r9 is omitted");
    let cells = cells_of(&page);
    assert_eq!(cells.len(), cases.len(), "no switch has a cell");
    for (sentence, f, (stage, status, actions, reasons)) in &cases {
        let (_, got) = placed(&cells, f.name);
        assert_eq!(
            got,
            (*stage, *status, to(actions), to(reasons)),
            "{sentence}"
        );
        assert!(
            !got.2.is_empty() || !got.3.is_empty(),
            "'every cell with an empty available_actions list carries at least one typed action_suppression_reasons value': {sentence}"
        );
    }

    // Drill-through: the newest job names the latest execution, and a
    // failed cell's detail is the execution that placed it.
    let cell = |name: &str| placed(&cells, name).0;
    let c = cell("failed-then-cancelled");
    assert_eq!(c["latest_in_sequence_workflow"]["status"], "cancelled");
    assert_eq!(c["placed_by"]["status"], "failed");
    assert_eq!(c["placed_by"]["failure_code"], "TEST_FAILED");
    assert_eq!(c["placed_by"]["workflow"], MTC);
    let c = cell("handed-over");
    assert_eq!(c["latest_in_sequence_workflow"]["status"], "failed");
    assert_eq!(c["placed_by"], Value::Null);
    let c = cell("fresh");
    assert_eq!(
        (&c["latest_in_sequence_workflow"], &c["placed_by"]),
        (&Value::Null, &Value::Null)
    );
    // The rack's counts per column and status.
    assert_eq!(
        page["racks"][1]["cells"],
        json!({"single_node_test": {"not_started": 1}})
    );
    assert_eq!(page["next_cursor"], Value::Null);

    // Paged by rack: one rack a page, r9 never served.
    let first = get(addr, "/api/v1/sites/s1/standup-pipeline/?limit=1", &read)
        .await
        .expect(200);
    assert_eq!(first["racks"][0]["rack"], "r1");
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_string();
    let second = get(
        addr,
        &format!("/api/v1/sites/s1/standup-pipeline/?limit=1&cursor={cursor}"),
        &read,
    )
    .await
    .expect(200);
    assert_eq!(second["racks"].as_array().unwrap().len(), 1);
    assert_eq!(second["racks"][0]["rack"], "r2");
    assert_eq!(second["next_cursor"], Value::Null);

    get(addr, "/api/v1/sites/nowhere/standup-pipeline/", &read)
        .await
        .assert_error((404, "NOT_FOUND"), "an unknown site");
    get(addr, "/api/v1/sites/s1/standup-pipeline/?cursor=zz", &read)
        .await
        .assert_error((400, "INVALID_ARGUMENT"), "a malformed cursor");
    get(addr, "/api/v1/sites/s1/standup-pipeline/?limit=0", &read)
        .await
        .assert_error((400, "INVALID_ARGUMENT"), "limit 0");
    served.stop(env).await;
}

fn to(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Without an acceptance policy GPU compute and CPU bare-metal go from
/// quarantine straight to release.
#[tokio::test]
async fn api_standup_pipeline_without_a_policy_skips_the_burn_in_stages() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::api(&env, &api_config()).await;
    let read = token(&env, &[Scope::DeviceRead]).await;
    let mut n = 0;
    for class in ["gpu_compute", "cpu_baremetal"] {
        let f = Fixture {
            name: class,
            rack: "",
            class,
            operational: "quarantine",
            jobs: vec![
                ("enrollment", "succeeded"),
                ("move_to_test_cluster", "succeeded"),
            ],
        };
        insert(&env, &mut n, &f).await;
    }
    let page = get(addr, "/api/v1/sites/s1/standup-pipeline/", &read)
        .await
        .expect(200);
    assert_eq!(page["racks"][0]["rack"], "", "unracked devices are one row");
    for c in page["racks"][0]["devices"].as_array().unwrap() {
        assert_eq!(
            (&c["stage"], &c["status"]),
            (&json!("release"), &json!("not_started")),
            "{c}"
        );
        assert_eq!(c["available_actions"], json!(["release"]));
    }
    served.stop(env).await;
}

/// Acceptance gates ("site conditions"): a device gate on its health after
/// single_node_test, and multi_node_test composing an NVLink-domain rack
/// gate and a pod gate; a pool's own policy replaces the site's.
#[tokio::test]
async fn api_standup_pipeline_holds_a_burn_in_stage_until_its_gates_pass() {
    use fleet_api::{AcceptancePolicy, GateConfig, PoolPolicy};
    use fleet_domain::acceptance::GateScope;
    use fleet_domain::standup::Stage;

    let env = TestEnv::new().await;
    for pool in ["pod-a", "pod-b", "pod-c", "pod-x"] {
        sqlx::query("INSERT INTO pools (id, site_id, kind) VALUES ($1, 's1', 'custom')")
            .bind(pool)
            .execute(&env.pool)
            .await
            .unwrap();
    }
    let gate = |name: &str, stage, scope| GateConfig {
        name: name.into(),
        stage,
        scope,
    };
    let mut config = api_config();
    config.standup.sites.insert(
        "s1".into(),
        AcceptancePolicy {
            gates: vec![
                gate("node_health", Stage::SingleNodeTest, GateScope::Device),
                gate("nvlink_domain", Stage::MultiNodeTest, GateScope::Rack),
                gate("pod", Stage::MultiNodeTest, GateScope::Pool),
            ],
            pools: [("pod-x".to_string(), PoolPolicy { gates: vec![] })]
                .into_iter()
                .collect(),
        },
    );
    let (addr, served) = Served::api(&env, &config).await;
    let read = token(&env, &[Scope::DeviceRead]).await;

    const OK: &str = "succeeded";
    let snt = vec![
        ("enrollment", OK),
        ("move_to_test_cluster", OK),
        ("single_node_test", OK),
    ];
    let mnt = |status: &'static str| {
        let mut j = snt.clone();
        j.push(("multi_node_test", status));
        j
    };
    // (name, rack, pool, health, jobs), then the cell it must get.
    type Row = (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        Vec<(&'static str, &'static str)>,
    );
    let cases: Vec<(&str, Row, (&str, &str, Vec<&str>, Vec<&str>))> = vec![
        ("'multi_node_test composes across every configured multi-node collective gate': a rack member has not run it, so the rack gate 'can't yet be evaluated' and holds",
         ("a1", "ra", "pod-a", "healthy", mnt(OK)),
         ("multi_node_test", "succeeded", vec![], vec!["acceptance_gate_unevaluated"])),
        ("'Advancement out of single_node_test ... is held ... until its burn-in acceptance gate passes': degraded health fails the device gate",
         ("a2", "ra", "pod-a", "degraded", snt.clone()),
         ("single_node_test", "succeeded", vec![], vec!["acceptance_gate_failed"])),
        ("the rack gate passes, but the pod has a member (a1's rack-mate a2) that has not passed: 'the device advances only once all of them pass'",
         ("b1", "rb", "pod-a", "healthy", mnt(OK)),
         ("multi_node_test", "succeeded", vec![], vec!["acceptance_gate_unevaluated"])),
        ("(b1's rack-mate)",
         ("b2", "rb", "pod-a", "healthy", mnt(OK)),
         ("multi_node_test", "succeeded", vec![], vec!["acceptance_gate_unevaluated"])),
        ("every gate passes: the device advances to release",
         ("c1", "rc", "pod-b", "healthy", mnt(OK)),
         ("release", "not_started", vec!["release"], vec![])),
        ("(c1's rack- and pod-mate)",
         ("c2", "rc", "pod-b", "healthy", mnt(OK)),
         ("release", "not_started", vec!["release"], vec![])),
        ("a rack-mate failed multi_node_test: the NVLink-domain gate fails",
         ("d1", "rd", "pod-c", "healthy", mnt(OK)),
         ("multi_node_test", "succeeded", vec![], vec!["acceptance_gate_failed"])),
        ("'failed is a genuine negative placement result'",
         ("d2", "rd", "pod-c", "healthy", mnt("failed")),
         ("multi_node_test", "failed", vec!["multi_node_test"], vec![])),
        ("'Any configured gate that can't yet be evaluated (missing evidence ...) holds too': health never read",
         ("e1", "re", "pod-c", "unknown", snt.clone()),
         ("single_node_test", "succeeded", vec![], vec!["acceptance_gate_unevaluated"])),
        ("'(missing ... topology)': no rack and no pool",
         ("f1", "", "", "healthy", mnt(OK)),
         ("multi_node_test", "succeeded", vec![], vec!["acceptance_gate_unevaluated"])),
        ("a pool's policy replaces the site's: pod-x has no gates",
         ("x1", "rx", "pod-x", "unknown", mnt(OK)),
         ("release", "not_started", vec!["release"], vec![])),
    ];
    let mut n = 0;
    for (_, (name, rack, pool, health, jobs), _) in &cases {
        let f = Fixture {
            name,
            rack,
            class: "gpu_compute",
            operational: "quarantine",
            jobs: jobs.clone(),
        };
        insert(&env, &mut n, &f).await;
        sqlx::query(
            "UPDATE devices SET health_status = $2, pool_id = NULLIF($3, '') WHERE id = $1",
        )
        .bind(format!("dev_{name}"))
        .bind(health)
        .bind(pool)
        .execute(&env.pool)
        .await
        .unwrap();
    }
    // Page by one rack at a time: a pod gate reads its whole pool, not the
    // page.
    let walked = pages(addr, "/api/v1/sites/s1/standup-pipeline/?limit=1", &read).await;
    let cells: Vec<&Value> = walked.iter().flat_map(cells_of).collect();
    for (sentence, (name, ..), (stage, status, actions, reasons)) in &cases {
        let (c, got) = placed(&cells, name);
        assert_eq!(
            got,
            (*stage, *status, to(actions), to(reasons)),
            "{sentence}: {c}"
        );
    }
    let b1 = placed(&cells, "b1").0;
    assert_eq!(
        b1["acceptance_gates"],
        json!([
            {"name": "node_health", "stage": "single_node_test", "scope": "device", "outcome": "passed"},
            {"name": "nvlink_domain", "stage": "multi_node_test", "scope": "rack", "outcome": "passed"},
            {"name": "pod", "stage": "multi_node_test", "scope": "pool", "outcome": "unevaluated"},
        ]),
        "each gate's evaluation is evidence on the cell"
    );
    served.stop(env).await;
}
