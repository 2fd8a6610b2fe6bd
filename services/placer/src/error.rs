//! The placer's typed errors, with the stable codes callers map (the API:
//! `INVALID_ARGUMENT` 400, `NOT_FOUND` 404, `FORBIDDEN` 403,
//! `INSUFFICIENT_CAPACITY` 409, `UNAVAILABLE` 503).

use fleet_proto::v1;

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
    pub fn code(&self) -> &'static str {
        match self {
            PlacerError::InvalidArgument(_) => "INVALID_ARGUMENT",
            PlacerError::NotFound(_) => "NOT_FOUND",
            PlacerError::Forbidden(_) => "FORBIDDEN",
            PlacerError::InsufficientCapacity(_) => "INSUFFICIENT_CAPACITY",
            PlacerError::Unavailable(_) | PlacerError::NotRunning | PlacerError::Db(_) => {
                "UNAVAILABLE"
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
            code: self.code().to_string(),
            message,
        }
    }

    pub fn from_proto(e: &v1::PlacerError) -> Self {
        let m = e.message.clone();
        match e.code.as_str() {
            "INVALID_ARGUMENT" => PlacerError::InvalidArgument(m),
            "NOT_FOUND" => PlacerError::NotFound(m),
            "FORBIDDEN" => PlacerError::Forbidden(m),
            "INSUFFICIENT_CAPACITY" => PlacerError::InsufficientCapacity(m),
            _ => PlacerError::Unavailable(m),
        }
    }
}
