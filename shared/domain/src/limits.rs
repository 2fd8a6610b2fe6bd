//! How long an input's strings may be. Longer ones are bad input, refused
//! with a typed reason before any query (a 6,000-character key overflows a
//! btree index row and would fail its whole batch in PostgreSQL).

use crate::DomainError;

/// Site ids, device ids, key kinds, sources, gateway ids.
pub const MAX_ID: usize = 128;
/// An external device key (name, serial, BMC address, uuid).
pub const MAX_KEY: usize = 512;
/// A condition's reason, a state token, a tag.
pub const MAX_REASON: usize = 512;
/// A condition's message, a mirror's free text.
pub const MAX_MESSAGE: usize = 8192;
/// Conditions in one snapshot; tags or state tokens in one mirror.
pub const MAX_ITEMS: usize = 256;

/// `field` holds at most `max` characters.
pub fn check_len(field: &str, value: &str, max: usize) -> Result<(), DomainError> {
    if value.len() > max && value.chars().count() > max {
        return Err(DomainError::InvalidArgument(format!(
            "{field} is longer than {max} characters"
        )));
    }
    Ok(())
}

/// `field` holds at most `max` items.
pub fn check_count(field: &str, n: usize, max: usize) -> Result<(), DomainError> {
    if n > max {
        return Err(DomainError::InvalidArgument(format!(
            "{field} holds more than {max} items"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_strings_are_refused_by_name() {
        assert!(check_len("key", &"k".repeat(MAX_KEY), MAX_KEY).is_ok());
        let e = check_len("key", &"k".repeat(6000), MAX_KEY).unwrap_err();
        assert_eq!(e.to_string(), "key is longer than 512 characters");
        assert_eq!(e.code(), crate::error::ErrorCode::InvalidArgument);
        // Characters, not bytes.
        assert!(check_len("reason", &"é".repeat(MAX_REASON), MAX_REASON).is_ok());
        assert!(check_count("conditions", 257, MAX_ITEMS).is_err());
    }
}
