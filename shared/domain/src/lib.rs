//! The fleet domain: vocabularies, the condition catalogue, derivation,
//! predicates, the provision table, SLURM and Ironic vocabularies, and the
//! pure operations the hub applies to a device. No IO at all.

pub mod acceptance;
pub mod binding;
pub mod burn_in;
pub mod catalogue;
pub mod commands;
pub mod derivation;
pub mod drift;
pub mod eligibility;
pub mod enrolment;
pub mod error;
pub mod fabric_flip;
pub mod failure;
pub mod hardware;
pub mod impairment;
pub mod inventory;
pub mod ironic;
pub mod ironic_direct;
pub mod jobs;
pub mod lease;
pub mod limits;
pub mod mtc;
pub mod nova_arm;
pub mod nvlink;
pub mod predicates;
pub mod provision;
pub mod release;
pub mod slurm;
pub mod standup;
pub mod state;
pub mod storm;
pub mod vocab;

pub use catalogue::ConditionType;
pub use error::DomainError;
pub use vocab::*;
