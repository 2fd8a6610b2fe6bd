//! Nova's server calls, as the Nova arm of Image Node and Unimage Node
//! makes them with the site's dedicated SLURM credential: read one server,
//! list the project's servers with one exact name, create a server on one
//! Ironic node, delete one server (by its id, never by name).
//! `OpenStack-API-Version: compute 2.74` or later (the create names the
//! node as `hypervisor_hostname`).

use fleet_connector::paginate::{join, with_segments};
use fleet_connector::SourceError;
use reqwest::{Method, Url};
use serde::Deserialize;
use serde_json::Value;

use crate::session::{Session, HEADER_API_VERSION};

/// The fields of one server a workflow decides on.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Server {
    pub id: String,
    #[serde(default)]
    pub name: String,
    /// `BUILD`, `ACTIVE`, `ERROR`, `DELETED`, `SOFT_DELETED`, ...
    #[serde(default)]
    pub status: String,
    /// `deleting` while a delete is in flight.
    #[serde(default, rename = "OS-EXT-STS:task_state")]
    pub task_state: Option<String>,
    #[serde(default)]
    pub fault: Option<Fault>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Fault {
    #[serde(default)]
    pub message: String,
}

/// What the create asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateServer<'a> {
    pub name: &'a str,
    pub image: &'a str,
    pub flavor: &'a str,
    pub network: &'a str,
    pub key_name: &'a str,
    /// The Ironic node the server lands on (Nova's hypervisor host name
    /// of an Ironic node is its uuid).
    pub node: &'a str,
}

impl CreateServer<'_> {
    pub fn body(&self) -> Value {
        serde_json::json!({"server": {
            "name": self.name,
            "imageRef": self.image,
            "flavorRef": self.flavor,
            "networks": [{"uuid": self.network}],
            "key_name": self.key_name,
            "hypervisor_hostname": self.node,
        }})
    }
}

/// Nova at one site, at one microversion (`"compute 2.74"`).
pub struct Nova<'a> {
    pub session: &'a Session,
    pub version: &'a str,
}

impl Nova<'_> {
    async fn servers_url(&self, tail: Option<&str>) -> Result<Url, SourceError> {
        let base = self.session.endpoint("compute").await?;
        let url = join(&base, "servers");
        match tail {
            Some(t) => with_segments(url, &[t], &base),
            None => Ok(url),
        }
    }

    fn headers(&self) -> [(&'static str, String); 1] {
        [(HEADER_API_VERSION, self.version.to_string())]
    }

    /// `GET /servers/{id}`; `None` when Nova has no such server.
    pub async fn server(&self, id: &str) -> Result<Option<Server>, SourceError> {
        #[derive(Deserialize)]
        struct One {
            server: Server,
        }
        let url = self.servers_url(Some(id)).await?;
        match self.session.get_json::<One>(&url, &self.headers()).await {
            Ok(o) => Ok(Some(o.server)),
            Err(SourceError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `GET /servers/detail?name=^<name>$`: the project's servers named
    /// exactly `name` (Nova's filter is a regular expression; the exact
    /// match is checked here again).
    pub async fn servers_named(&self, name: &str) -> Result<Vec<Server>, SourceError> {
        #[derive(Deserialize)]
        struct Many {
            servers: Vec<Server>,
        }
        let mut url = self.servers_url(Some("detail")).await?;
        url.query_pairs_mut()
            .append_pair("name", &format!("^{}$", regex_escape(name)));
        let m: Many = self.session.get_json(&url, &self.headers()).await?;
        Ok(m.servers.into_iter().filter(|s| s.name == name).collect())
    }

    /// `POST /servers`: accepted (202), not built; the new server's id.
    pub async fn create(&self, c: &CreateServer<'_>) -> Result<String, SourceError> {
        let url = self.servers_url(None).await?;
        let text = self
            .session
            .send_once(Method::POST, &url, &self.headers(), Some(&c.body()))
            .await?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| SourceError::malformed(url.as_str(), e.to_string()))?;
        v["server"]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| SourceError::malformed(url.as_str(), "no server.id in the answer"))
    }

    /// `DELETE /servers/{id}`: accepted (204), not gone; a server already
    /// gone is done.
    pub async fn delete(&self, id: &str) -> Result<(), SourceError> {
        let url = self.servers_url(Some(id)).await?;
        match self
            .session
            .send(Method::DELETE, &url, &self.headers(), None)
            .await
        {
            Ok(_) | Err(SourceError::Status { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// `name` as a regular expression matching itself (Nova's `name` filter).
fn regex_escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The exact name a `name` filter of [`Nova::servers_named`] asks for
/// (`^<escaped>$` read back): what a Nova of a test or of `fleet dev`
/// matches servers against.
pub fn name_of_filter(filter: &str) -> String {
    let inner = filter.strip_prefix('^').unwrap_or(filter);
    let inner = inner.strip_suffix('$').unwrap_or(inner);
    let mut out = String::new();
    let mut escaped = false;
    for c in inner.chars() {
        if c == '\\' && !escaped {
            escaped = true;
            continue;
        }
        escaped = false;
        out.push(c);
    }
    out
}

/// The message of a Nova error body (`{"<kind>": {"message": ...}}`, for
/// example `{"itemNotFound": {"code": 404, "message": "..."}}`).
pub fn error_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            v.as_object()?
                .values()
                .find_map(|x| x["message"].as_str().map(str::to_string))
        })
        .unwrap_or_else(|| body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_for_novas_regex_filter_and_read_back() {
        assert_eq!(regex_escape("gpu-001.s1"), "gpu\\-001\\.s1");
        assert_eq!(regex_escape("plain"), "plain");
        for name in ["gpu-001.s1", "plain", "a\\b", "x^y$"] {
            let filter = format!("^{}$", regex_escape(name));
            assert_eq!(name_of_filter(&filter), name);
        }
    }

    #[test]
    fn error_message_reads_nova_faults() {
        let body =
            r#"{"itemNotFound": {"code": 404, "message": "Instance x could not be found."}}"#;
        assert_eq!(error_message(body), "Instance x could not be found.");
        assert_eq!(error_message("plain"), "plain");
    }

    #[test]
    fn the_create_names_the_node() {
        let b = CreateServer {
            name: "gpu-1",
            image: "img",
            flavor: "fl",
            network: "net",
            key_name: "slurm",
            node: "node-uuid",
        }
        .body();
        assert_eq!(b["server"]["hypervisor_hostname"], "node-uuid");
        assert_eq!(b["server"]["networks"][0]["uuid"], "net");
    }
}
