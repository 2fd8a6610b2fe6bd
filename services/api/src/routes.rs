//! The one route table: method, path, scope, handler. The router is built
//! from it and nothing else, every entry carries a scope (only `/healthz`,
//! `/readyz`, `/metrics` and the console's static assets under `/ui/` are
//! open), and a test walks it.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::routing::MethodRouter;
use axum::{middleware, Router};
use fleet_runtime::http::{self as ops_http, Ops};
use utoipa::openapi::path::Paths;
use utoipa::openapi::{RefOr, Schema};
use utoipa_axum::router::UtoipaMethodRouter;
use utoipa_axum::routes;

use crate::auth::{self, Scope};
use crate::error::ApiError;
use crate::{
    allocations, conditions, console, devices, drift, failure_codes, impairment, inventory, jobs,
    metrics, openapi, sites, standup, App,
};

/// One route: its method and path come from the handler's
/// `#[utoipa::path]` annotation (through `utoipa_axum::routes!`), so each is
/// written once; the table adds the scope.
pub struct Route {
    pub method: Method,
    pub path: String,
    pub scope: Scope,
    pub handler: MethodRouter<App>,
    /// The operation for the OpenAPI document.
    pub paths: Paths,
    /// The schemas its bodies refer to.
    pub schemas: Vec<(String, RefOr<Schema>)>,
}

fn r(scope: Scope, (schemas, paths, handler): UtoipaMethodRouter<App>) -> Route {
    let (path, item) = paths
        .paths
        .iter()
        .next()
        .expect("routes! gives the handler's one path");
    let method = [
        (Method::GET, item.get.is_some()),
        (Method::POST, item.post.is_some()),
        (Method::PUT, item.put.is_some()),
        (Method::DELETE, item.delete.is_some()),
        (Method::PATCH, item.patch.is_some()),
    ]
    .into_iter()
    .find_map(|(m, has)| has.then_some(m))
    .expect("the handler's annotation names a method");
    Route {
        method,
        path: path.clone(),
        scope,
        handler,
        paths: paths.clone(),
        schemas,
    }
}

/// Every API route. Add a route here and nowhere else.
pub fn table() -> Vec<Route> {
    use Scope as S;
    vec![
        r(S::DeviceRead, routes!(devices::list)),
        r(S::Admin, routes!(devices::create)),
        r(S::DeviceRead, routes!(devices::detail)),
        r(S::Admin, routes!(devices::delete)),
        r(S::DeviceRead, routes!(devices::lifecycle)),
        r(S::DeviceWrite, routes!(devices::cordon)),
        r(S::DeviceWrite, routes!(devices::uncordon)),
        r(S::DeviceWrite, routes!(devices::drain)),
        r(S::DeviceWrite, routes!(devices::taints)),
        r(S::DeviceWrite, routes!(devices::adopt)),
        r(S::DeviceWrite, routes!(devices::provision)),
        r(S::Admin, routes!(devices::revoke_identity)),
        r(S::Admin, routes!(devices::promote_to_managed)),
        r(S::DeviceWrite, routes!(devices::triage)),
        r(S::EnrollmentProofWrite, routes!(devices::enrollment_proof)),
        r(S::DeviceRead, routes!(conditions::list)),
        r(S::ConditionsWrite, routes!(conditions::write)),
        r(S::ConditionsWrite, routes!(conditions::apply)),
        r(S::OperationsWrite, routes!(impairment::create)),
        r(S::DeviceRead, routes!(impairment::list)),
        r(S::DeviceRead, routes!(impairment::detail)),
        r(S::OperationsWrite, routes!(impairment::clear)),
        r(S::JobsConfirm, routes!(impairment::confirm)),
        r(S::OperationsWrite, routes!(allocations::create)),
        r(S::DeviceRead, routes!(allocations::list)),
        r(S::DeviceRead, routes!(allocations::detail)),
        r(S::OperationsWrite, routes!(allocations::release)),
        r(S::DeviceRead, routes!(allocations::capacity)),
        r(S::DeviceRead, routes!(drift::list)),
        r(S::DeviceRead, routes!(inventory::list_sites)),
        r(S::DeviceRead, routes!(inventory::site)),
        r(S::Admin, routes!(inventory::create_site)),
        r(S::Admin, routes!(inventory::update_site)),
        r(S::Admin, routes!(inventory::delete_site)),
        r(S::DeviceRead, routes!(inventory::list_tenants)),
        r(S::DeviceRead, routes!(inventory::tenant)),
        r(S::Admin, routes!(inventory::create_tenant)),
        r(S::Admin, routes!(inventory::update_tenant)),
        r(S::Admin, routes!(inventory::delete_tenant)),
        r(S::DeviceRead, routes!(inventory::list_pools)),
        r(S::DeviceRead, routes!(inventory::pool)),
        r(S::Admin, routes!(inventory::create_pool)),
        r(S::Admin, routes!(inventory::update_pool)),
        r(S::Admin, routes!(inventory::delete_pool)),
        r(S::DeviceRead, routes!(sites::summary)),
        r(S::DeviceRead, routes!(sites::unresolved)),
        r(S::DeviceRead, routes!(standup::pipeline)),
        r(S::JobsWrite, routes!(jobs::create)),
        r(S::DeviceRead, routes!(jobs::list)),
        r(S::DeviceRead, routes!(jobs::detail)),
        r(S::JobsWrite, routes!(jobs::cancel)),
        r(S::JobsConfirm, routes!(jobs::confirm)),
        r(S::DeviceRead, routes!(failure_codes::list)),
        r(S::DeviceRead, routes!(openapi::serve)),
        r(S::DeviceRead, routes!(console::whoami)),
        r(S::DeviceRead, routes!(console::status)),
    ]
}

/// The open operational endpoints, outside the table on purpose.
pub const OPEN_PATHS: &[&str] = &["/healthz", "/readyz", "/metrics"];

/// The API router: the table with each route behind its scope, the open
/// operational endpoints, JSON 404s, request metrics and a body limit.
pub fn router(app: App) -> Router {
    let mut api: Router<App> = Router::new();
    for route in table() {
        let guard = middleware::from_fn_with_state((app.clone(), route.scope), auth::require);
        api = api.route(&route.path, route.handler.route_layer(guard));
    }
    let api = api
        .merge(crate::console::router())
        .fallback(|| async { ApiError::new(crate::error::Code::NotFound, "no such route") })
        .layer(middleware::from_fn_with_state(app.clone(), metrics::track))
        .layer(DefaultBodyLimit::max(app.config.max_body_bytes))
        .with_state(app.clone());
    let ready_app = app.clone();
    let ops = Ops {
        registry: app.metrics.registry.clone(),
        ready: Arc::new(move || {
            let a = ready_app.clone();
            Box::pin(async move { a.ready().await })
        }),
    };
    api.merge(ops_http::router(ops))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_no_duplicates_and_no_open_route() {
        let t = table();
        let mut seen = std::collections::BTreeSet::new();
        for r in &t {
            assert!(
                seen.insert((r.method.to_string(), r.path.clone())),
                "{} {} twice",
                r.method,
                r.path
            );
            assert!(!OPEN_PATHS.contains(&r.path.as_str()));
        }
        // Every mutation needs a write scope, never device:read.
        for r in t.iter().filter(|r| r.method != Method::GET) {
            assert_ne!(r.scope, Scope::DeviceRead, "{} {}", r.method, r.path);
        }
    }
}
