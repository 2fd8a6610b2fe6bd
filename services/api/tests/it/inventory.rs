//! Sites, tenants, pools and their hardware profiles set up through the
//! API only (hub inventory commands): typed refusals that change nothing,
//! `inventory_only` fixed at create and inherited by the site's devices,
//! deletes refused while something refers to the row.

use fleet_api::Scope;
use serde_json::{json, Value};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_set_up_sites_tenants_and_pools_through_the_api() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::with_hub(&env, &Default::default()).await;
    let admin = token(&env, &[Scope::Admin, Scope::DeviceRead]).await;
    let reader = token(&env, &[Scope::DeviceRead]).await;
    let before = count(&env, "sites").await;

    // A site: created once, its inventory_only fixed for its life.
    let r = post(
        addr,
        "/api/v1/sites/",
        &admin,
        json!({"id": "dc9", "name": "site nine", "inventory_only": true}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let s = r.json();
    assert_eq!(
        (
            s["inventory_only"].as_bool(),
            s["placement_enabled"].as_bool(),
            s["backend_vrf_flip_allowed"].as_bool()
        ),
        (Some(true), Some(true), Some(false))
    );
    let r = post(
        addr,
        "/api/v1/sites/",
        &admin,
        json!({"id": "dc9", "name": "again"}),
    )
    .await;
    r.assert_error(CONFLICT, "the answer");
    for (body, why) in [
        (
            json!({"id": "dc.9", "name": "n"}),
            "a dot is a subject separator",
        ),
        (json!({"id": "dc10", "name": "  "}), "a blank name"),
        (json!({"id": "", "name": "n"}), "no id"),
        (
            json!({"id": "dc10", "name": "n", "colour": "red"}),
            "an unknown field",
        ),
    ] {
        let r = post(addr, "/api/v1/sites/", &admin, body).await;
        r.assert_error(INVALID_ARGUMENT, &why);
    }
    let r = post(
        addr,
        "/api/v1/sites/",
        &reader,
        json!({"id": "dc11", "name": "n"}),
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        count(&env, "sites").await,
        before + 1,
        "refusals created nothing"
    );

    let r = send(
        addr,
        "PATCH",
        "/api/v1/sites/dc9/",
        &admin,
        json!({"inventory_only": false}),
    )
    .await;
    r.assert_error(INVALID_ARGUMENT, "the answer");
    assert!(r.body.contains("immutable"), "{}", r.body);
    let r = send(
        addr,
        "PATCH",
        "/api/v1/sites/dc9/",
        &admin,
        json!({"name": "Site Nine", "placement_enabled": false, "backend_vrf_flip_allowed": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let s = get(addr, "/api/v1/sites/dc9/", &reader).await.json();
    assert_eq!(
        (
            s["name"].as_str(),
            s["inventory_only"].as_bool(),
            s["placement_enabled"].as_bool(),
            s["backend_vrf_flip_allowed"].as_bool()
        ),
        (Some("Site Nine"), Some(true), Some(false), Some(true))
    );
    let r = send(
        addr,
        "PATCH",
        "/api/v1/sites/nowhere/",
        &admin,
        json!({"name": "x"}),
    )
    .await;
    r.assert_error(NOT_FOUND, "the answer");

    // Tenants and pools.
    let r = post(
        addr,
        "/api/v1/tenants/",
        &admin,
        json!({"id": "t9", "name": "tenant nine"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = send(
        addr,
        "PATCH",
        "/api/v1/tenants/t9/",
        &admin,
        json!({"name": "Tenant Nine"}),
    )
    .await;
    assert_eq!(r.json()["name"], "Tenant Nine");
    let pool = json!({"id": "p9", "site_id": "dc9", "kind": "metal-dedicated", "owner_tenant_id": "t9",
        "hardware_profile": {"gpu_count": 8, "gpu_model": "NVIDIA H100 80GB HBM3"}});
    let r = post(addr, "/api/v1/pools/", &admin, pool).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.json()["hardware_profile"]["gpu_count"], 8);
    let cases = [
        (
            json!({"id": "p10", "site_id": "dc9", "kind": "gpu"}),
            INVALID_ARGUMENT,
        ),
        (
            json!({"id": "p10", "site_id": "nowhere", "kind": "metal-host"}),
            NOT_FOUND,
        ),
        (
            json!({"id": "p10", "site_id": "dc9", "kind": "metal-host", "hardware_profile": {"gpu_count": 300}}),
            INVALID_ARGUMENT,
        ),
        (
            json!({"id": "p9", "site_id": "dc9", "kind": "metal-host"}),
            CONFLICT,
        ),
    ];
    assert_refused(addr, "/api/v1/pools/", &admin, cases).await;
    let r = get(addr, "/api/v1/pools/p10/", &reader).await;
    assert_eq!(r.status, 404, "a refused pool left nothing");
    let page = get(addr, "/api/v1/pools/?site=dc9", &reader).await.json();
    assert_eq!(field(&page["items"], "id"), ["p9"]);
    let r = send(
        addr,
        "PATCH",
        "/api/v1/pools/p9/",
        &admin,
        json!({"hardware_profile": {"gpu_count": -1}}),
    )
    .await;
    assert_eq!(r.status, 400);
    let r = send(
        addr,
        "PATCH",
        "/api/v1/pools/p9/",
        &admin,
        json!({"clear_hardware_profile": true, "owner_tenant_id": ""}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["hardware_profile"].is_null() && r.json()["owner_tenant_id"].is_null());
    let r = send(
        addr,
        "PATCH",
        "/api/v1/pools/p9/",
        &admin,
        json!({"owner_tenant_id": "t9", "hardware_profile": {"gpu_count": 4}}),
    )
    .await;
    assert_eq!(
        (
            r.json()["owner_tenant_id"].as_str(),
            r.json()["hardware_profile"]["gpu_count"].as_i64()
        ),
        (Some("t9"), Some(4))
    );

    // A device created at the inventory-only site is inventory-only,
    // whatever its writer said, and takes its role from the pool's kind.
    let reply = env
        .command(
            "create_device",
            0,
            fleet_proto::v1::hub_command::Command::CreateDevice(fleet_proto::v1::CreateDevice {
                site: "dc9".into(),
                name: "gpu-dc9-1".into(),
                pool_id: "p9".into(),
                ..Default::default()
            }),
        )
        .await;
    assert!(reply.error.is_none(), "{:?}", reply.error);
    let id = device_of(&reply).id;
    let d = device(addr, &reader, &id).await;
    assert_eq!(
        (d["inventory_only"].as_bool(), d["role"].as_str()),
        (Some(true), Some("dedicated"))
    );

    // Deletes: refused while something refers to the row.
    for (path, why) in [
        ("/api/v1/tenants/t9/", "owns pool p9"),
        ("/api/v1/pools/p9/", "device in it"),
        ("/api/v1/sites/dc9/", "has pools and devices"),
    ] {
        let r = send(addr, "DELETE", path, &admin, json!({})).await;
        r.assert_error(INVALID_STATE, format!("{path} {why}"));
    }
    let r = post(
        addr,
        "/api/v1/sites/",
        &admin,
        json!({"id": "dc12", "name": "empty"}),
    )
    .await;
    assert_eq!(r.status, 201);
    let r = send(addr, "DELETE", "/api/v1/sites/dc12/", &admin, json!({})).await;
    assert_eq!((r.status, r.json()["id"].as_str()), (200, Some("dc12")));
    let r = send(addr, "DELETE", "/api/v1/sites/dc12/", &admin, json!({})).await;
    assert_eq!(r.status, 404);
    let r = get(addr, "/api/v1/sites/?limit=1", &reader).await.json();
    assert_eq!(r["items"].as_array().unwrap().len(), 1);
    assert!(r["next_cursor"].is_string());

    served.stop(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_are_created_through_the_api_with_typed_refusals() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::with_hub(&env, &Default::default()).await;
    let admin = token(&env, &[Scope::Admin, Scope::DeviceRead]).await;
    let writer = token(&env, &[Scope::DeviceWrite, Scope::DeviceRead]).await;

    let body = json!({"site_id": "s1", "name": "gpu-api-01", "serial": "SN-API-01", "netbox_id": 77,
        "rack": "r1", "device_class": "cpu_baremetal", "inventory_status": "active",
        "labels": {"row": "a"}});
    let r = post(addr, "/api/v1/devices/", &admin, body.clone()).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let d = r.json();
    let id = d["id"].as_str().unwrap().to_string();
    assert_eq!(
        (d["site_id"].as_str(), d["inventory_status"].as_str()),
        (Some("s1"), Some("active"))
    );
    let detail = device(addr, &admin, &id).await;
    assert_eq!(detail["serial"], "SN-API-01");
    assert_eq!(detail["netbox_id"], 77);
    assert_eq!(detail["device_class"], "cpu_baremetal");

    // A second device, but for one field.
    let with = |field: Value| {
        let mut d = json!({"site_id": "s1", "name": "gpu-api-02"});
        d.as_object_mut()
            .unwrap()
            .extend(field.as_object().unwrap().clone());
        d
    };
    let cases = [
        (body.clone(), CONFLICT),
        (with(json!({"device_class": "toaster"})), INVALID_ARGUMENT),
        (with(json!({"provision_state": "flying"})), INVALID_ARGUMENT),
        (with(json!({"name": "  "})), INVALID_ARGUMENT),
        (with(json!({"serial": "x".repeat(600)})), INVALID_ARGUMENT),
        (with(json!({"netbox_id": 0})), INVALID_ARGUMENT),
        (with(json!({"owner": "t1"})), INVALID_ARGUMENT),
        (with(json!({"site_id": "nowhere"})), NOT_FOUND),
        (with(json!({"pool_id": "nopool"})), NOT_FOUND),
    ];
    assert_refused(addr, "/api/v1/devices/", &admin, cases).await;
    let r = post(
        addr,
        "/api/v1/devices/",
        &writer,
        json!({"site_id": "s1", "name": "gpu-api-03"}),
    )
    .await;
    assert_eq!(r.status, 403, "creating devices is an admin's");
    assert_eq!(
        count(&env, "devices").await,
        1,
        "every refusal created nothing"
    );

    served.stop(env).await;
}
