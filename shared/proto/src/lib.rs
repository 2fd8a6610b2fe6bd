//! Generated protobuf message types (`schemas/fleet/v1`) and small helpers
//! every service uses to move between them and the domain's clock.
pub mod fleet {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/fleet.v1.rs"));
    }
}

pub use fleet::v1;
pub use fleet::v1::ErrorCode;
pub use prost::{Message, Name};
pub use prost_types::Timestamp;

use chrono::{DateTime, TimeZone, Utc};

/// The `Fleet-Schema` header of a message: its full protobuf name
/// (`fleet.v1.StatusChanged`), from `prost::Name`.
pub fn schema<M: Name>() -> String {
    M::full_name()
}

/// `StatusChanged.schema_version` of the events the hub publishes
/// (docs/subjects.md): a birth is one `device` event, a transaction's
/// condition changes one `conditions` event.
pub const STATUS_SCHEMA_VERSION: u32 = 2;

impl v1::StatusChanged {
    /// Whether this is a device's birth (the `device` event).
    pub fn is_birth(&self) -> bool {
        self.axis == "device"
    }

    /// The value this event gives `axis`: `to` for an event of that axis,
    /// the first value for a birth, `None` otherwise.
    pub fn value_of(&self, axis: &str) -> Option<&str> {
        if self.axis == axis {
            Some(&self.to)
        } else if self.is_birth() {
            self.axes
                .iter()
                .find(|a| a.axis == axis)
                .map(|a| a.value.as_str())
        } else {
            None
        }
    }
}

/// An error code from its wire name (`"NOT_FOUND"`); an unknown or empty
/// name is `UNAVAILABLE` (a peer speaking a newer set of codes failed in a
/// way this one cannot name).
pub fn error_code(name: &str) -> ErrorCode {
    ErrorCode::from_str_name(name)
        .filter(|c| *c != ErrorCode::Unspecified)
        .unwrap_or(ErrorCode::Unavailable)
}

/// An error code from its wire number; an unknown or unset one is
/// `UNAVAILABLE` (a peer failed in a way this one cannot name).
pub fn error_code_of(n: i32) -> ErrorCode {
    ErrorCode::try_from(n)
        .ok()
        .filter(|c| *c != ErrorCode::Unspecified)
        .unwrap_or(ErrorCode::Unavailable)
}

/// Whether any string in a message holds a NUL character, which
/// PostgreSQL text cannot store: such input is refused before it is
/// applied. Reads the message's `Debug` form, where a NUL is the escape
/// `\0` and a backslash is always `\\`.
pub fn contains_nul<T: std::fmt::Debug>(msg: &T) -> bool {
    let s = format!("{msg:?}");
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' && chars.next() == Some('0') {
            return true;
        }
    }
    false
}

pub fn timestamp(at: DateTime<Utc>) -> Timestamp {
    Timestamp {
        seconds: at.timestamp(),
        nanos: at.timestamp_subsec_nanos() as i32,
    }
}

/// `None` for a missing or out-of-range timestamp. Truncated to the
/// microsecond PostgreSQL stores, so a redelivered observation compares
/// equal to the stored one.
pub fn datetime(ts: Option<&Timestamp>) -> Option<DateTime<Utc>> {
    let ts = ts?;
    if !(0..1_000_000_000).contains(&ts.nanos) {
        return None;
    }
    Utc.timestamp_opt(ts.seconds, (ts.nanos as u32 / 1000) * 1000)
        .single()
}

#[cfg(test)]
mod tests {
    #[test]
    fn nul_is_found_in_any_string_and_a_backslash_zero_is_not_one() {
        let c = super::v1::Cordon {
            device_id: "dev_1".into(),
            reason: "a\0b".into(),
        };
        assert!(super::contains_nul(&c));
        let c = super::v1::Cordon {
            device_id: "dev_1".into(),
            reason: "C:\\0 path".into(),
        };
        assert!(!super::contains_nul(&c));
    }
}
