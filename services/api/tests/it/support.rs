//! The API tests' support: the test kit, and an API (with a hub when the
//! test needs one) started and stopped as one.

use std::net::SocketAddr;

use fleet_runtime::shutdown::ShutdownTrigger;
use serde_json::Value;
use tokio::task::JoinHandle;

pub use fleet_testkit::api::*;
pub use fleet_testkit::*;

/// An API, and the hub behind it when there is one, on a test environment.
pub struct Served {
    api: ShutdownTrigger,
    hub: Option<(ShutdownTrigger, JoinHandle<()>)>,
}

impl Served {
    /// An API with `config`, no hub.
    pub async fn api(env: &TestEnv, config: &fleet_api::Config) -> (SocketAddr, Served) {
        let (addr, api) = start_api(&env.common, config).await;
        (addr, Served { api, hub: None })
    }

    /// A hub, then an API with `config`.
    pub async fn with_hub(env: &TestEnv, config: &fleet_api::Config) -> (SocketAddr, Served) {
        let (_hub, trigger, task) = start_hub(env).await;
        let (addr, api) = start_api(&env.common, config).await;
        let hub = Some((trigger, task));
        (addr, Served { api, hub })
    }

    /// The API, then the hub; then the environment is removed.
    pub async fn stop(self, env: TestEnv) {
        self.api.trigger();
        if let Some((trigger, task)) = self.hub {
            stop(trigger, task).await;
        }
        env.cleanup().await;
    }
}

/// Every page of a keyset-paged list, walked with each `next_cursor` in
/// turn: `path` (with its query string) answers 200 on every page.
pub async fn pages(addr: SocketAddr, path: &str, token: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page_path = match &cursor {
            Some(c) => format!("{path}&cursor={c}"),
            None => path.to_string(),
        };
        let r = get(addr, &page_path, token).await;
        assert_eq!(r.status, 200, "{page_path}: {}", r.body);
        let page = r.json();
        cursor = page["next_cursor"].as_str().map(str::to_string);
        out.push(page);
        if cursor.is_none() {
            return out;
        }
    }
}

/// POSTs each body to `path`: each is refused as its case says.
pub async fn assert_refused(
    addr: SocketAddr,
    path: &str,
    token: &str,
    cases: impl IntoIterator<Item = (Value, Refusal)>,
) {
    for (body, refusal) in cases {
        let r = post(addr, path, token, body.clone()).await;
        r.assert_error(refusal, &body);
    }
}

/// The device's detail (`GET /api/v1/devices/{id}/`).
pub async fn device(addr: SocketAddr, token: &str, id: &str) -> Value {
    get(addr, &format!("/api/v1/devices/{id}/"), token)
        .await
        .json()
}

/// The string `field` of each object of the JSON array `items`.
pub fn field<'a>(items: &'a Value, field: &str) -> Vec<&'a str> {
    items
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {items}"))
        .iter()
        .map(|x| {
            x[field]
                .as_str()
                .unwrap_or_else(|| panic!("no {field} in {x}"))
        })
        .collect()
}

/// The rows of `table`.
pub async fn count(env: &TestEnv, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&env.pool)
        .await
        .unwrap()
}
