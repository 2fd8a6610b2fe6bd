//! Allocations, pool capacity and latch drift through the operator API,
//! against the real placer, hub, NATS and PostgreSQL: booking moves GPUs
//! between capacity buckets and the API's numbers are the placer's;
//! refusals come back typed; a placer that does not answer is 503
//! `UNAVAILABLE`; latch drift listed.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use chrono::Utc;
use fleet_api::Scope::{self, DeviceRead, DeviceWrite, OperationsWrite};
use fleet_domain::drift::PAIRS;
use serde_json::{json, Value};

use crate::support::*;

async fn capacity(addr: SocketAddr, t: &str, pool: &str) -> Value {
    let r = get(addr, &format!("/api/v1/pools/{pool}/capacity"), t).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn buckets(c: &Value) -> [i64; 9] {
    [
        "total",
        "schedulable_available",
        "schedulable_allocated",
        "excluded",
        "maintenance",
        "provisioning",
        "unreachable",
        "unhealthy",
        "devices",
    ]
    .map(|k| c[k].as_i64().unwrap_or_else(|| panic!("{k} in {c}")))
}

/// The placer's own answer, field by field.
fn placer_buckets(c: &fleet_placer_client::model::Capacity) -> [i64; 9] {
    [
        c.total,
        c.schedulable_available,
        c.schedulable_allocated,
        c.excluded,
        c.maintenance,
        c.provisioning,
        c.unreachable,
        c.unhealthy,
        c.devices,
    ]
}

async fn allocate(addr: SocketAddr, t: &str, body: Value) -> Resp {
    post(addr, "/api/v1/allocations/", t, body).await
}

/// Book, watch capacity move, release; every refusal typed; the API's
/// numbers equal the placer's view and PostgreSQL's; a cordon through the
/// API moves a device's GPUs to `maintenance` in the capacity the API
/// answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocations_book_capacity_release_and_refusals() {
    let env = TestEnv::new().await;
    seed_pool(&env, "p1", 4, 8).await;
    let (hub, hub_trigger, hub_task) = start_hub(&env).await;
    let (placer, placer_trigger, placer_task) = start_placer(&env).await;
    let (addr, api_trigger) = start_api(&env.common, &api_config()).await;
    let ops = token(&env, &[DeviceRead, OperationsWrite, DeviceWrite]).await;
    let read = token(&env, &[Scope::DeviceRead]).await;

    let c = capacity(addr, &read, "p1").await;
    assert_eq!(buckets(&c), [32, 32, 0, 0, 0, 0, 0, 0, 4], "{c}");

    // Book 6 GPUs: partly used devices are filled first, so one device
    // holds them.
    let r = allocate(
        addr,
        &ops,
        json!({"tenant_id": "t1", "pool_id": "p1", "gpus": 6}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let a = r.json();
    let id = a["id"].as_str().unwrap().to_string();
    assert_eq!(a["status"], "active");
    assert_eq!(a["gpus"], 6);
    assert_eq!(a["atoms"].as_array().unwrap().len(), 6);
    let c = capacity(addr, &read, "p1").await;
    assert_eq!(buckets(&c), [32, 26, 6, 0, 0, 0, 0, 0, 4], "{c}");
    // The same numbers as the placer answers itself and as PostgreSQL has.
    let own = client(&env).capacity("p1").await.unwrap();
    assert_eq!(buckets(&c), placer_buckets(&own));
    let db = placer.capacity_from_db("p1").await.unwrap();
    assert_eq!(buckets(&c), placer_buckets(&db));

    // Detail reads what was booked.
    let r = get(addr, &format!("/api/v1/allocations/{id}/"), &read).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["atoms"], a["atoms"]);

    // The idempotency key: the same request_id answers the first booking.
    let keyed = json!({"tenant_id": "t1", "pool_id": "p1", "gpus": 2, "request_id": "job-42"});
    let first = allocate(addr, &ops, keyed.clone()).await.json();
    let again = allocate(addr, &ops, keyed).await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(again.json()["id"], first["id"]);
    let c = capacity(addr, &read, "p1").await;
    assert_eq!(buckets(&c)[..3], [32, 24, 8], "{c}");

    // Typed refusals, and nothing booked by any of them.
    let cases: Vec<(Value, Refusal)> = vec![
        (
            json!({"tenant_id": "t1", "pool_id": "p1", "gpus": 0}),
            INVALID_ARGUMENT,
        ),
        (
            json!({"tenant_id": "t1", "pool_id": "p1", "gpus": -1}),
            INVALID_ARGUMENT,
        ),
        (
            json!({"tenant_id": "", "pool_id": "p1", "gpus": 1}),
            INVALID_ARGUMENT,
        ),
        (
            json!({"tenant_id": "t1", "pool_id": "p1", "gpus": 1, "colour": "red"}),
            INVALID_ARGUMENT,
        ),
        (
            json!({"tenant_id": "t1", "pool_id": "p1"}),
            INVALID_ARGUMENT,
        ),
        (
            json!({"tenant_id": "t1", "pool_id": "p1", "gpus": 25}),
            INSUFFICIENT_CAPACITY,
        ),
        (
            json!({"tenant_id": "t1", "pool_id": "p1", "gpus": 9, "same_device": true}),
            INSUFFICIENT_CAPACITY,
        ),
        (
            json!({"tenant_id": "t1", "pool_id": "nope", "gpus": 1}),
            NOT_FOUND,
        ),
        (
            json!({"tenant_id": "nobody", "pool_id": "p1", "gpus": 1}),
            NOT_FOUND,
        ),
    ];
    assert_refused(addr, "/api/v1/allocations/", &ops, cases).await;
    let r = http_raw(
        addr,
        "POST",
        "/api/v1/allocations/",
        Some(&ops),
        Some("text/plain"),
        b"gpus=1",
    )
    .await;
    r.assert_error(INVALID_ARGUMENT, "the answer");
    let c = capacity(addr, &read, "p1").await;
    assert_eq!(
        buckets(&c)[..3],
        [32, 24, 8],
        "refusals booked nothing: {c}"
    );

    // Scopes: booking and releasing need operations:write.
    let r = allocate(
        addr,
        &read,
        json!({"tenant_id": "t1", "pool_id": "p1", "gpus": 1}),
    )
    .await;
    r.assert_error(FORBIDDEN, "the answer");
    let r = post(
        addr,
        &format!("/api/v1/allocations/{id}/release"),
        &read,
        json!({}),
    )
    .await;
    r.assert_error(FORBIDDEN, "the answer");
    let r = http_raw(addr, "GET", "/api/v1/pools/p1/capacity", None, None, b"").await;
    r.assert_error(UNAUTHENTICATED, "the answer");

    // Reads that refuse.
    for (path, refusal) in [
        ("/api/v1/pools/nope/capacity", NOT_FOUND),
        ("/api/v1/allocations/alloc_nope/", NOT_FOUND),
        ("/api/v1/allocations/?status=gone", INVALID_ARGUMENT),
        ("/api/v1/allocations/?cursor=zz", INVALID_ARGUMENT),
        ("/api/v1/allocations/?limit=0", INVALID_ARGUMENT),
        ("/api/v1/allocations/?owner=t1", INVALID_ARGUMENT),
    ] {
        let r = get(addr, path, &read).await;
        r.assert_error(refusal, &path);
    }

    // Release: another tenant's is NOT_FOUND and changes nothing; the
    // owner's frees the GPUs; twice answers the released allocation.
    let release = |q: &'static str| {
        let path = format!("/api/v1/allocations/{id}/release{q}");
        let ops = ops.clone();
        async move { http_raw(addr, "POST", &path, Some(&ops), None, b"").await }
    };
    let r = release("?tenant_id=t2").await;
    r.assert_error(NOT_FOUND, "the answer");
    let r = release("?tenant_id=t1").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let released = r.json();
    assert_eq!(released["status"], "released");
    assert!(released["released_at"].is_string());
    let r = release("").await;
    assert_eq!(
        (r.status, r.json()["status"].clone()),
        (200, json!("released"))
    );
    let c = capacity(addr, &read, "p1").await;
    assert_eq!(buckets(&c), [32, 30, 2, 0, 0, 0, 0, 0, 4], "{c}");
    let r = http_raw(
        addr,
        "POST",
        "/api/v1/allocations/alloc_nope/release",
        Some(&ops),
        None,
        b"",
    )
    .await;
    r.assert_error(NOT_FOUND, "the answer");

    // The list: filters, and a keyset walk that serves each row once.
    let mut ids: BTreeSet<String> = [id.clone(), first["id"].as_str().unwrap().to_string()].into();
    for _ in 0..3 {
        let r = allocate(
            addr,
            &ops,
            json!({"tenant_id": "t1", "pool_id": "p1", "gpus": 1}),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.body);
        ids.insert(r.json()["id"].as_str().unwrap().to_string());
    }
    let mut seen = Vec::new();
    for page in pages(addr, "/api/v1/allocations/?pool=p1&limit=2", &read).await {
        seen.extend(field(&page["items"], "id").into_iter().map(String::from));
    }
    let mut newest_first = seen.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, newest_first);
    assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), ids);
    assert_eq!(seen.len(), 5);
    let page = get(
        addr,
        "/api/v1/allocations/?status=released&tenant=t1",
        &read,
    )
    .await
    .json();
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["id"], json!(id));
    assert_eq!(items[0]["atoms"], a["atoms"], "the list carries the atoms");
    let page = get(addr, "/api/v1/allocations/?tenant=t2", &read)
        .await
        .json();
    assert_eq!(page["items"], json!([]));

    // A cordon through the API: the hub's schedulable event moves the
    // device's GPUs to maintenance in what the API answers.
    let dev = "dev_p1_00003";
    let d = device(addr, &read, dev).await;
    let r = post(
        addr,
        &format!("/api/v1/devices/{dev}/cordon"),
        &ops,
        json!({"version": d["version"], "reason": "bad DIMM"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let c = eventually("the cordoned device's GPUs in maintenance", || async {
        let c = capacity(addr, &read, "p1").await;
        (c["maintenance"] == json!(8)).then_some(c)
    })
    .await;
    let db = placer.capacity_from_db("p1").await.unwrap();
    assert_eq!(buckets(&c), placer_buckets(&db), "{c}");
    assert_eq!(buckets(&c)[0], 32);

    api_trigger.trigger();
    stop(placer_trigger, placer_task).await;
    stop(hub_trigger, hub_task).await;
    drop(hub);
    env.cleanup().await;
}

/// Without a placer answering, booking, releasing and capacity are 503
/// `UNAVAILABLE` (never a number from elsewhere); reading and listing the
/// placer's tables keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocations_unavailable_when_the_placer_is_down() {
    let env = TestEnv::new().await;
    seed_pool(&env, "p1", 2, 8).await;
    let (addr, served) = Served::api(&env, &api_config()).await;
    let t = token(&env, &[Scope::DeviceRead, Scope::OperationsWrite]).await;

    // Never started.
    let r = allocate(
        addr,
        &t,
        json!({"tenant_id": "t1", "pool_id": "p1", "gpus": 1}),
    )
    .await;
    r.assert_error(UNAVAILABLE, "the answer");
    assert!(
        !r.body.contains("no responders"),
        "transport text leaked: {}",
        r.body
    );
    let r = get(addr, "/api/v1/pools/p1/capacity", &t).await;
    r.assert_error(UNAVAILABLE, "the answer");
    assert_eq!(count(&env, "allocations").await, 0);

    // Up: it books. Stopped: 503 again, while reads answer.
    let (_placer, placer_trigger, placer_task) = start_placer(&env).await;
    let r = allocate(
        addr,
        &t,
        json!({"tenant_id": "t1", "pool_id": "p1", "gpus": 3}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.json()["id"].as_str().unwrap().to_string();
    stop(placer_trigger, placer_task).await;
    let r = get(addr, "/api/v1/pools/p1/capacity", &t).await;
    r.assert_error(UNAVAILABLE, "the answer");
    let r = http_raw(
        addr,
        "POST",
        &format!("/api/v1/allocations/{id}/release"),
        Some(&t),
        None,
        b"",
    )
    .await;
    r.assert_error(UNAVAILABLE, "the answer");
    // No placer subscribed: the request went nowhere, and the API says so.
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no placer is running; the request was not sent and nothing was applied"),
        "{}",
        r.body
    );
    let r = get(addr, &format!("/api/v1/allocations/{id}/"), &t).await;
    assert_eq!(
        (r.status, r.json()["status"].clone()),
        (200, json!("active"))
    );
    let r = get(addr, "/api/v1/allocations/", &t).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["items"].as_array().unwrap().len(), 1);

    served.stop(env).await;
}

/// `GET /api/v1/latch-drift/`: the drifting (device, latch) pairs the
/// domain's rule names, filtered and keyset-paged, with the hub's per-source
/// TTLs deciding freshness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latch_drift_list_through_the_api() {
    let env = TestEnv::new().await;
    let now = micros(Utc::now());
    let old = now - chrono::Duration::minutes(30);
    // Per pair: unguarded (no latch, observed True), stale_guard (latch
    // True, observed False), agreeing (latch False, observed False), no
    // verdict (observed True but 30 min old), and one unguarded in s2.
    let mut want: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut slow_source = String::new();
    for (i, p) in PAIRS.iter().enumerate() {
        let source = p.observed.entry().owners[0].as_str().to_string();
        if i == 0 {
            slow_source = source.clone();
        }
        for (k, site, latch, observed, at, drift) in [
            ("a", "s1", None, "True", now, Some("unguarded")),
            ("b", "s1", Some("True"), "False", now, Some("stale_guard")),
            ("c", "s1", Some("False"), "False", now, None),
            ("d", "s1", None, "True", old, None),
            ("e", "s2", None, "True", now, Some("unguarded")),
        ] {
            let id = format!("dev_{k}{i}");
            sqlx::query("INSERT INTO devices (id, name, site_id) VALUES ($1, $1, $2)")
                .bind(&id)
                .bind(site)
                .execute(&env.pool)
                .await
                .unwrap();
            if let Some(l) = latch {
                env.insert_condition(&id, p.latch.as_str(), l, "m", &source, true, old)
                    .await;
            }
            env.insert_condition(&id, p.observed.as_str(), observed, "m", &source, false, at)
                .await;
            if let Some(d) = drift {
                want.insert((id, p.latch.as_str().to_string(), d.to_string()));
            }
        }
    }
    assert_eq!(want.len(), 9);

    // The first pair's source gets an hour of TTL: its 30-minute-old
    // observation is fresh, so that device drifts too.
    let mut common = env.common.clone();
    common
        .freshness
        .ttl
        .insert(slow_source, Duration::from_secs(3600));
    let (addr, api_trigger) = start_api(&common, &api_config()).await;
    let t = token(&env, &[Scope::DeviceRead]).await;
    want.insert((
        "dev_d0".into(),
        PAIRS[0].latch.as_str().into(),
        "unguarded".into(),
    ));

    let walk = |q: &'static str| {
        let t = t.clone();
        async move {
            let mut got = Vec::new();
            for page in pages(addr, &format!("/api/v1/latch-drift/?limit=3{q}"), &t).await {
                for x in page["items"].as_array().unwrap() {
                    got.push((
                        x["device_id"].as_str().unwrap().to_string(),
                        x["latch_type"].as_str().unwrap().to_string(),
                        x["drift"].as_str().unwrap().to_string(),
                    ));
                }
            }
            got
        }
    };
    let all = walk("").await;
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(all, sorted, "ordered by device, then latch");
    assert_eq!(all.iter().cloned().collect::<BTreeSet<_>>(), want);
    assert_eq!(all.len(), want.len(), "each pair once");

    let s2 = walk("&site=s2").await;
    assert_eq!(s2.len(), 3);
    assert!(s2.iter().all(|(d, _, _)| d.starts_with("dev_e")));
    let stale = walk("&drift=stale_guard").await;
    assert_eq!(stale.len(), 3);
    assert!(stale
        .iter()
        .all(|(d, _, k)| d.starts_with("dev_b") && k == "stale_guard"));
    let latch = PAIRS[1].latch.as_str();
    let r = get(
        addr,
        &format!("/api/v1/latch-drift/?latch={latch}&drift=unguarded"),
        &t,
    )
    .await;
    let items = r.json()["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 2, "{}", r.body);
    let one = &items[0];
    assert_eq!(one["device_id"], "dev_a1");
    assert_eq!(one["latch_status"], Value::Null);
    assert_eq!(one["observed_type"], PAIRS[1].observed.as_str());
    assert_eq!(one["observed_status"], "True");
    assert_eq!(one["observed_message"], "m");

    for (q, code) in [
        ("?latch=GpuHealth", "INVALID_ARGUMENT"),
        ("?latch=nonsense", "INVALID_ARGUMENT"),
        ("?drift=sideways", "INVALID_ARGUMENT"),
        ("?cursor=00", "INVALID_ARGUMENT"),
        ("?limit=100000", "INVALID_ARGUMENT"),
    ] {
        let r = get(addr, &format!("/api/v1/latch-drift/{q}"), &t).await;
        r.assert_error((400, code), &q);
    }
    let r = http_raw(addr, "GET", "/api/v1/latch-drift/", None, None, b"").await;
    assert_eq!(r.status, 401);

    api_trigger.trigger();
    env.cleanup().await;
}
