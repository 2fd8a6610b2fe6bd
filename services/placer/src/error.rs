//! The placer's typed errors, with the stable codes callers map (the API:
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
    /// No placer was subscribed: the request went nowhere, so nothing was
    /// applied.
    #[error("no placer is running")]
    NotRunning,
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
            PlacerError::Unavailable(_) | PlacerError::NotRunning | PlacerError::Db(_) => {
                ErrorCode::Unavailable
            }
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

    pub fn from_proto(e: &v1::PlacerError) -> Self {
        let m = e.message.clone();
        match e.code() {
            ErrorCode::InvalidArgument => PlacerError::InvalidArgument(m),
            ErrorCode::NotFound => PlacerError::NotFound(m),
            ErrorCode::Forbidden => PlacerError::Forbidden(m),
            ErrorCode::InsufficientCapacity => PlacerError::InsufficientCapacity(m),
            _ => PlacerError::Unavailable(m),
        }
    }
}
