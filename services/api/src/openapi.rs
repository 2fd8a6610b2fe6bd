//! The OpenAPI document, generated from the handlers' annotations and the
//! route table (which supplies each operation's required scope). Served at
//! `/api/v1/openapi.json` and committed as `docs/openapi.json`; a test
//! fails when the committed file is out of date.

use std::sync::OnceLock;

use axum::http::{header, Method};
use axum::response::IntoResponse;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::OpenApi;

use crate::{error, failure_codes, model, routes};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "fleet operator API",
        description = "Reads from PostgreSQL; every mutation is a hub command. Errors are {\"error\": {\"code\", \"message\", \"details\"}}."
    ),
    components(schemas(error::ErrorBody, model::DeviceSummary, model::DeviceDetail))
)]
struct ApiDoc;

fn operation<'a>(item: &'a mut PathItem, method: &Method) -> Option<&'a mut Operation> {
    match *method {
        Method::GET => item.get.as_mut(),
        Method::POST => item.post.as_mut(),
        Method::PUT => item.put.as_mut(),
        Method::DELETE => item.delete.as_mut(),
        Method::PATCH => item.patch.as_mut(),
        _ => None,
    }
}

/// Builds the document; every table route gets its scope as a bearer
/// security requirement plus the 401/403 answers every scoped route has.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    let table = routes::table();
    for route in &table {
        doc.paths.merge(route.paths.clone());
    }
    let components = doc.components.get_or_insert_with(Default::default);
    for route in &table {
        components.schemas.extend(route.schemas.iter().cloned());
    }
    components.schemas.insert(
        "FailureCode".to_string(),
        failure_codes::failure_code_enum().into(),
    );
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
    );
    for route in table {
        let Some(item) = doc.paths.paths.get_mut(&route.path) else {
            continue;
        };
        let Some(op) = operation(item, &route.method) else {
            continue;
        };
        op.security = Some(vec![SecurityRequirement::new(
            "bearer",
            [route.scope.as_str()],
        )]);
        for (status, what) in [
            ("401", "missing or unknown token (UNAUTHENTICATED)"),
            ("403", "the token lacks the scope (FORBIDDEN)"),
        ] {
            op.responses
                .responses
                .entry(status.to_string())
                .or_insert_with(|| {
                    utoipa::openapi::ResponseBuilder::new()
                        .description(what)
                        .content(
                            "application/json",
                            utoipa::openapi::ContentBuilder::new()
                                .schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody")))
                                .build(),
                        )
                        .build()
                        .into()
                });
        }
    }
    doc
}

/// The document as pretty JSON with a trailing newline (the committed form).
pub fn json() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut s = serde_json::to_string_pretty(&document()).unwrap_or_else(|_| "{}".into());
        s.push('\n');
        s
    })
}

/// The OpenAPI document itself.
#[utoipa::path(get, path = "/api/v1/openapi.json", operation_id = "openapi_json",
    responses((status = 200, description = "this document", content_type = "application/json")),
    tag = "meta")]
pub async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], json())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_operation_id_is_unique() {
        let doc = super::document();
        let mut seen = std::collections::BTreeSet::new();
        for (path, item) in &doc.paths.paths {
            for op in [&item.get, &item.post, &item.put, &item.delete, &item.patch]
                .into_iter()
                .flatten()
            {
                let id = op.operation_id.clone().unwrap_or_default();
                assert!(!id.is_empty(), "{path} has no operationId");
                assert!(seen.insert(id.clone()), "operationId {id} twice ({path})");
            }
        }
    }
}
