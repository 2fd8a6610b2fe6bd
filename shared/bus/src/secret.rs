//! A secret string that never prints.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A secret string. `Debug` and `Serialize` print `<redacted>` (or nothing
/// when it is empty), so neither logs nor `fleet config` show it.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("Secret(\"\")")
        } else {
            f.write_str("Secret(<redacted>)")
        }
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Empty stays empty so the built-in defaults round-trip.
        s.serialize_str(if self.0.is_empty() { "" } else { "<redacted>" })
    }
}

/// `scheme://user:password@host/...` with the password (and a token-only
/// user part) replaced by `<redacted>`; anything else unchanged.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_string();
    };
    let user = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:<redacted>"),
        // A bare user part may be a token.
        None => "<redacted>".to_string(),
    };
    format!("{scheme}://{user}@{host}{tail}")
}

/// Does the URL (or any of a comma-separated list) carry a user part?
pub fn has_userinfo(url: &str) -> bool {
    url.split(',').any(|u| {
        let rest = u.trim().split_once("://").map(|(_, r)| r).unwrap_or(u);
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        rest[..end].contains('@')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(
            redact_url("nats://hub:s3cret@nats:4222"),
            "nats://hub:<redacted>@nats:4222"
        );
        assert_eq!(
            redact_url("nats://tok3n@nats:4222"),
            "nats://<redacted>@nats:4222"
        );
        assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(
            redact_url("postgres://u:p@h/db?x=a@b"),
            "postgres://u:<redacted>@h/db?x=a@b"
        );
        assert!(has_userinfo("nats://a:b@h:1"));
        assert!(has_userinfo("nats://h:1, nats://a@h:2"));
        assert!(!has_userinfo("nats://h:1/x@y"));
        assert_eq!(format!("{:?}", Secret::new("pw")), "Secret(<redacted>)");
    }
}
