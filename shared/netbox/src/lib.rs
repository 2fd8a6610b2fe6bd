//! fleet-netbox: what more than one service needs of NetBox's REST API.
//! connector-netbox reads the device lists with it; the workflow service's
//! Release re-reads one device "and requires active" immediately before a
//! customer handoff (seed 002, "Inventory status").

use fleet_connector::paginate::{collect_pages, join};
use fleet_connector::{HttpClient, SourceError};
use reqwest::Url;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// How the token is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthScheme {
    /// `Authorization: Token <t>` (v1 tokens).
    Token,
    /// `Authorization: Bearer <t>` (v2 tokens, `nbt_<key>.<secret>`).
    Bearer,
    /// Bearer for tokens starting `nbt_`, Token otherwise.
    Auto,
}

impl AuthScheme {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(AuthScheme::Auto),
            "token" => Ok(AuthScheme::Token),
            "bearer" => Ok(AuthScheme::Bearer),
            other => Err(format!("{other:?} is not auto, token or bearer")),
        }
    }

    /// The `Authorization` header value for `token`.
    pub fn header(self, token: &str) -> String {
        let bearer = match self {
            AuthScheme::Token => false,
            AuthScheme::Bearer => true,
            AuthScheme::Auto => token.starts_with("nbt_"),
        };
        if bearer {
            format!("Bearer {token}")
        } else {
            format!("Token {token}")
        }
    }
}

/// One page of a NetBox list endpoint (`/api/dcim/devices/`, ...).
#[derive(Debug, Clone, Deserialize)]
pub struct Page<T> {
    pub results: Vec<T>,
    #[serde(default)]
    pub next: Option<String>,
}

/// `GET url` as JSON, with the `Authorization` header when there is one.
pub async fn get<T: DeserializeOwned>(
    http: &HttpClient,
    url: &Url,
    authorization: Option<&str>,
) -> Result<T, SourceError> {
    http.json(url.as_str(), |c| {
        let r = c.get(url.clone()).header("Accept", "application/json");
        match authorization {
            Some(a) => r.header("Authorization", a),
            None => r,
        }
    })
    .await
}

/// Every item of a NetBox list from `first` on, `next` followed (rebased
/// onto `first`'s origin) for at most `max_pages` pages.
pub async fn list<T: DeserializeOwned>(
    http: &HttpClient,
    first: Url,
    max_pages: u32,
    authorization: Option<&str>,
) -> Result<Vec<T>, SourceError> {
    collect_pages(first, max_pages, |url: Url| async move {
        let page: Page<T> = get(http, &url, authorization).await?;
        Ok((page.results, page.next))
    })
    .await
}

/// `{"value": "active", "label": "Active"}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Choice {
    pub value: String,
}

/// What a re-read of one device needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct DeviceStatus {
    pub id: i64,
    #[serde(default)]
    pub name: Option<String>,
    pub status: Choice,
}

/// One NetBox, its `Authorization` resolved by the caller.
pub struct Netbox<'a> {
    pub http: &'a HttpClient,
    /// The NetBox base URL (a path prefix is kept).
    pub base: &'a Url,
    pub authorization: Option<&'a str>,
}

impl Netbox<'_> {
    /// `GET /api/dcim/devices/{id}/`; `None` when NetBox has no such device.
    pub async fn device(&self, id: i64) -> Result<Option<DeviceStatus>, SourceError> {
        let url = join(self.base, &format!("api/dcim/devices/{id}/"));
        match get(self.http, &url, self.authorization).await {
            Ok(d) => Ok(Some(d)),
            Err(SourceError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_token_forms() {
        let v1 = "0123456789abcdef0123456789abcdef01234567";
        let v2 = "nbt_peerskey0001.peerssecret0123456789abcdefghijklmnopqrst";
        assert_eq!(AuthScheme::Auto.header(v1), format!("Token {v1}"));
        assert_eq!(AuthScheme::Auto.header(v2), format!("Bearer {v2}"));
        assert_eq!(AuthScheme::Token.header(v2), format!("Token {v2}"));
        assert_eq!(AuthScheme::Bearer.header(v1), format!("Bearer {v1}"));
        assert_eq!(AuthScheme::parse("Bearer"), Ok(AuthScheme::Bearer));
        assert_eq!(AuthScheme::parse(""), Ok(AuthScheme::Auto));
        assert!(AuthScheme::parse("basic").is_err());
    }

    #[test]
    fn a_device_reads_its_status_value() {
        let d: DeviceStatus = serde_json::from_str(
            r#"{"id": 7, "name": "gpu05", "status": {"value": "rma", "label": "RMA"}, "rack": null}"#,
        )
        .unwrap();
        assert_eq!((d.id, d.status.value.as_str()), (7, "rma"));
    }
}
