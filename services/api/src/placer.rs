//! Allocations and capacity are the placer's: the API asks it over NATS
//! request/reply (`fleet_placer_client::PlacerClient`), so the numbers it
//! answers are the ones the placer books against. No answer within
//! `api.hub_timeout` (no responder, NATS away, timeout) is
//! `UNAVAILABLE`, never a number computed elsewhere.

use fleet_placer_client::PlacerError;

use crate::error::{ApiError, Code};

/// The placer's typed refusal as the API's error; transport and store
/// failures are logged and answered without their text.
pub fn error(verb: &str, e: PlacerError) -> ApiError {
    match e {
        PlacerError::InvalidArgument(m) => ApiError::new(Code::InvalidArgument, m),
        PlacerError::NotFound(m) => ApiError::new(Code::NotFound, format!("{m} not found")),
        PlacerError::Forbidden(m) => ApiError::new(Code::Forbidden, m),
        PlacerError::InsufficientCapacity(m) => ApiError::new(Code::InsufficientCapacity, m),
        PlacerError::Unavailable(m) => {
            tracing::warn!(verb, error = %m, "placer unavailable");
            ApiError::unavailable(match verb {
                "allocate" => "the placer did not answer in time; the allocation may or may not have been booked: retry with the same request_id, or list the tenant's allocations",
                "release" => "the placer did not answer in time; the release may or may not have been applied: release again (it is idempotent)",
                _ => "the placer did not answer in time; retry later",
            })
        }
        PlacerError::NotRunning => {
            tracing::warn!(verb, "no placer is running");
            ApiError::unavailable("no placer is running; the request was not sent and nothing was applied, retry later")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placer_codes_map_to_api_codes_and_hide_transport_text() {
        let cases = [
            (
                PlacerError::InvalidArgument("gpus".into()),
                400,
                "INVALID_ARGUMENT",
            ),
            (PlacerError::NotFound("pool p".into()), 404, "NOT_FOUND"),
            (
                PlacerError::Forbidden("other tenant".into()),
                403,
                "FORBIDDEN",
            ),
            (
                PlacerError::InsufficientCapacity("no room".into()),
                409,
                "INSUFFICIENT_CAPACITY",
            ),
            (
                PlacerError::Unavailable("placer request: no responders".into()),
                503,
                "UNAVAILABLE",
            ),
        ];
        for (e, status, code) in cases {
            let a = error("allocate", e);
            assert_eq!(
                (
                    crate::error::HttpCode::status(a.code).as_u16(),
                    a.code.as_str_name()
                ),
                (status, code)
            );
            assert!(!a.message.contains("no responders"), "{}", a.message);
        }
        let a = error("get", PlacerError::NotFound("allocation x".into()));
        assert_eq!(a.message, "allocation x not found");
    }
}
