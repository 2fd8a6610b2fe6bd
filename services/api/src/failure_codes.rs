//! The failure-code taxonomy (`fleet_domain::failure`), served as it is:
//! every `failure_code` a job device can carry, its meaning, its triage
//! owner and whether a re-run may succeed. The codes are one enum in the
//! OpenAPI document (`FailureCode`).

use axum::Json;
use fleet_domain::failure::{self, FailureCode, TriageOwner};
use serde::Serialize;
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};
use utoipa::openapi::Ref;
use utoipa::ToSchema;

/// The `FailureCode` component: every code of the taxonomy.
pub fn failure_code_enum() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(
            "A stable, machine-readable reason for a failed device workflow (seed 002, \
             \"Failure codes\"); GET /api/v1/failure-codes/ gives each one's meaning, \
             triage owner and whether a re-run may succeed.",
        ))
        .enum_values(Some(FailureCode::ALL.iter().map(|c| c.as_str())))
        .build()
}

fn failure_code_ref() -> Ref {
    Ref::from_schema_name("FailureCode")
}

fn triage_owner_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(TriageOwner::ALL.iter().map(|o| o.as_str())))
        .build()
}

/// One failure code of the taxonomy.
#[derive(Debug, Serialize, ToSchema)]
pub struct FailureCodeEntry {
    #[schema(schema_with = failure_code_ref)]
    pub code: String,
    pub meaning: String,
    /// The triage queue that owns it.
    #[schema(schema_with = triage_owner_schema)]
    pub triage_owner: String,
    /// Re-running the same work may succeed with nothing fixed first.
    pub retryable: bool,
}

/// Every failure code, in the taxonomy's order.
#[derive(Debug, Serialize, ToSchema)]
pub struct FailureCodeList {
    pub items: Vec<FailureCodeEntry>,
}

#[utoipa::path(get, operation_id = "list_failure_codes", path = "/api/v1/failure-codes/",
    responses((status = 200, body = FailureCodeList)),
    tag = "jobs")]
pub async fn list() -> Json<FailureCodeList> {
    Json(FailureCodeList {
        items: failure::taxonomy()
            .map(|e| FailureCodeEntry {
                code: e.code.as_str().to_string(),
                meaning: e.meaning.to_string(),
                triage_owner: e.owner.as_str().to_string(),
                retryable: e.retryable,
            })
            .collect(),
    })
}
