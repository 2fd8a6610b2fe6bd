//! The placer service's typed errors (its callers see `fleet_placer_client::PlacerError`), with the stable codes callers map (the API:
//! `INVALID_ARGUMENT` 400, `NOT_FOUND` 404, `FORBIDDEN` 403,
//! `INSUFFICIENT_CAPACITY` 409, `UNAVAILABLE` 503).

use fleet_proto::{v1, ErrorCode};

#[derive(Debug, thiserror::Error)]
pub enum PlacerError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    InsufficientCapacity(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

impl PlacerError {
    pub fn code(&self) -> ErrorCode {
        match self {
            PlacerError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            PlacerError::NotFound(_) => ErrorCode::NotFound,
            PlacerError::Forbidden(_) => ErrorCode::Forbidden,
            PlacerError::InsufficientCapacity(_) => ErrorCode::InsufficientCapacity,
            PlacerError::Unavailable(_) | PlacerError::Db(_) => ErrorCode::Unavailable,
        }
    }

    /// The reply form; database text never leaves the service.
    pub fn to_proto(&self) -> v1::PlacerError {
        let message = match self {
            PlacerError::Db(_) => "the placer's database is unavailable".to_string(),
            other => other.to_string(),
        };
        v1::PlacerError {
            code: self.code() as i32,
            message,
        }
    }
}

/// The same refusal as the placer's callers see it (database text hidden).
impl From<PlacerError> for fleet_placer_client::PlacerError {
    fn from(e: PlacerError) -> Self {
        fleet_placer_client::PlacerError::from_proto(&e.to_proto())
    }
}
