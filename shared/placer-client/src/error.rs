//! The placer's refusals as its callers see them, with the mesh's error
//! codes (the API maps them: `INVALID_ARGUMENT` 400, `NOT_FOUND` 404,
//! `FORBIDDEN` 403, `INSUFFICIENT_CAPACITY` 409, `UNAVAILABLE` 503).

use fleet_proto::{v1, ErrorCode};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacerError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    InsufficientCapacity(String),
    /// No answer in time, NATS away, or the placer's store away.
    #[error("{0}")]
    Unavailable(String),
    /// No placer was subscribed: the request went nowhere, so nothing was
    /// applied.
    #[error("no placer is running")]
    NotRunning,
}

impl PlacerError {
    pub fn code(&self) -> ErrorCode {
        match self {
            PlacerError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            PlacerError::NotFound(_) => ErrorCode::NotFound,
            PlacerError::Forbidden(_) => ErrorCode::Forbidden,
            PlacerError::InsufficientCapacity(_) => ErrorCode::InsufficientCapacity,
            PlacerError::Unavailable(_) | PlacerError::NotRunning => ErrorCode::Unavailable,
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

impl fleet_bus::ClientError for PlacerError {
    fn not_running() -> Self {
        PlacerError::NotRunning
    }

    fn unavailable(why: String) -> Self {
        PlacerError::Unavailable(why)
    }
}
