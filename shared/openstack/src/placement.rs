//! Placement's resource-provider traits: read them with the provider's
//! generation, and replace them under that generation (Placement answers
//! 409 when the provider changed in between, so a write never clobbers a
//! concurrent one: the caller reads again and decides again).
//! `GET`/`PUT /resource_providers/{uuid}/traits`, microversion 1.6 or later.

use fleet_connector::paginate::{join, with_segments};
use fleet_connector::SourceError;
use reqwest::{Method, Url};
use serde::{Deserialize, Serialize};

use crate::session::{Session, HEADER_API_VERSION};

/// A provider's traits and the generation they were read at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Traits {
    pub traits: Vec<String>,
    pub resource_provider_generation: i64,
}

/// Placement at one site, at one microversion (`"placement 1.18"`).
pub struct Placement<'a> {
    pub session: &'a Session,
    pub version: &'a str,
}

impl Placement<'_> {
    async fn traits_url(&self, uuid: &str) -> Result<Url, SourceError> {
        let base = self.session.endpoint("placement").await?;
        with_segments(join(&base, "resource_providers"), &[uuid, "traits"], &base)
    }

    fn headers(&self) -> [(&'static str, String); 1] {
        [(HEADER_API_VERSION, self.version.to_string())]
    }

    /// `GET /resource_providers/{uuid}/traits`.
    pub async fn traits(&self, uuid: &str) -> Result<Traits, SourceError> {
        let url = self.traits_url(uuid).await?;
        let headers = self.headers();
        self.session.get_json(&url, &headers).await
    }

    /// `PUT /resource_providers/{uuid}/traits` with the generation the
    /// traits were read at; a 409 means the provider moved on.
    pub async fn put_traits(&self, uuid: &str, t: &Traits) -> Result<(), SourceError> {
        let url = self.traits_url(uuid).await?;
        let headers = self.headers();
        let body = serde_json::to_value(t)
            .map_err(|e| SourceError::Protocol(format!("encoding traits: {e}")))?;
        self.session
            .send(Method::PUT, &url, &headers, Some(&body))
            .await
            .map(|_| ())
    }
}

/// The detail of a Placement error body (`{"errors": [{"detail": ...}]}`).
pub fn error_message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v["errors"][0]["detail"]
                .as_str()
                .or_else(|| v["errors"][0]["title"].as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_message_reads_placement_errors() {
        let body = r#"{"errors": [{"status": 409, "title": "Conflict", "detail": "resource provider generation conflict", "code": "placement.concurrent_update"}]}"#;
        assert_eq!(error_message(body), "resource provider generation conflict");
        assert_eq!(error_message("plain"), "plain");
    }
}
