//! The one route table: method, path, scope, handler. The router is built
//! from it and nothing else, every entry carries a scope (only `/healthz`,
//! `/readyz` and `/metrics` are open), and a test walks it.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::routing::{delete, get, post, MethodRouter};
use axum::{middleware, Router};
use fleet_runtime::http::{self as ops_http, Ops};

use crate::auth::{self, Scope};
use crate::error::ApiError;
use crate::{
    allocations, conditions, devices, drift, failure_codes, impairment, metrics, openapi, sites,
    App,
};

pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub scope: Scope,
    pub handler: MethodRouter<App>,
}

fn r(method: Method, path: &'static str, scope: Scope, handler: MethodRouter<App>) -> Route {
    Route {
        method,
        path,
        scope,
        handler,
    }
}

/// Every API route. Add a route here and nowhere else.
pub fn table() -> Vec<Route> {
    use Method as M;
    use Scope as S;
    vec![
        r(
            M::GET,
            "/api/v1/devices/",
            S::DeviceRead,
            get(devices::list),
        ),
        r(
            M::GET,
            "/api/v1/devices/{id}/",
            S::DeviceRead,
            get(devices::detail),
        ),
        r(
            M::DELETE,
            "/api/v1/devices/{id}/",
            S::Admin,
            delete(devices::delete),
        ),
        r(
            M::GET,
            "/api/v1/devices/{id}/lifecycle-events/",
            S::DeviceRead,
            get(devices::lifecycle),
        ),
        r(
            M::POST,
            "/api/v1/devices/{id}/cordon",
            S::DeviceWrite,
            post(devices::cordon),
        ),
        r(
            M::POST,
            "/api/v1/devices/{id}/uncordon",
            S::DeviceWrite,
            post(devices::uncordon),
        ),
        r(
            M::POST,
            "/api/v1/devices/{id}/drain",
            S::DeviceWrite,
            post(devices::drain),
        ),
        r(
            M::POST,
            "/api/v1/devices/{id}/taints",
            S::DeviceWrite,
            post(devices::taints),
        ),
        r(
            M::POST,
            "/api/v1/devices/{id}/adopt",
            S::DeviceWrite,
            post(devices::adopt),
        ),
        r(
            M::POST,
            "/api/v1/devices/{id}/provision",
            S::DeviceWrite,
            post(devices::provision),
        ),
        r(
            M::POST,
            "/api/v1/devices/{id}/revoke-identity",
            S::Admin,
            post(devices::revoke_identity),
        ),
        r(
            M::POST,
            "/api/v1/devices/triage/",
            S::DeviceWrite,
            post(devices::triage),
        ),
        r(
            M::POST,
            "/api/v1/devices/{id}/enrollment-proof",
            S::EnrollmentProofWrite,
            post(devices::enrollment_proof),
        ),
        r(
            M::GET,
            "/api/v1/device-conditions/",
            S::DeviceRead,
            get(conditions::list),
        ),
        r(
            M::POST,
            "/api/v1/device-conditions/",
            S::ConditionsWrite,
            post(conditions::write),
        ),
        r(
            M::POST,
            "/api/v1/device-conditions/apply/",
            S::ConditionsWrite,
            post(conditions::apply),
        ),
        r(
            M::POST,
            "/api/v1/operations/impairment-events/",
            S::OperationsWrite,
            post(impairment::create),
        ),
        r(
            M::GET,
            "/api/v1/operations/impairment-events/",
            S::DeviceRead,
            get(impairment::list),
        ),
        r(
            M::GET,
            "/api/v1/operations/impairment-events/{id}/",
            S::DeviceRead,
            get(impairment::detail),
        ),
        r(
            M::POST,
            "/api/v1/operations/impairment-events/{id}/clear",
            S::OperationsWrite,
            post(impairment::clear),
        ),
        r(
            M::POST,
            "/api/v1/allocations/",
            S::OperationsWrite,
            post(allocations::create),
        ),
        r(
            M::GET,
            "/api/v1/allocations/",
            S::DeviceRead,
            get(allocations::list),
        ),
        r(
            M::GET,
            "/api/v1/allocations/{id}/",
            S::DeviceRead,
            get(allocations::detail),
        ),
        r(
            M::POST,
            "/api/v1/allocations/{id}/release",
            S::OperationsWrite,
            post(allocations::release),
        ),
        r(
            M::GET,
            "/api/v1/pools/{id}/capacity",
            S::DeviceRead,
            get(allocations::capacity),
        ),
        r(
            M::GET,
            "/api/v1/latch-drift/",
            S::DeviceRead,
            get(drift::list),
        ),
        r(
            M::GET,
            "/api/v1/sites/{id}/summary",
            S::DeviceRead,
            get(sites::summary),
        ),
        r(
            M::GET,
            "/api/v1/unresolved-observations/",
            S::DeviceRead,
            get(sites::unresolved),
        ),
        r(
            M::GET,
            "/api/v1/failure-codes/",
            S::DeviceRead,
            get(failure_codes::list),
        ),
        r(
            M::GET,
            "/api/v1/openapi.json",
            S::DeviceRead,
            get(openapi::serve),
        ),
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
        api = api.route(route.path, route.handler.route_layer(guard));
    }
    let api = api
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
                seen.insert((r.method.to_string(), r.path)),
                "{} {} twice",
                r.method,
                r.path
            );
            assert!(!OPEN_PATHS.contains(&r.path));
        }
        // Every mutation needs a write scope, never device:read.
        for r in t.iter().filter(|r| r.method != Method::GET) {
            assert_ne!(r.scope, Scope::DeviceRead, "{} {}", r.method, r.path);
        }
    }
}
