//! A device as the hub holds it inside one transaction, and the pure
//! operations on it: applying a snapshot, a single condition write, a
//! connectivity observation, and re-deriving every derived axis. The hub
//! loads a `DeviceState`, keeps a copy, runs these, and writes the diff.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use sha2::{Digest, Sha256};

use crate::binding::{BindingInput, BindingRow, Resource};
use crate::catalogue::{observation_types_of, ConditionType};
use crate::derivation::{self, reasons, Effective};
use crate::error::DomainError;
use crate::predicates::{self, SchedulingFacts};
use crate::vocab::*;

mod connectivity;
mod delegate;
mod freshness;
mod reconcile;
mod record;
mod snapshot;
mod sweep;
mod writes;

pub use delegate::*;
pub use freshness::*;
pub use record::*;
pub use snapshot::*;
pub use sweep::*;

/// "One more than 5 minutes in the future is rejected".
pub const FUTURE_LIMIT: Duration = Duration::minutes(5);

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceState {
    pub record: DeviceRecord,
    pub conditions: BTreeMap<ConditionType, ConditionRow>,
    pub freshness: BTreeMap<Source, Freshness>,
    /// `DeviceResourceBinding` rows: written by snapshots only, never read
    /// by derivation.
    pub bindings: BTreeMap<Resource, BindingRow>,
}

impl DeviceState {
    pub fn new(record: DeviceRecord) -> Self {
        DeviceState {
            record,
            conditions: BTreeMap::new(),
            freshness: BTreeMap::new(),
            bindings: BTreeMap::new(),
        }
    }
}
