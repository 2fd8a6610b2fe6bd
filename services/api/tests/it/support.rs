//! The API tests' support: the test kit, and an API (with a hub when the
//! test needs one) started and stopped as one.

use std::net::SocketAddr;

use fleet_runtime::shutdown::ShutdownTrigger;
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
