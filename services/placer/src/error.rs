//! The placer service's errors: a refusal its callers see as it is
//! (`fleet_placer_client::PlacerError`, one enum for both sides of the
//! wire), or a database failure whose text stays in the service and reaches
//! callers as `UNAVAILABLE`.

use fleet_placer_client::PlacerError as Refusal;
use fleet_proto::{v1, ErrorCode};

#[derive(Debug, thiserror::Error)]
pub enum PlacerError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

impl PlacerError {
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Refusal::InvalidArgument(message.into()).into()
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Refusal::NotFound(message.into()).into()
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Refusal::Forbidden(message.into()).into()
    }

    pub fn insufficient_capacity(message: impl Into<String>) -> Self {
        Refusal::InsufficientCapacity(message.into()).into()
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Refusal::Unavailable(message.into()).into()
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            PlacerError::Refused(r) => r.code(),
            PlacerError::Db(_) => ErrorCode::Unavailable,
        }
    }

    /// The reply form; database text never leaves the service.
    pub fn to_proto(&self) -> v1::PlacerError {
        let message = match self {
            PlacerError::Db(_) => "the placer's database is unavailable".to_string(),
            PlacerError::Refused(r) => r.to_string(),
        };
        v1::PlacerError {
            code: self.code() as i32,
            message,
        }
    }
}

/// The same refusal as the placer's callers see it (database text hidden).
impl From<PlacerError> for Refusal {
    fn from(e: PlacerError) -> Self {
        match e {
            PlacerError::Refused(r) => r,
            PlacerError::Db(_) => Refusal::from_proto(&e.to_proto()),
        }
    }
}
