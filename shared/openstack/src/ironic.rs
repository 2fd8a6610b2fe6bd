//! Ironic's node calls: read one node, JSON-patch it, and ask for a
//! provision-state transition (asynchronous: Ironic answers 202 and the
//! caller watches `provision_state`).

use fleet_connector::paginate::{join, with_segments};
use fleet_connector::SourceError;
use reqwest::{Method, Url};
use serde::Deserialize;
use serde_json::Value;

use crate::session::{Session, HEADER_IRONIC_VERSION};

/// `<ironic>/v1/nodes`, whether or not the endpoint ends in `/v1`.
pub fn nodes_url(ironic: &Url) -> Url {
    if ironic.path().trim_end_matches('/').ends_with("/v1") {
        join(ironic, "nodes")
    } else {
        join(ironic, "v1/nodes")
    }
}

/// The fields of one node a workflow decides on.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Node {
    pub uuid: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub provision_state: Option<String>,
    #[serde(default)]
    pub target_provision_state: Option<String>,
    #[serde(default)]
    pub maintenance: bool,
    #[serde(default)]
    pub instance_uuid: Option<String>,
    #[serde(default)]
    pub last_error: Option<String>,
    #[serde(default)]
    pub instance_info: Value,
    /// The project the node is leased to (microversion 1.65 or later).
    #[serde(default)]
    pub lessee: Option<String>,
    #[serde(default)]
    pub driver: Option<String>,
    #[serde(default)]
    pub power_state: Option<String>,
    /// Set while a power transition is in flight.
    #[serde(default)]
    pub target_power_state: Option<String>,
    /// When the node's last inspection completed.
    #[serde(default)]
    pub inspection_finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Ironic at one site, at one API microversion.
pub struct Ironic<'a> {
    pub session: &'a Session,
    pub version: &'a str,
}

impl Ironic<'_> {
    async fn node_url(&self, ident: &str, tail: &str) -> Result<Url, SourceError> {
        let base = self.session.endpoint("baremetal").await?;
        let url = with_segments(nodes_url(&base), &[ident], &base)?;
        Ok(if tail.is_empty() {
            url
        } else {
            join(&url, tail)
        })
    }

    /// `<nodes>/{ident}/traits/{name}`, the trait name path-escaped.
    async fn trait_url(&self, ident: &str, name: &str) -> Result<Url, SourceError> {
        let traits = self.node_url(ident, "traits").await?;
        with_segments(traits.clone(), &[name], &traits)
    }

    fn headers(&self) -> [(&'static str, String); 1] {
        [(HEADER_IRONIC_VERSION, self.version.to_string())]
    }

    /// `GET /v1/nodes/{ident}` (a uuid or a name).
    pub async fn node(&self, ident: &str) -> Result<Node, SourceError> {
        let url = self.node_url(ident, "").await?;
        let headers = self.headers();
        self.session.get_json(&url, &headers).await
    }

    /// `PATCH /v1/nodes/{ident}` with a JSON patch (RFC 6902).
    pub async fn patch(&self, ident: &str, ops: &Value) -> Result<(), SourceError> {
        let url = self.node_url(ident, "").await?;
        let headers = self.headers();
        self.session
            .send(Method::PATCH, &url, &headers, Some(ops))
            .await
            .map(|_| ())
    }

    /// `GET /v1/nodes/{ident}/traits` (microversion 1.37 or later): the
    /// node's own traits, which carry customer-ready at a standalone site.
    pub async fn traits(&self, ident: &str) -> Result<Vec<String>, SourceError> {
        #[derive(Deserialize)]
        struct NodeTraits {
            traits: Vec<String>,
        }
        let url = self.node_url(ident, "traits").await?;
        let headers = self.headers();
        let t: NodeTraits = self.session.get_json(&url, &headers).await?;
        Ok(t.traits)
    }

    /// `PUT /v1/nodes/{ident}/traits/{name}`: adds one trait (idempotent).
    pub async fn add_trait(&self, ident: &str, name: &str) -> Result<(), SourceError> {
        let url = self.trait_url(ident, name).await?;
        let headers = self.headers();
        self.session
            .send(Method::PUT, &url, &headers, None)
            .await
            .map(|_| ())
    }

    /// `DELETE /v1/nodes/{ident}/traits/{name}`: removes one trait (a
    /// trait the node does not carry is a 404 the caller reads as done).
    pub async fn remove_trait(&self, ident: &str, name: &str) -> Result<(), SourceError> {
        let url = self.trait_url(ident, name).await?;
        let headers = self.headers();
        match self
            .session
            .send(Method::DELETE, &url, &headers, None)
            .await
        {
            Ok(_) | Err(SourceError::Status { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `PUT /v1/nodes/{ident}/states/power` with `{"target": <target>}`
    /// (`rebooting`, `power on`, ...): accepted, not done.
    pub async fn power(&self, ident: &str, target: &str) -> Result<(), SourceError> {
        let url = self.node_url(ident, "states/power").await?;
        let headers = self.headers();
        let body = serde_json::json!({ "target": target });
        self.session
            .send(Method::PUT, &url, &headers, Some(&body))
            .await
            .map(|_| ())
    }

    /// `PUT /v1/nodes/{ident}/states/provision` with `body`
    /// (`{"target": "active", ...}`): accepted, not done. Sent once: a
    /// verb repeated after a lost answer is a second request, which Ironic
    /// refuses or (an inspection ended in between) carries out again.
    pub async fn provision(&self, ident: &str, body: &Value) -> Result<(), SourceError> {
        let url = self.node_url(ident, "states/provision").await?;
        let headers = self.headers();
        self.session
            .send_once(Method::PUT, &url, &headers, Some(body))
            .await
            .map(|_| ())
    }
}

/// The message of an Ironic error body: `{"error_message": "<JSON text>"}`
/// whose string is itself JSON with a `faultstring`.
pub fn error_message(body: &str) -> String {
    let outer: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(_) => return body.to_string(),
    };
    let Some(inner) = outer.get("error_message") else {
        return body.to_string();
    };
    let inner = match inner {
        Value::String(s) => serde_json::from_str::<Value>(s).unwrap_or(Value::String(s.clone())),
        other => other.clone(),
    };
    inner
        .get("faultstring")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| inner.as_str().map(str::to_string))
        .unwrap_or_else(|| inner.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_url_with_and_without_v1() {
        let a = Url::parse("http://127.0.0.1:6385").unwrap();
        let b = Url::parse("http://127.0.0.1:6385/v1/").unwrap();
        assert_eq!(nodes_url(&a).as_str(), "http://127.0.0.1:6385/v1/nodes");
        assert_eq!(nodes_url(&b).as_str(), "http://127.0.0.1:6385/v1/nodes");
        let c = Url::parse("https://h/baremetal/").unwrap();
        assert_eq!(nodes_url(&c).as_str(), "https://h/baremetal/v1/nodes");
    }

    #[test]
    fn error_message_reads_the_double_encoded_body() {
        let body = r#"{"error_message": "{\"faultstring\": \"Node gpu-1 could not be found.\", \"debuginfo\": null}"}"#;
        assert_eq!(error_message(body), "Node gpu-1 could not be found.");
        assert_eq!(error_message("plain"), "plain");
    }
}
