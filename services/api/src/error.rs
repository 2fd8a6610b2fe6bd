//! One error shape, `{"error": {"code", "message", "details"}}`, with the
//! stable codes of `spec/api.md`. Database and bus errors are logged here and
//! answered as `UNAVAILABLE` without their text.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use fleet_domain::DomainError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

/// The stable codes of `spec/api.md`: the mesh's one `ErrorCode`.
pub use fleet_proto::ErrorCode as Code;

/// The codes the API answers.
pub const API_CODES: &[Code] = &[
    Code::InvalidArgument,
    Code::Unauthenticated,
    Code::Forbidden,
    Code::NotFound,
    Code::Conflict,
    Code::InvalidState,
    Code::FutureObservation,
    Code::ForbiddenSource,
    Code::InsufficientCapacity,
    Code::PayloadTooLarge,
    Code::Unavailable,
    Code::Ineligible,
];

/// Each code's name and HTTP status: the one place they are mapped.
pub trait HttpCode {
    fn status(self) -> StatusCode;
}

impl HttpCode for Code {
    fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FutureObservation => StatusCode::BAD_REQUEST,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Forbidden | Code::ForbiddenSource => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::Conflict | Code::InvalidState | Code::InsufficientCapacity => {
                StatusCode::CONFLICT
            }
            Code::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::Ineligible => StatusCode::UNPROCESSABLE_ENTITY,
            // The agent protocol's codes never reach the API's callers as
            // such; a peer failing in a way the API cannot name is 503.
            Code::Unspecified
            | Code::Unavailable
            | Code::SessionClosed
            | Code::IdentityRevoked
            | Code::NotConnected
            | Code::DeadlineExceeded
            | Code::AgentError => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: Code,
    pub message: String,
    pub details: Value,
}

/// The error body, for the OpenAPI document.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// One of INVALID_ARGUMENT, UNAUTHENTICATED, FORBIDDEN, NOT_FOUND,
    /// CONFLICT, INVALID_STATE, FUTURE_OBSERVATION, FORBIDDEN_SOURCE,
    /// INSUFFICIENT_CAPACITY, PAYLOAD_TOO_LARGE, UNAVAILABLE, INELIGIBLE.
    #[schema(schema_with = crate::model::error_code_schema)]
    pub code: String,
    pub message: String,
    #[schema(value_type = Object)]
    pub details: Value,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            details: json!({}),
        }
    }
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(Code::InvalidArgument, message)
    }
    pub fn not_found(what: impl Into<String>) -> Self {
        ApiError::new(Code::NotFound, format!("{} not found", what.into()))
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(Code::Unavailable, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "code": self.code.as_str_name(),
            "message": self.message,
            "details": self.details,
        }});
        (self.code.status(), axum::Json(body)).into_response()
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        tracing::warn!(error = %e, "database read failed");
        ApiError::unavailable("the database is unavailable; retry later")
    }
}

impl From<DomainError> for ApiError {
    fn from(e: DomainError) -> Self {
        let code = e.code();
        ApiError::new(code, e.to_string())
    }
}

/// `Json` whose rejections are `INVALID_ARGUMENT` in the one error shape.
pub struct J<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for J<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let json = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                let ct = ct.trim().to_ascii_lowercase();
                ct.starts_with("application/json") || ct.contains("+json")
            });
        if !json {
            return Err(json_rejection(JsonRejection::MissingJsonContentType(
                Default::default(),
            )));
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(Code::PayloadTooLarge, "the request body is too large")
                } else {
                    ApiError::invalid(format!("cannot read the body: {}", e.body_text()))
                }
            })?;
        if has_nul(&bytes) {
            return Err(nul());
        }
        match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(v)) => Ok(J(v)),
            Err(r) => Err(json_rejection(r)),
        }
    }
}

/// PostgreSQL text cannot hold NUL: refused at the boundary as bad input,
/// so it never reaches a query (where it would be a database error).
fn has_nul(raw: &[u8]) -> bool {
    raw.contains(&0) || raw.windows(6).any(|w| w.eq_ignore_ascii_case(b"\\u0000"))
}

fn nul() -> ApiError {
    ApiError::invalid("NUL characters are not accepted")
}

fn uri_has_nul(s: &str) -> bool {
    s.as_bytes()
        .windows(3)
        .any(|w| w.eq_ignore_ascii_case(b"%00"))
        || s.contains('\0')
}

fn json_rejection(r: JsonRejection) -> ApiError {
    match r {
        JsonRejection::MissingJsonContentType(_) => {
            ApiError::invalid("the body must be JSON (content-type: application/json)")
        }
        other => {
            let text = other.body_text();
            // chrono's parse errors name no format: say which one is expected.
            let timestamp = CHRONO_ERRORS.iter().any(|e| text.contains(e));
            ApiError::invalid(if timestamp {
                format!(
                    "invalid JSON body: {text}: a timestamp is RFC 3339 with a time zone, \
                     e.g. 2026-12-01T10:00:00Z or 2026-12-01T11:00:00+01:00"
                )
            } else {
                format!("invalid JSON body: {text}")
            })
        }
    }
}

/// What chrono says when a string is not an RFC 3339 timestamp.
const CHRONO_ERRORS: &[&str] = &[
    "premature end of input",
    "input contains invalid characters",
    "input is out of range",
    "trailing input",
    "input is not enough for unique date and time",
    "no possible date and time matching input",
];

/// `Query` whose rejections are `INVALID_ARGUMENT`.
pub struct Q<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Q<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let axum::extract::Query(v) = from_uri(parts, state, query, query_rejection).await?;
        Ok(Q(v))
    }
}

fn query(uri: &Uri) -> &str {
    uri.query().unwrap_or("")
}

fn query_rejection(r: QueryRejection) -> ApiError {
    ApiError::invalid(format!("invalid query: {}", r.body_text()))
}

/// `Path` whose rejections are `INVALID_ARGUMENT`.
pub struct P<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for P<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let axum::extract::Path(v) = from_uri(parts, state, Uri::path, path_rejection).await?;
        Ok(P(v))
    }
}

fn path_rejection(r: PathRejection) -> ApiError {
    ApiError::invalid(format!("invalid path: {}", r.body_text()))
}

/// Axum's extractor `E` of a part of the URI (`part`), with a NUL in that
/// part refused first and `E`'s rejections answered by `rejected`.
async fn from_uri<S: Send + Sync, E: FromRequestParts<S>>(
    parts: &mut Parts,
    state: &S,
    part: fn(&Uri) -> &str,
    rejected: fn(E::Rejection) -> ApiError,
) -> Result<E, ApiError> {
    if uri_has_nul(part(&parts.uri)) {
        return Err(nul());
    }
    E::from_request_parts(parts, state).await.map_err(rejected)
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_the_statuses_of_api_md() {
        let expect = [
            ("INVALID_ARGUMENT", 400),
            ("UNAUTHENTICATED", 401),
            ("FORBIDDEN", 403),
            ("NOT_FOUND", 404),
            ("CONFLICT", 409),
            ("INVALID_STATE", 409),
            ("FUTURE_OBSERVATION", 400),
            ("FORBIDDEN_SOURCE", 403),
            ("INSUFFICIENT_CAPACITY", 409),
            ("PAYLOAD_TOO_LARGE", 413),
            ("UNAVAILABLE", 503),
            ("INELIGIBLE", 422),
        ];
        assert_eq!(API_CODES.len(), expect.len());
        for (code, status) in expect {
            let c = Code::from_str_name(code).unwrap();
            assert!(API_CODES.contains(&c));
            assert_eq!((c.as_str_name(), c.status().as_u16()), (code, status));
        }
        // Domain errors keep their code; an unknown type is bad input.
        let e: ApiError = DomainError::UnknownConditionType("X".into()).into();
        assert_eq!(e.code, Code::InvalidArgument);
        let e: ApiError = DomainError::Conflict {
            expected: 1,
            actual: 2,
        }
        .into();
        assert_eq!(e.code, Code::Conflict);
    }

    #[test]
    fn nul_is_found_raw_escaped_and_percent_encoded() {
        assert!(has_nul(b"{\"a\":\"x\\u0000\"}"));
        assert!(has_nul(b"{\"a\":\"x\\U0000\"}"));
        assert!(has_nul(b"a\0b"));
        assert!(!has_nul(b"{\"a\":\"x\\u0001\"}"));
        assert!(uri_has_nul("site=a%00b"));
        assert!(!uri_has_nul("site=a%20b"));
    }
}
