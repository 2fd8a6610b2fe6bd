//! Generated protobuf message types (`schemas/fleet/v1`) and small helpers
//! every service uses to move between them and the domain's clock.
pub mod fleet {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/fleet.v1.rs"));
    }
}

pub use fleet::v1;
pub use prost::Message;
pub use prost_types::Timestamp;

use chrono::{DateTime, TimeZone, Utc};

/// The full protobuf name of a message, for the `Fleet-Schema` header.
pub trait SchemaName {
    const NAME: &'static str;
}

macro_rules! schema_names {
    ($($t:ident),* $(,)?) => {$(
        impl SchemaName for v1::$t { const NAME: &'static str = concat!("fleet.v1.", stringify!($t)); }
    )*};
}
schema_names!(
    ConditionSnapshot,
    ConditionWrite,
    ConnectivityObservation,
    StatusChanged,
    HubCommand,
    HubReply,
    AllocationEvent,
    RadarProjection
);

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
