//! The inventory an operator sets up before devices arrive (sites, tenants,
//! pools and their hardware profiles): its vocabulary and the checks every
//! write of it passes, before any query. Seed 002, "Inventory-only flag":
//! `Site.inventory_only` is "immutable after create", so no update carries
//! it.

use crate::limits::{check_len, MAX_ID, MAX_REASON};
use crate::vocab::vocab;
use crate::{DomainError, Role};

vocab!(
    /// What a pool is for; the kind decides the role of every device that
    /// joins it (Better Compute: "a node that joins a metal-host, vps-host
    /// or provider pool becomes host, one that joins a metal-dedicated pool
    /// becomes dedicated").
    PoolKind, "pool kind" {
    MetalHost => "metal-host", VpsHost => "vps-host", Provider => "provider",
    MetalDedicated => "metal-dedicated", Custom => "custom",
});

impl PoolKind {
    /// The role a device that joins a pool of this kind takes.
    pub const fn role(self) -> Role {
        match self {
            PoolKind::MetalDedicated => Role::Dedicated,
            _ => Role::Host,
        }
    }
}

vocab!(
    /// What an inventory delete names.
    InventoryKind, "inventory kind" { Site => "site", Tenant => "tenant", Pool => "pool" });

/// The most GPUs a hardware profile (and a join) reports.
pub const MAX_GPUS: i32 = 256;

/// A site, tenant or pool id: 1 to 128 ASCII letters, digits, `-` or `_`.
/// Site ids are subject tokens (`fleet.status.<axis>.<site>.<device>`), so
/// no `.`, `*`, `>` or white space.
pub fn check_id(field: &str, id: &str) -> Result<(), DomainError> {
    if id.is_empty() {
        return Err(DomainError::InvalidArgument(format!("{field} is required")));
    }
    check_len(field, id, MAX_ID)?;
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(DomainError::InvalidArgument(format!(
            "{field} {id:?} may hold only ASCII letters, digits, '-' and '_'"
        )));
    }
    Ok(())
}

/// A display name: not blank, at most 512 characters.
pub fn check_name(field: &str, name: &str) -> Result<(), DomainError> {
    if name.trim().is_empty() {
        return Err(DomainError::InvalidArgument(format!("{field} is required")));
    }
    check_len(field, name, MAX_REASON)
}

/// A pool hardware profile's GPUs per device.
pub fn check_gpu_count(gpu_count: i32) -> Result<(), DomainError> {
    if !(0..=MAX_GPUS).contains(&gpu_count) {
        return Err(DomainError::InvalidArgument(format!(
            "gpu_count {gpu_count} is outside 0..={MAX_GPUS}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_kind_decides_the_role() {
        // "a node that joins a metal-host, vps-host or provider pool becomes
        // host, one that joins a metal-dedicated pool becomes dedicated"
        let cases = [
            ("metal-host", Role::Host),
            ("vps-host", Role::Host),
            ("provider", Role::Host),
            ("metal-dedicated", Role::Dedicated),
            ("custom", Role::Host),
        ];
        for (kind, role) in cases {
            assert_eq!(PoolKind::parse(kind).unwrap().role(), role, "{kind}");
        }
        assert!(PoolKind::parse("gpu").is_err());
    }

    #[test]
    fn ids_are_subject_safe() {
        for ok in ["s1", "dc-1", "pool_a", "A9"] {
            assert!(check_id("id", ok).is_ok(), "{ok}");
        }
        let long = "x".repeat(129);
        for bad in ["", "s.1", "s*", "s>", "s 1", "é", long.as_str()] {
            assert!(check_id("id", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_and_gpu_counts_are_bounded() {
        assert!(check_name("name", "site one").is_ok());
        assert!(check_name("name", "  ").is_err());
        assert!(check_name("name", &"n".repeat(513)).is_err());
        assert!(check_gpu_count(0).is_ok() && check_gpu_count(256).is_ok());
        assert!(check_gpu_count(-1).is_err() && check_gpu_count(257).is_err());
    }
}
