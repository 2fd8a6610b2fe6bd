//! Issue 16's first pieces: the failure-code taxonomy served by the API,
//! one enum in the OpenAPI document, the same codes the domain's taxonomy
//! and the latch helper use.

use fleet_api::Scope;
use fleet_domain::failure::{self, FailureCode};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_codes_are_served_with_meaning_owner_and_retry() {
    let env = TestEnv::new().await;
    let (addr, served) = Served::api(&env, &Default::default()).await;
    let t = token(&env, &[Scope::DeviceRead]).await;

    let r = get(addr, "/api/v1/failure-codes/", &t).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let body = r.json();
    let items = body["items"].as_array().unwrap();
    assert_eq!(items.len(), FailureCode::ALL.len());
    for (item, entry) in items.iter().zip(failure::taxonomy()) {
        assert_eq!(item["code"], entry.code.as_str());
        assert_eq!(item["meaning"], entry.meaning);
        assert_eq!(item["triage_owner"], entry.owner.as_str());
        assert_eq!(item["retryable"], entry.retryable);
    }
    let unavailable = items
        .iter()
        .find(|i| i["code"] == "ENROLLMENT_PROOF_UNAVAILABLE")
        .unwrap();
    assert_eq!(unavailable["retryable"], true);
    assert_eq!(unavailable["triage_owner"], "fleet_manager");

    // One enum in the OpenAPI document, the entries referring to it.
    let r = get(addr, "/api/v1/openapi.json", &t).await;
    let doc = r.json();
    let codes: Vec<&str> = doc["components"]["schemas"]["FailureCode"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let want: Vec<&str> = FailureCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(codes, want);
    assert_eq!(
        doc["components"]["schemas"]["FailureCodeEntry"]["properties"]["code"]["$ref"],
        "#/components/schemas/FailureCode"
    );
    // The latch helper's codes are the taxonomy's.
    for latch in [
        fleet_latch::Latch::FrontendVrf,
        fleet_latch::Latch::BackendVrf,
        fleet_latch::Latch::NvlinkPartition,
    ] {
        assert!(want.contains(&latch.failure_code().as_str()));
    }
    // Without a token: 401, like every route of the table.
    let r = http_raw(addr, "GET", "/api/v1/failure-codes/", None, None, b"").await;
    assert_eq!(r.status, 401);

    served.stop(env).await;
}
