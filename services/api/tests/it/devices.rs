//! The operator API over real HTTP (port 0), against the real hub, NATS
//! and PostgreSQL: scopes on every route, every error code of `api.md`,
//! snapshots of the main responses, filters and cursor pagination over
//! thousands of devices under concurrent updates, lifecycle `ended_at`
//! across pages, impairment events, and 503s with the hub, NATS or
//! PostgreSQL away.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use chrono::{DateTime, Utc};
use fleet_api::routes::{table, OPEN_PATHS};
use fleet_api::Scope::{self, ConditionsWrite, DeviceRead, DeviceWrite, OperationsWrite};
use fleet_domain::predicates::{self, SchedulingFacts};
use fleet_domain::*;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

/// Ids and timestamps replaced so snapshots are stable.
fn redact(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k == "next_cursor" && !x.is_null() {
                    *x = json!("[cursor]");
                } else {
                    redact(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(redact),
        Value::String(s) => {
            if DateTime::parse_from_rfc3339(s).is_ok() {
                *s = "[timestamp]".into();
            } else {
                *s = redact_ulids(s);
            }
        }
        _ => {}
    }
}

fn redact_ulids(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    'outer: while !rest.is_empty() {
        for prefix in ["dev_", "imp_", "tok_"] {
            if let Some(tail) = rest.strip_prefix(prefix) {
                let ulid: String = tail.chars().take(26).collect();
                if ulid.len() == 26 && ulid.chars().all(|c| c.is_ascii_alphanumeric()) {
                    out.push_str(prefix);
                    out.push_str("[ulid]");
                    rest = &tail[26..];
                    continue 'outer;
                }
            }
        }
        let c = rest.chars().next().unwrap();
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

fn snap(mut v: Value) -> Value {
    redact(&mut v);
    v
}

fn now_rfc3339() -> String {
    micros(Utc::now()).to_rfc3339()
}

/// The ids of a list's page, in order.
fn ids(r: Resp) -> Vec<String> {
    field(&r.json()["items"], "id")
        .into_iter()
        .map(String::from)
        .collect()
}

async fn apply_openstack(
    addr: SocketAddr,
    t: &str,
    device: &str,
    ready: bool,
    allocated: bool,
) -> Resp {
    post(
        addr,
        "/api/v1/device-conditions/apply/",
        t,
        json!({
            "source": "openstack",
            "device_id": device,
            "observed_at": now_rfc3339(),
            "conditions": [
                {"type": "IronicProvisionHealthy", "status": "True", "reason": "Healthy"},
                {"type": "IronicMaintenance", "status": "False"},
                {"type": "CustomerReady", "status": if ready {"True"} else {"False"}},
                {"type": "InstanceAllocated", "status": if allocated {"True"} else {"False"}},
                {"type": "IronicAvailable", "status": "False"},
                {"type": "InMaintenancePool", "status": "False"},
            ],
            "ironic": {"provision_state": "active", "power_state": "power on"}
        }),
    )
    .await
}

// --------------------------------------------------------------- tests

/// Every route of the table needs its scope: no token is 401, a token
/// with every other scope is 403. A route added without a scope cannot
/// exist (the table carries one for each), and one missing from the
/// OpenAPI document fails here too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_every_route_needs_its_scope() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::api(&env, &api_config()).await;
    let doc: Value = serde_json::from_str(fleet_api::openapi::json()).unwrap();
    let routes = table();
    assert!(routes.len() >= 20);
    for r in &routes {
        assert!(
            r.path.starts_with("/api/v1/"),
            "{} is outside /api/v1",
            r.path
        );
        assert!(!OPEN_PATHS.contains(&r.path.as_str()));
        let path = r.path.replace("{id}", "x");
        let method = r.method.as_str();
        let none = http_raw(addr, method, &path, None, None, b"").await;
        assert_eq!(none.status, 401, "{method} {path} without a token");
        assert_eq!(none.code(), "UNAUTHENTICATED");
        let unknown = http_raw(addr, method, &path, Some("fleet_nope"), None, b"").await;
        assert_eq!(unknown.status, 401, "{method} {path} with an unknown token");
        let others: Vec<Scope> = Scope::ALL
            .iter()
            .copied()
            .filter(|s| *s != r.scope)
            .collect();
        let t = token(&env, &others).await;
        let forbidden = http_raw(addr, method, &path, Some(&t), None, b"").await;
        assert_eq!(
            forbidden.status, 403,
            "{method} {path} without {:?}",
            r.scope
        );
        assert_eq!(forbidden.code(), "FORBIDDEN");
        assert_eq!(
            forbidden.json()["error"]["details"]["required_scope"],
            r.scope.as_str()
        );
        // The document has the operation, with the same scope.
        let op = &doc["paths"][r.path.as_str()][method.to_lowercase()];
        assert!(
            op.is_object(),
            "{method} {} is not in the OpenAPI document",
            r.path
        );
        assert_eq!(op["security"][0]["bearer"][0], r.scope.as_str());
    }
    // ... and nothing in the document that the table does not serve.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            assert!(
                routes
                    .iter()
                    .any(|r| r.path == *path && r.method.as_str().eq_ignore_ascii_case(method)),
                "{method} {path} is documented but not routed"
            );
        }
    }
    // The scheme is case-insensitive; a token alone is not a bearer header.
    let t = token(&env, &[Scope::DeviceRead]).await;
    for (header, status) in [
        (format!("bearer {t}"), 200),
        (format!("BEARER  {t}"), 200),
        (t.clone(), 401),
        (format!("Basic {t}"), 401),
    ] {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "GET /api/v1/devices/ HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: {header}\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.unwrap();
        assert!(
            buf.starts_with(&format!("HTTP/1.1 {status}")),
            "{header}: {}",
            buf.lines().next().unwrap_or("")
        );
    }
    for open in OPEN_PATHS {
        let r = http_raw(addr, "GET", open, None, None, b"").await;
        assert_eq!(r.status, 200, "{open} is open");
    }
    served.stop(env).await;
}

/// `docs/openapi.json` is the document the code generates. Regenerate it
/// with `UPDATE_OPENAPI=1 cargo test -p fleet-api --test it api_openapi`.
#[test]
fn api_openapi_document_is_committed_and_current() {
    let path = repo("docs/openapi.json");
    let generated = fleet_api::openapi::json();
    if std::env::var("UPDATE_OPENAPI").is_ok() {
        std::fs::write(&path, generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi.json is out of date: run UPDATE_OPENAPI=1 cargo test -p fleet-api --test it api_openapi"
    );
}

/// The main responses as snapshots, and every error code of `api.md`
/// except UNAVAILABLE (see the outage tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_devices_conditions_and_errors() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::with_hub(&env, &api_config()).await;
    let all = token(&env, Scope::ALL).await;
    let a = env.create_device("s1", "gpu-a1-01").await;
    let b = env.create_device("s1", "gpu-a1-02").await;
    // A device command: POST /api/v1/devices/{id}/{verb}.
    let command = |id: &str, verb: &str, body: Value| {
        let (path, all) = (format!("/api/v1/devices/{id}/{verb}"), all.clone());
        async move { post(addr, &path, &all, body).await }
    };

    // Snapshot apply through the hub: the answer says what happened.
    let r = apply_openstack(addr, &all, &a, true, true).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let applied = r.json();
    assert_eq!(applied["outcome"], "applied");
    assert_eq!(applied["device"]["operational_status"], "in_use");
    insta::assert_json_snapshot!("snapshot_apply", snap(applied.clone()));

    // Detail: every axis, no hardware key, decisive rows.
    let d = get(addr, &format!("/api/v1/devices/{a}/"), &all).await;
    assert_eq!(d.status, 200, "{}", d.body);
    let detail = d.json();
    assert!(detail.get("hardware_key").is_none());
    assert_eq!(detail["hardware_key_trusted"], false);
    let decisive = field(&detail["operational_status_conditions"], "type");
    assert_eq!(decisive, vec!["CustomerReady", "InstanceAllocated"]);
    insta::assert_json_snapshot!("device_detail", snap(detail.clone()));

    // The decisive list agrees with the conditions list filtered by decisive.
    let c = get(
        addr,
        &format!("/api/v1/device-conditions/?device={a}&decisive=true"),
        &all,
    )
    .await;
    assert_eq!(c.status, 200);
    assert_eq!(c.json()["items"], detail["operational_status_conditions"]);
    let c = get(
        addr,
        &format!("/api/v1/device-conditions/?device={a}&condition_of=operational&stale=false"),
        &all,
    )
    .await;
    assert_eq!(c.json()["items"].as_array().unwrap().len(), 6);
    insta::assert_json_snapshot!("conditions_list", snap(c.json()));

    let l = get(addr, "/api/v1/devices/?site=s1", &all).await;
    assert_eq!(l.status, 200);
    insta::assert_json_snapshot!("device_list", snap(l.json()));
    // NetBox says active and the chassis is healthy: a becomes customer-ready.
    let r = post(
        addr,
        "/api/v1/device-conditions/apply/",
        &all,
        json!({
        "source": "netbox", "device_id": a, "observed_at": now_rfc3339(), "conditions": [],
        "netbox": {"status": "active", "tags": ["Provisioned"]}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post(
        addr,
        "/api/v1/device-conditions/apply/",
        &all,
        json!({
        "source": "health-status", "device_id": a, "observed_at": now_rfc3339(),
        "conditions": [{"type": "ChassisHealth", "status": "True", "reason": "RedfishHealthOk"}],
        "health": {"chassis_health": "Ok"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["device"]["customer_ready"], true, "{}", r.body);
    assert_eq!(
        ids(get(addr, "/api/v1/devices/?customer_ready=true", &all).await),
        vec![a.clone()]
    );
    assert_eq!(
        ids(get(addr, "/api/v1/devices/?customer_ready=false", &all).await),
        vec![b.clone()]
    );

    // Stale at read time: a SLURM snapshot observed an hour ago is past the
    // 180 s TTL the moment it is stored; the openstack rows are fresh.
    let old = micros(Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let r = post(
        addr,
        "/api/v1/device-conditions/apply/",
        &all,
        json!({"source": "slurm", "device_id": a, "observed_at": old,
               "conditions": [{"type": "SlurmRegistered", "status": "True"},
                              {"type": "SlurmNodeHealthy", "status": "True"}],
               "slurm": {"states": ["IDLE"]}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["stale"] == true));
    let stale = get(
        addr,
        &format!("/api/v1/device-conditions/?device={a}&stale=true"),
        &all,
    )
    .await
    .json();
    let types: BTreeSet<&str> = field(&stale["items"], "type").into_iter().collect();
    assert_eq!(
        types,
        BTreeSet::from(["SlurmRegistered", "SlurmNodeHealthy"]),
        "only the silent source's rows are stale"
    );
    let fresh = get(
        addr,
        &format!("/api/v1/device-conditions/?device={a}&stale=false&condition_of=operational"),
        &all,
    )
    .await
    .json();
    assert!(fresh["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["source"] == "openstack"));
    let slurm = get(addr, "/api/v1/devices/?slurm_states=IDLE", &all).await;
    assert_eq!(ids(slurm), vec![a.clone()]);

    // A single condition write: the reply is the stored row.
    let w = post(
        addr,
        "/api/v1/device-conditions/",
        &all,
        json!({"source": "gateway", "device_id": b, "observed_at": now_rfc3339(),
               "condition": {"type": "GpuCountMismatch", "status": "True", "reason": "FewerGpus"}}),
    )
    .await;
    assert_eq!(w.status, 200, "{}", w.body);
    assert_eq!(w.json()["status"], "True");
    assert_eq!(w.json()["stale"], false);

    // Commands carry the version read; a stale one is CONFLICT.
    let v = device(addr, &all, &a).await["version"].as_i64().unwrap();
    assert!(
        v > detail["version"].as_i64().unwrap(),
        "snapshots moved it"
    );
    let r = command(&a, "cordon", json!({"version": v, "reason": "disk"})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["cordoned"], true);
    insta::assert_json_snapshot!("cordon", snap(r.json()));
    let stale = command(&a, "uncordon", json!({"version": v})).await;
    stale.assert_error(CONFLICT, "the answer");
    let v = r.json()["version"].as_i64().unwrap();
    let r = command(
        &a,
        "taints",
        json!({"version": v, "key": "gpu-burnin", "action": "add"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["no_schedule_reasons"]
        .as_array()
        .unwrap()
        .contains(&json!("taint:gpu-burnin")));
    // An illegal provision move is INVALID_STATE.
    let v = r.json()["version"].as_i64().unwrap();
    let r = command(&a, "provision", json!({"version": v, "to": "deployed"})).await;
    r.assert_error(INVALID_STATE, "the answer");
    let r = command(&a, "adopt", json!({"version": v})).await;
    assert_eq!(r.json()["provision_state"], "adopted", "{}", r.body);

    // Triage: parent ticket set once.
    let t = post(addr, "/api/v1/devices/triage/", &all,
        json!({"device_ids": [a, b], "in_triage": true, "triage_ticket_url": "t/1", "parent_ticket_url": "p/1"})).await;
    assert_eq!(t.status, 200, "{}", t.body);
    post(
        addr,
        "/api/v1/devices/triage/",
        &all,
        json!({"device_ids": [b], "in_triage": false}),
    )
    .await;
    let t = post(addr, "/api/v1/devices/triage/", &all,
        json!({"device_ids": [b], "in_triage": true, "triage_ticket_url": "t/2", "parent_ticket_url": "p/2"})).await;
    assert_eq!(t.json()[0]["parent_ticket_url"], "p/1");
    assert_eq!(t.json()[0]["triage_ticket_url"], "t/2");
    let l = get(addr, "/api/v1/devices/?in_triage=true", &all).await;
    assert_eq!(l.json()["items"].as_array().unwrap().len(), 2);

    // Enrollment proof (the workflow's scope).
    let r = command(
        &b,
        "enrollment-proof",
        json!({"outcome": "enrolled", "result_ref": "uuid-b", "proof_source": "enrollment"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["enrollment_validated_ref"], "uuid-b");

    // Revoke identity and delete (admin).
    let v = device(addr, &all, &b).await["version"].as_i64().unwrap();
    let r = command(&b, "revoke-identity", json!({"version": v})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["identity_generation"], 2);
    let v = r.json()["version"].as_i64().unwrap();
    let r = http_raw(
        addr,
        "DELETE",
        &format!("/api/v1/devices/{b}/?version={v}"),
        Some(&all),
        None,
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        get(addr, &format!("/api/v1/devices/{b}/"), &all)
            .await
            .status,
        404
    );

    // The error codes, each in the one shape.
    let cordon = format!("/api/v1/devices/{a}/cordon");
    let writer = token(&env, &[Scope::DeviceWrite]).await;
    let mut cases: Vec<(Resp, Refusal)> = vec![(stale, CONFLICT)];
    for (path, refusal) in [
        (
            "/api/v1/devices/?operational_status=bogus",
            INVALID_ARGUMENT,
        ),
        ("/api/v1/devices/?limit=0", INVALID_ARGUMENT),
        ("/api/v1/devices/?cursor=zz", INVALID_ARGUMENT),
        ("/api/v1/devices/?nope=1", INVALID_ARGUMENT),
        // Every list's query refuses what it does not know (page_query!).
        ("/api/v1/sites/?nope=1", INVALID_ARGUMENT),
        ("/api/v1/pools/?nope=1", INVALID_ARGUMENT),
        ("/api/v1/device-conditions/?nope=1", INVALID_ARGUMENT),
        ("/api/v1/devices/?in_triage=maybe", INVALID_ARGUMENT),
        ("/api/v1/devices/?site=a%00b", INVALID_ARGUMENT),
        ("/api/v1/devices/dev_missing/", NOT_FOUND),
        ("/api/v1/sites/nope/summary", NOT_FOUND),
        ("/api/v1/nothing-here", NOT_FOUND),
    ] {
        cases.push((get(addr, path, &all).await, refusal));
    }
    // (token, content type, body): not JSON, no body at all.
    for (t, content_type, body, refusal) in [
        (
            Some(all.as_str()),
            Some("application/json"),
            &b"{not json"[..],
            INVALID_ARGUMENT,
        ),
        (Some(all.as_str()), None, b"", INVALID_ARGUMENT),
    ] {
        let r = http_raw(addr, "POST", &cordon, t, content_type, body).await;
        cases.push((r, refusal));
    }
    cases.push((
        http_raw(addr, "GET", "/api/v1/devices/", None, None, b"").await,
        UNAUTHENTICATED,
    ));
    cases.push((get(addr, "/api/v1/devices/", &writer).await, FORBIDDEN));
    let future = (Utc::now() + chrono::Duration::minutes(10)).to_rfc3339();
    for (path, body, refusal) in [
        (cordon.as_str(), json!({"reason": "x"}), INVALID_ARGUMENT),
        (
            cordon.as_str(),
            json!({"version": 0, "reason": "x"}),
            INVALID_ARGUMENT,
        ),
        (
            cordon.as_str(),
            json!({"version": 1, "reason": "nul\u{0}inside"}),
            INVALID_ARGUMENT,
        ),
        (
            "/api/v1/devices/dev_missing/cordon",
            json!({"version": 1, "reason": "x"}),
            NOT_FOUND,
        ),
        (
            "/api/v1/device-conditions/apply/",
            json!({"source": "openstack", "device_id": a, "observed_at": future, "conditions": []}),
            FUTURE_OBSERVATION,
        ),
        (
            "/api/v1/device-conditions/",
            json!({"source": "slurm", "device_id": a, "observed_at": now_rfc3339(),
                   "condition": {"type": "IronicMaintenance", "status": "True"}}),
            FORBIDDEN_SOURCE,
        ),
        (
            "/api/v1/device-conditions/",
            json!({"source": "openstack", "device_id": a, "observed_at": now_rfc3339(),
                   "condition": {"type": "NoSuchType", "status": "True"}}),
            INVALID_ARGUMENT,
        ),
    ] {
        cases.push((post(addr, path, &all, body).await, refusal));
    }
    for (r, refusal) in cases {
        r.assert_error(refusal, "the error answer");
        let e = r.json();
        assert!(e["error"]["message"].is_string() && e["error"]["details"].is_object());
        if refusal == FUTURE_OBSERVATION {
            // Issue 19: it names the clock that refused it.
            assert!(r.body.contains("ahead of the API's clock"), "{}", r.body);
        }
        assert!(
            !r.body.to_lowercase().contains("sqlx"),
            "no database text: {}",
            r.body
        );
    }
    insta::assert_json_snapshot!(
        "error_conflict",
        snap(command(&a, "uncordon", json!({"version": 1})).await.json())
    );

    served.stop(env).await;
}

/// `ended_at` is the next row of the same kind, right on every page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_lifecycle_events_ended_at_across_pages() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::with_hub(&env, &api_config()).await;
    let t = token(&env, &[Scope::DeviceRead, Scope::DeviceWrite]).await;
    let id = env.create_device("s1", "gpu-l-01").await;
    let mut version = 1;
    for i in 0..4 {
        let (verb, body) = if i % 2 == 0 {
            ("cordon", json!({"version": version, "reason": "r"}))
        } else {
            ("uncordon", json!({"version": version}))
        };
        let r = post(addr, &format!("/api/v1/devices/{id}/{verb}"), &t, body).await;
        assert_eq!(r.status, 200, "{}", r.body);
        version = r.json()["version"].as_i64().unwrap();
    }
    for kind in [None, Some("cordoned")] {
        let mut rows: Vec<Value> = Vec::new();
        let mut path = format!("/api/v1/devices/{id}/lifecycle-events/?limit=2");
        if let Some(k) = kind {
            path.push_str(&format!("&kind={k}"));
        }
        for page in pages(addr, &path, &t).await {
            let items = page["items"].as_array().unwrap().clone();
            assert!(items.len() <= 2);
            rows.extend(items);
        }
        let all: Vec<(i64, String, String, Option<String>)> = sqlx::query_as(
            "SELECT id, kind, created_at::text, NULL::text FROM device_lifecycle_events \
             WHERE device_id = $1 AND ($2::text IS NULL OR kind = $2) ORDER BY created_at DESC, id DESC",
        )
        .bind(&id)
        .bind(kind)
        .fetch_all(&env.pool)
        .await
        .unwrap();
        assert_eq!(rows.len(), all.len(), "every row once, newest first");
        for (row, (db_id, _, _, _)) in rows.iter().zip(&all) {
            assert_eq!(row["id"].as_i64().unwrap(), *db_id);
        }
        // Expected ended_at: the created_at of the next older-to-newer row of the kind.
        let mut by_kind: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
        for r in rows.iter().rev() {
            by_kind
                .entry(r["kind"].as_str().unwrap().into())
                .or_default()
                .push(r);
        }
        for (k, seq) in by_kind {
            for (i, r) in seq.iter().enumerate() {
                let expected = seq
                    .get(i + 1)
                    .map(|n| n["created_at"].clone())
                    .unwrap_or(Value::Null);
                assert_eq!(r["ended_at"], expected, "kind {k} row {}", r["id"]);
            }
        }
        if kind == Some("cordoned") {
            // birth row + 4 changes
            assert_eq!(rows.len(), 5);
            assert_eq!(rows[0]["value"], "false");
            assert!(rows[0]["ended_at"].is_null());
        }
    }
    let bad = get(
        addr,
        &format!("/api/v1/devices/{id}/lifecycle-events/?kind=nope"),
        &t,
    )
    .await;
    assert_eq!(bad.code(), "INVALID_ARGUMENT");
    served.stop(env).await;
}

const FLEET_SQL: &str = "INSERT INTO devices (id, name, site_id, role, trust, operational_status, \
    health_status, inventory_status, connectivity, provision_state, observed_generation, in_triage, \
    slurm_states, cordoned, maintenance, inventory_only) \
    SELECT 'dev_p' || lpad(i::text, 6, '0'), 'n' || i, CASE WHEN i % 3 = 0 THEN 's2' ELSE 's1' END, \
      CASE WHEN i % 19 = 0 THEN 'dedicated' ELSE 'host' END, 'platform', \
      (ARRAY['available','in_use','quarantine','unknown','delegated'])[1 + i % 5], \
      (ARRAY['healthy','degraded','unknown'])[1 + i % 3], \
      CASE WHEN i % 7 = 0 THEN 'staged' ELSE 'active' END, \
      CASE WHEN i % 2 = 0 THEN 'connected' ELSE 'disconnected' END, \
      CASE WHEN i % 11 = 0 THEN 'ready' ELSE 'deployed' END, 1, i % 11 = 0, \
      CASE WHEN i % 13 = 0 THEN ARRAY['IDLE','DRAIN'] ELSE ARRAY['ALLOCATED'] END, \
      i % 17 = 0, i % 23 = 0, i % 29 = 0 \
    FROM generate_series(1, $1) i";

type Row = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    bool,
    bool,
    bool,
    bool,
    Vec<String>,
);

/// Filters and cursor pagination over thousands of devices: every match
/// exactly once, in id order, while other columns change underneath.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_filters_and_pagination_over_thousands() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::api(&env, &api_config()).await;
    let t = token(&env, &[Scope::DeviceRead]).await;
    let n = 3000;
    sqlx::query(FLEET_SQL)
        .bind(n)
        .execute(&env.pool)
        .await
        .unwrap();
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, site_id, role, trust, operational_status, health_status, inventory_status, \
         connectivity, provision_state, in_triage, cordoned, maintenance, inventory_only, slurm_states \
         FROM devices ORDER BY id",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();

    // Concurrent updates to columns the filters below do not read.
    let pool = env.pool.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let writer = tokio::spawn(async move {
        let mut i = 0i64;
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            i += 1;
            sqlx::query(
                "UPDATE devices SET version = version + 1, updated_at = now(), \
                 rack = 'r' || $1 WHERE id = 'dev_p' || lpad((($1 * 7919) % $2 + 1)::text, 6, '0')",
            )
            .bind(i)
            .bind(n as i64)
            .execute(&pool)
            .await
            .unwrap();
        }
        i
    });

    let facts = |r: &Row| -> (bool, CapacityBucket) {
        let cr = predicates::customer_ready(
            r.12,
            InventoryStatus::parse(&r.6).unwrap(),
            OperationalStatus::parse(&r.4).unwrap(),
            HealthStatus::parse(&r.5).unwrap(),
        );
        let no_reasons: Vec<String> = vec![];
        let bucket = predicates::schedulable(&SchedulingFacts {
            role: Role::parse(&r.2).unwrap(),
            trust: Trust::parse(&r.3).unwrap(),
            owner_tenant_id: None,
            pool_owner_tenant_id: None,
            maintenance: r.11,
            cordoned: r.10,
            provision_state: ProvisionState::parse(&r.8).unwrap(),
            observed_generation: 1,
            connectivity: Connectivity::parse(&r.7).unwrap(),
            no_schedule_reasons: &no_reasons,
        });
        (cr, bucket)
    };
    type Pred = Box<dyn Fn(&Row) -> bool>;
    let cases: Vec<(&str, Pred)> = vec![
        ("", Box::new(|_| true)),
        ("site=s2", Box::new(|r| r.1 == "s2")),
        (
            "operational_status=in_use,available",
            Box::new(|r| r.4 == "in_use" || r.4 == "available"),
        ),
        (
            "health_status=degraded&site=s1",
            Box::new(|r| r.5 == "degraded" && r.1 == "s1"),
        ),
        ("inventory_status=staged", Box::new(|r| r.6 == "staged")),
        (
            "slurm_states=DRAIN",
            Box::new(|r| r.13.contains(&"DRAIN".to_string())),
        ),
        ("in_triage=true", Box::new(|r| r.9)),
        (
            "inventory_only=false&cordoned=false",
            Box::new(|r| !r.12 && !r.10),
        ),
        ("maintenance=true", Box::new(|r| r.11)),
        ("connectivity=connected", Box::new(|r| r.7 == "connected")),
        ("customer_ready=true", Box::new(move |r| facts(r).0)),
        (
            "schedulable=true",
            Box::new(move |r| facts(r).1 == CapacityBucket::Schedulable),
        ),
        (
            "schedulable=false&site=s2",
            Box::new(move |r| facts(r).1 != CapacityBucket::Schedulable && r.1 == "s2"),
        ),
    ];
    for (filter, pred) in cases {
        let expected: Vec<&String> = rows.iter().filter(|r| pred(r)).map(|r| &r.0).collect();
        let mut seen: Vec<String> = Vec::new();
        for page in pages(addr, &format!("/api/v1/devices/?limit=250&{filter}"), &t).await {
            for d in page["items"].as_array().unwrap() {
                seen.push(d["id"].as_str().unwrap().to_string());
                if filter == "customer_ready=true" {
                    assert_eq!(d["customer_ready"], true);
                }
                if filter == "schedulable=true" {
                    assert_eq!(d["capacity_bucket"], "schedulable");
                }
            }
        }
        let unique: BTreeSet<&String> = seen.iter().collect();
        assert_eq!(unique.len(), seen.len(), "{filter}: a device served twice");
        assert_eq!(
            seen.iter().collect::<Vec<_>>(),
            expected,
            "{filter}: every match once, in id order"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let updates = writer.await.unwrap();
    assert!(updates > 10, "updates ran while paging ({updates})");

    // The site summary leaves inventory-only devices out.
    let s = get(addr, "/api/v1/sites/s1/summary", &t).await;
    assert_eq!(s.status, 200);
    let s = s.json();
    let managed = rows.iter().filter(|r| r.1 == "s1" && !r.12).count() as i64;
    let inv = rows.iter().filter(|r| r.1 == "s1" && r.12).count() as i64;
    assert_eq!(s["total"], managed);
    assert_eq!(s["inventory_only_excluded"], inv);
    let sum: i64 = s["operational_status"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_i64().unwrap())
        .sum();
    assert_eq!(sum, managed);
    let ready = rows
        .iter()
        .filter(|r| r.1 == "s1" && !r.12 && facts(r).0)
        .count() as i64;
    assert_eq!(s["customer_ready"], ready);
    served.stop(env).await;
}

/// Impairment events through the API: the workflow service records the
/// event and runs each device's cordon (the hub's hold quarantines and
/// freezes; the customer-ready trait leaves Placement); clearing runs the
/// release (the trait back for the pre-hold in_use host, the hold removed,
/// the status re-derived).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_impairment_event_cordon_and_clear() {
    let env = TestEnv::new().await;
    let placement = fleet_testkit::placement::FakePlacement::start().await;
    let hub = RunningHub::start(&env).await;
    let site = placement.site_config();
    let (_w, w_trigger, w_task) = start_workflow(&env, |c| {
        c.sites.insert("s1".into(), site);
    })
    .await;
    let (addr, trigger) = start_api(&env.common, &api_config()).await;
    let ops = token(&env, &[DeviceRead, OperationsWrite, ConditionsWrite]).await;
    let (ua, ub) = (
        "0a000000-0000-4000-8000-00000000000a",
        "0b000000-0000-4000-8000-00000000000b",
    );
    let with_ref = |name: &str, uuid: &str| {
        env.create_device_with(fleet_proto::v1::CreateDevice {
            site: "s1".into(),
            name: name.into(),
            infrastructure_ref: uuid.into(),
            ..Default::default()
        })
    };
    let a = with_ref("gpu-i-01", ua).await;
    let b = with_ref("gpu-i-02", ub).await;
    placement.provider(ua, &["CUSTOM_CUSTOMER_READY"]);
    placement.provider(ub, &["CUSTOM_CUSTOMER_READY"]);
    assert_eq!(
        apply_openstack(addr, &ops, &a, true, true).await.status,
        200
    );

    let missing = post(
        addr,
        "/api/v1/operations/impairment-events/",
        &ops,
        json!({"device_ids": [a, "dev_missing"], "reason": "fabric"}),
    )
    .await;
    assert_eq!(missing.code(), "NOT_FOUND");
    assert_eq!(
        count(&env, "impairment_events").await,
        0,
        "a refused event records nothing"
    );

    let r = post(
        addr,
        "/api/v1/operations/impairment-events/",
        &ops,
        json!({"device_ids": [a, b], "reason": "fabric", "ticket_url": "https://tickets/1"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let ev = r.json();
    let id = ev["id"].as_str().unwrap().to_string();
    assert_eq!(ev["status"], "accepted");
    insta::assert_json_snapshot!("impairment_created", snap(ev.clone()));
    let path = format!("/api/v1/operations/impairment-events/{id}/");
    let cordoned = eventually("the event cordoned", || async {
        let e = get(addr, &path, &ops).await.json();
        (e["status"] == "cordoned").then_some(e)
    })
    .await;
    insta::assert_json_snapshot!("impairment_cordoned", snap(cordoned));
    for d in [&a, &b] {
        assert_eq!(
            env.device_field(d, "operational_status").await,
            "quarantine"
        );
        assert_eq!(env.device_field(d, "impairment_hold").await, id);
    }
    assert_eq!(placement.traits(ua).unwrap(), Vec::<String>::new());
    // The hold freezes the status while conditions still update.
    assert_eq!(
        apply_openstack(addr, &ops, &a, true, true).await.json()["device"]["operational_status"],
        "quarantine"
    );
    let again = post(
        addr,
        "/api/v1/operations/impairment-events/",
        &ops,
        json!({"device_ids": [a], "reason": "again"}),
    )
    .await;
    assert_eq!(again.code(), "INVALID_STATE");

    let list = get(
        addr,
        "/api/v1/operations/impairment-events/?status=cordoned",
        &ops,
    )
    .await;
    assert_eq!(list.json()["items"].as_array().unwrap().len(), 1);

    let clear_path = format!("/api/v1/operations/impairment-events/{id}/clear");
    let clear = || http_raw(addr, "POST", &clear_path, Some(&ops), None, b"");
    let c = clear().await;
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(c.json()["status"], "release_pending");
    let cleared = eventually("the event cleared", || async {
        let e = get(addr, &path, &ops).await.json();
        (e["status"] == "cleared").then_some(e)
    })
    .await;
    insta::assert_json_snapshot!("impairment_cleared", snap(cleared.clone()));
    // Re-derived: a was in_use before the hold, b unknown.
    assert_eq!(env.device_field(&a, "operational_status").await, "in_use");
    assert_eq!(env.device_field(&b, "operational_status").await, "unknown");
    let devs = cleared["devices"].as_array().unwrap();
    let da = devs.iter().find(|d| d["device_id"] == a.as_str()).unwrap();
    assert_eq!(da["placement_action"], "restore_customer_ready_trait");
    assert_eq!(da["placement_status"], "done");
    assert_eq!(
        placement.traits(ua).unwrap(),
        vec!["CUSTOM_CUSTOMER_READY".to_string()]
    );
    let db = devs.iter().find(|d| d["device_id"] == b.as_str()).unwrap();
    assert!(db["placement_action"].is_null());
    assert_eq!(
        placement.traits(ub).unwrap(),
        Vec::<String>::new(),
        "b was not available or in_use before the hold"
    );
    let twice = clear().await;
    assert_eq!(twice.code(), "INVALID_STATE");
    trigger.trigger();
    stop(w_trigger, w_task).await;
    hub.stop(env).await;
}

/// An event the storm guard holds shows the hold and each scope it
/// tripped, as the workflow service stored them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_impairment_event_shows_its_storm_guard_hold() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::api(&env, &api_config()).await;
    let t = token(&env, &[Scope::DeviceRead]).await;
    sqlx::query(
        "INSERT INTO impairment_events (id, status, reason, created_by, awaiting_confirmation) \
         VALUES ('imp_held', 'accepted', 'fabric', 'test', true)",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO storm_trips (kind, id, scope_kind, scope_id, in_service, taking, in_window, \
         device_limit) VALUES ('impairment', 'imp_held', 'site', 's1', 10, 4, 1, 2), \
         ('job', 'imp_held', 'pool', 'p1', 9, 9, 9, 9)",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let e = get(addr, "/api/v1/operations/impairment-events/imp_held/", &t)
        .await
        .expect(200);
    assert_eq!(
        e["storm_guard"],
        json!({"awaiting_confirmation": true, "confirmed_by": null, "confirmed_at": null,
               "confirm_reason": null, "trips": [{"scope_kind": "site", "scope_id": "s1",
               "in_service": 10, "taking": 4, "in_window": 1, "limit": 2}]}),
        "{e}"
    );
    served.stop(env).await;
}

/// Without a hub (and without NATS at all) mutations answer 503 and
/// change nothing; reads still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_mutations_503_when_hub_or_nats_down() {
    let env = TestEnv::new().await;
    let t = token(&env, Scope::ALL).await;
    sqlx::query("INSERT INTO devices (id, name, site_id) VALUES ('dev_x', 'x', 's1')")
        .execute(&env.pool)
        .await
        .unwrap();
    let no_hub = env.common.clone();
    let mut no_nats = env.common.clone();
    no_nats.nats.url = "nats://127.0.0.1:1".into();
    for (what, common) in [("no hub", no_hub), ("no nats", no_nats)] {
        let (addr, trigger) = start_api(&common, &api_config()).await;
        let r = post(
            addr,
            "/api/v1/devices/dev_x/cordon",
            &t,
            json!({"version": 1, "reason": "r"}),
        )
        .await;
        r.assert_error(UNAVAILABLE, &what);
        let r = post(
            addr,
            "/api/v1/operations/impairment-events/",
            &t,
            json!({"device_ids": ["dev_x"], "reason": "r"}),
        )
        .await;
        // No workflow service answers: nothing was recorded.
        r.assert_error(UNAVAILABLE, &what);
        let r = get(addr, "/api/v1/devices/dev_x/", &t).await;
        assert_eq!(r.status, 200, "{what}: reads work");
        assert_eq!(r.json()["cordoned"], false);
        assert_eq!(r.json()["version"], 1);
        let ready = http_raw(addr, "GET", "/readyz", None, None, b"").await;
        if what == "no nats" {
            assert_eq!(ready.status, 503);
        }
        trigger.trigger();
    }
    env.cleanup().await;
}

/// PostgreSQL refusing connections: reads answer 503 UNAVAILABLE without
/// database text, `/readyz` is 503, and both recover when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_reads_503_when_database_down() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::api(&env, &api_config()).await;
    let t = token(&env, &[Scope::DeviceRead]).await;
    assert_eq!(get(addr, "/api/v1/devices/", &t).await.status, 200);
    let admin = sqlx::postgres::PgPool::connect(&admin_url()).await.unwrap();
    let db = &env.db_name;
    sqlx::query(&format!("ALTER DATABASE \"{db}\" ALLOW_CONNECTIONS false"))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()")
        .bind(db)
        .execute(&admin)
        .await
        .unwrap();
    for path in [
        "/api/v1/devices/",
        "/api/v1/device-conditions/",
        "/api/v1/sites/s1/summary",
    ] {
        let r = get(addr, path, &t).await;
        r.assert_error(UNAVAILABLE, &path);
        assert!(!r.body.contains("allow"), "no database text: {}", r.body);
    }
    assert_eq!(
        http_raw(addr, "GET", "/readyz", None, None, b"")
            .await
            .status,
        503
    );
    sqlx::query(&format!("ALTER DATABASE \"{db}\" ALLOW_CONNECTIONS true"))
        .execute(&admin)
        .await
        .unwrap();
    eventually("reads recover", || async {
        (get(addr, "/api/v1/devices/", &t).await.status == 200).then_some(())
    })
    .await;
    admin.close().await;
    served.stop(env).await;
}

/// The snapshot apply answers what the hub did: applied, duplicate (same
/// time and content), stale (older than the last one from the source);
/// the hub's typed refusals come back with their codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_snapshot_apply_outcomes_and_refusals() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::with_hub(&env, &api_config()).await;
    let t = token(&env, &[ConditionsWrite, DeviceRead, DeviceWrite]).await;
    let id = env.create_device("s1", "gpu-s-01").await;
    let at = micros(Utc::now() - chrono::Duration::seconds(30));
    let body = |at: DateTime<Utc>, ready: &str| {
        json!({"source": "openstack", "device": {"site": "s1", "kind": "name", "key": "gpu-s-01"},
               "observed_at": at.to_rfc3339(),
               "conditions": [{"type": "CustomerReady", "status": ready},
                              {"type": "InstanceAllocated", "status": "True"}]})
    };
    let apply = |b: Value| post(addr, "/api/v1/device-conditions/apply/", &t, b);
    let r = apply(body(at, "True")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["outcome"], "applied");
    assert_eq!(r.json()["device"]["operational_status"], "in_use");
    // Left-out types the source owns are written Unknown/NotReported.
    let reported: BTreeMap<String, (String, String)> = r.json()["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap().to_string(),
                (
                    c["status"].as_str().unwrap().to_string(),
                    c["reason"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect();
    assert_eq!(reported.len(), 6);
    assert_eq!(
        reported["IronicMaintenance"],
        ("Unknown".into(), "NotReported".into())
    );
    let version = r.json()["device"]["version"].as_i64().unwrap();

    let dup = apply(body(at, "True")).await;
    assert_eq!(dup.json()["outcome"], "duplicate");
    assert_eq!(dup.json()["device"]["version"], version);
    let stale = apply(body(at - chrono::Duration::seconds(10), "False")).await;
    assert_eq!(stale.json()["outcome"], "stale");
    assert_eq!(stale.json()["device"]["operational_status"], "in_use");
    // A version check, when given.
    let mut b = body(at + chrono::Duration::seconds(1), "True");
    b["version"] = json!(version + 5);
    assert_eq!(apply(b).await.code(), "CONFLICT");

    // Issue 19: a key that names no device is what the NATS path makes of
    // it, an unresolved observation, and the answer says so.
    let unresolved = apply(
        json!({"source": "openstack", "device": {"site": "s1", "kind": "name", "key": "gpu-nobody"},
        "observed_at": now_rfc3339(), "conditions": []}),
    )
    .await;
    assert_eq!(unresolved.status, 202, "{}", unresolved.body);
    assert_eq!(unresolved.json()["outcome"], "unresolved");
    assert!(unresolved.json()["device"].is_null());
    let listed = get(
        addr,
        "/api/v1/unresolved-observations/?source=openstack",
        &t,
    )
    .await
    .json();
    assert!(
        listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|u| u["key"] == "gpu-nobody"),
        "{listed}"
    );

    let cases: Vec<(Value, Refusal)> = vec![
        (
            json!({"source": "slurm", "device_id": id, "observed_at": now_rfc3339(), "conditions": [],
                   "ironic": {"provision_state": "active"}}),
            INVALID_ARGUMENT,
        ),
        (
            json!({"source": "frontend-fabric", "device_id": id, "observed_at": now_rfc3339(),
                   "conditions": [{"type": "FrontendPortsInCustomerVrf", "status": "False"}]}),
            INVALID_ARGUMENT,
        ),
        (
            json!({"source": "openstack", "device_id": id, "observed_at": now_rfc3339(), "conditions": [],
                   "ironic": {"provision_state": "active"}, "health": {}}),
            INVALID_ARGUMENT,
        ),
        (
            json!({"source": "openstack", "device_id": id, "device": {"kind": "name", "key": "x"},
                   "observed_at": now_rfc3339(), "conditions": []}),
            INVALID_ARGUMENT,
        ),
        (
            json!({"source": "nobody", "device_id": id, "observed_at": now_rfc3339(), "conditions": []}),
            INVALID_ARGUMENT,
        ),
    ];
    assert_refused(addr, "/api/v1/device-conditions/apply/", &t, cases).await;
    let triage = post(
        addr,
        "/api/v1/devices/triage/",
        &t,
        json!({"device_ids": [id, "dev_missing"], "in_triage": true}),
    )
    .await;
    assert_eq!(triage.code(), "NOT_FOUND");
    assert_eq!(
        env.device_field(&id, "in_triage").await,
        "false",
        "a refused triage list changes no device"
    );
    served.stop(env).await;
}

/// Seed 002: "Immutable via ordinary API/model updates; promote-to-managed
/// is an explicit audited operation": an inventory-only device becomes
/// managed with a reason kept in its lifecycle, once; an empty reason or a
/// managed device is refused and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_promote_to_managed_is_explicit_and_audited() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::with_hub(&env, &api_config()).await;
    let all = token(&env, Scope::ALL).await;
    // The inventory-only site's devices are inventory-only.
    let id = env.create_device("inv", "gpu-inv-01").await;
    let path = format!("/api/v1/devices/{id}/promote-to-managed");
    let version = || async { device(addr, &all, &id).await["version"].as_i64().unwrap() };
    let d = device(addr, &all, &id).await;
    assert_eq!(d["inventory_only"], true, "{d}");

    let v = version().await;
    let r = post(addr, &path, &all, json!({"version": v, "reason": " "})).await;
    r.assert_error(INVALID_ARGUMENT, "a blank reason");
    assert_eq!(version().await, v, "nothing changed");

    let writer = token(&env, &[Scope::DeviceWrite]).await;
    let r = post(
        addr,
        &path,
        &writer,
        json!({"version": v, "reason": "adopted by ops"}),
    )
    .await;
    assert_eq!(r.status, 403, "admin only: {}", r.body);

    let r = post(
        addr,
        &path,
        &all,
        json!({"version": v, "reason": "racked and cabled, CHG-4711"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["inventory_only"], false);
    let (value, cause): (String, String) = sqlx::query_as(
        "SELECT value, cause FROM device_lifecycle_events WHERE device_id = $1 AND kind = 'inventory_only' ORDER BY id DESC LIMIT 1",
    )
    .bind(&id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(value, "false");
    assert!(
        cause.starts_with("command:promote_to_managed:")
            && cause.ends_with(": racked and cabled, CHG-4711"),
        "{cause}"
    );

    let v = version().await;
    let r = post(addr, &path, &all, json!({"version": v, "reason": "again"})).await;
    r.assert_error(INVALID_STATE, "a managed device");
    served.stop(env).await;
}

/// Issue 19, seed 002 "UNI resource attribution": the Placement binding an
/// openstack snapshot carries is the device's `resource_bindings` row, with
/// `resolution_status` derived at read time; a failed resource keeps its
/// last-known row as stale; a snapshot observed longer ago than the source's
/// TTL is stale the moment it is stored; the list filters on it; and the
/// binding never moves operational or health status. A binding of another
/// source's resource, or an unknown resource, is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_resource_bindings_resolve_go_stale_and_never_move_status() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::with_hub(&env, &api_config()).await;
    let all = token(&env, Scope::ALL).await;
    let a = env.create_device("s1", "bind-a").await;
    let b = env.create_device("s1", "bind-b").await;
    let apply = |device: String, at: String, binding: Value| {
        let all = all.clone();
        async move {
            post(
                addr,
                "/api/v1/device-conditions/apply/",
                &all,
                json!({
                    "source": "openstack", "device_id": device, "observed_at": at,
                    "conditions": [
                        {"type": "IronicProvisionHealthy", "status": "True", "reason": "Active"},
                        {"type": "IronicMaintenance", "status": "False"},
                        {"type": "CustomerReady", "status": "True"},
                        {"type": "InstanceAllocated", "status": "False"},
                        {"type": "IronicAvailable", "status": "True"},
                        {"type": "InMaintenancePool", "status": "False"},
                    ],
                    "ironic": {"provision_state": "available", "power_state": "power off"},
                    "resource_bindings": [binding],
                }),
            )
            .await
        }
    };
    let detail = |id: String| {
        let all = all.clone();
        async move { device(addr, &all, &id).await }
    };
    let listed = |filter: &'static str| {
        let all = all.clone();
        async move {
            ids(get(
                addr,
                &format!("/api/v1/devices/?site=s1&resource_binding={filter}"),
                &all,
            )
            .await)
        }
    };

    let r = apply(
        a.clone(),
        now_rfc3339(),
        json!({"resource": "placement", "resource_id": "rp-a"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let d = detail(a.clone()).await;
    let bound = &d["resource_bindings"][0];
    assert_eq!(
        (
            &bound["resource"],
            &bound["resource_id"],
            &bound["resolution_status"],
            &bound["source"]
        ),
        (
            &json!("placement"),
            &json!("rp-a"),
            &json!("resolved"),
            &json!("openstack")
        ),
        "{d}"
    );
    assert!(bound["resolved_at"].is_string() && bound["failed_at"].is_null());
    let status = (d["operational_status"].clone(), d["health_status"].clone());

    // b: resolved, but observed an hour ago: past the 180 s TTL at once.
    let old = micros(Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let r = apply(
        b.clone(),
        old,
        json!({"resource": "placement", "resource_id": "rp-b"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        detail(b.clone()).await["resource_bindings"][0]["resolution_status"],
        "stale"
    );
    assert_eq!(listed("placement:resolved").await, vec![a.clone()]);
    assert_eq!(listed("placement:stale").await, vec![b.clone()]);

    // Placement fails for a: the row keeps rp-a, as stale, with the reason.
    let r = apply(
        a.clone(),
        now_rfc3339(),
        json!({"resource": "placement", "reason": "PlacementUnreachable", "message": "placement did not answer"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let d = detail(a.clone()).await;
    let stale = &d["resource_bindings"][0];
    assert_eq!(
        (
            &stale["resource_id"],
            &stale["resolution_status"],
            &stale["reason"]
        ),
        (
            &json!("rp-a"),
            &json!("stale"),
            &json!("PlacementUnreachable")
        ),
        "{d}"
    );
    assert_eq!(stale["resolved_at"], bound["resolved_at"]);
    assert!(stale["failed_at"].is_string());
    // "It does not replace the device's operational or health status."
    assert_eq!(
        (d["operational_status"].clone(), d["health_status"].clone()),
        status
    );
    let mut both = listed("placement:stale").await;
    both.sort();
    let mut want = vec![a.clone(), b.clone()];
    want.sort();
    assert_eq!(both, want);
    assert!(listed("placement:resolved").await.is_empty());

    // Refused: another source's resource, an unknown one, a bad filter.
    let r = post(
        addr,
        "/api/v1/device-conditions/apply/",
        &all,
        json!({"source": "slurm", "device_id": a, "observed_at": now_rfc3339(),
               "conditions": [], "resource_bindings": [{"resource": "placement", "resource_id": "x"}]}),
    )
    .await;
    r.assert_error(FORBIDDEN_SOURCE, "another source's resource");
    let r = apply(
        a.clone(),
        now_rfc3339(),
        json!({"resource": "nova", "resource_id": "x"}),
    )
    .await;
    r.assert_error(INVALID_ARGUMENT, "an unknown resource");
    assert_eq!(
        detail(a.clone()).await["resource_bindings"][0]["resource_id"],
        "rp-a",
        "nothing changed"
    );
    let r = get(addr, "/api/v1/devices/?resource_binding=placement", &all).await;
    r.assert_error(INVALID_ARGUMENT, "a filter without a status");
    served.stop(env).await;
}
