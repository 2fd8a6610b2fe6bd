//! The typed errors of the domain, with the stable codes of `spec/api.md`.

pub use fleet_proto::ErrorCode;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DomainError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("device changed since version {expected}: now at {actual}")]
    Conflict { expected: i64, actual: i64 },
    #[error("{0}")]
    InvalidState(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("observed_at {observed_at} is more than 5 minutes ahead of {clock} (it read {now})")]
    FutureObservation {
        observed_at: String,
        /// Whose clock refused it: `the hub's clock` or `the API's clock`.
        clock: &'static str,
        now: String,
    },
    #[error("source {source_name} does not own condition type {condition_type}")]
    ForbiddenSource {
        source_name: String,
        condition_type: String,
    },
    #[error("unknown condition type {0:?}")]
    UnknownConditionType(String),
    /// An observation on a subject not of the shape `spec/mesh.md` gives,
    /// or whose tokens disagree with the message.
    #[error("subject: {0}")]
    InvalidSubject(String),
}

impl DomainError {
    /// The stable code of `spec/api.md` (and of hub replies).
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::Conflict { .. } => ErrorCode::Conflict,
            Self::InvalidState(_) => ErrorCode::InvalidState,
            Self::AlreadyExists(_) => ErrorCode::Conflict,
            Self::FutureObservation { .. } => ErrorCode::FutureObservation,
            Self::ForbiddenSource { .. } => ErrorCode::ForbiddenSource,
            // An unknown type is bad input to the API.
            Self::UnknownConditionType(_) => ErrorCode::InvalidArgument,
            Self::InvalidSubject(_) => ErrorCode::InvalidArgument,
        }
    }

    /// The DLQ reason token (`fleet.dlq.<stream>.<reason>`): lower case.
    pub fn dlq_reason(&self) -> &'static str {
        match self {
            Self::UnknownConditionType(_) => "unknown_condition_type",
            Self::ForbiddenSource { .. } => "forbidden_source",
            Self::FutureObservation { .. } => "future_observation",
            Self::InvalidSubject(_) => "invalid_subject",
            _ => "invalid",
        }
    }
}
