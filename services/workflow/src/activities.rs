//! The activities' side of the external systems: one OpenStack session
//! per configured site (the same client connector-openstack reads with),
//! and how an Ironic or Placement error becomes a retry or a failure code.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, SiteConfig};
use fleet_connector::PollConfig;
use fleet_connector::{ConnectorMetrics, HttpClient, SourceError};
use fleet_domain::failure::FailureCode;
use fleet_openstack::ironic::{error_message, Ironic, Node};
use fleet_openstack::nova::{CreateServer, Nova, Server};
use fleet_openstack::placement::{Placement, Traits};
use fleet_openstack::Session;
use serde_json::{json, Value};

/// What an external call's failure means for the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// May pass: try the step again after a back-off (an outage, a 5xx, a
    /// node locked by a transition in flight); once the tries are spent the
    /// device fails with this (retryable) code.
    Transient(FailureCode, String),
    /// Will not pass by trying again: the device fails with this code.
    Permanent(FailureCode, String),
}

/// The external system a call went to: which codes its failures carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum System {
    Ironic,
    Placement,
    Nova,
}

impl System {
    /// `r` with a failure of this system's read as a step's.
    fn call<T>(self, r: Result<T, SourceError>) -> Result<T, CallError> {
        r.map_err(|e| CallError::from_source(e, self))
    }
}

impl CallError {
    /// A hub command's failure: the hub unavailable or silent is
    /// retryable; a typed refusal is `refused`, with the hub's code and
    /// message.
    pub fn from_hub(e: fleet_hub_client::HubCallError, refused: FailureCode) -> Self {
        use fleet_hub_client::HubCallError as H;
        match e {
            H::Refused {
                code: fleet_proto::ErrorCode::Unavailable,
                message,
            } => CallError::Transient(FailureCode::HubUnavailable, message),
            H::Refused { code, message } => {
                CallError::Permanent(refused, format!("{}: {message}", code.as_str_name()))
            }
            other => CallError::Transient(FailureCode::HubUnavailable, other.to_string()),
        }
    }

    pub fn from_source(e: SourceError, system: System) -> Self {
        use FailureCode as F;
        let (not_found, refused, unavailable, name) = match system {
            System::Ironic => (
                F::IronicNodeNotFound,
                F::IronicRequestRefused,
                F::IronicUnavailable,
                "ironic",
            ),
            System::Placement => (
                F::PlacementResourceProviderNotFound,
                F::PlacementRequestRefused,
                F::PlacementUnavailable,
                "placement",
            ),
            System::Nova => (
                F::NovaServerMissing,
                F::NovaRequestRefused,
                F::NovaUnavailable,
                "nova",
            ),
        };
        let message = |body: &str| match system {
            System::Ironic => error_message(body),
            System::Placement => fleet_openstack::placement::error_message(body),
            System::Nova => fleet_openstack::nova::error_message(body),
        };
        match &e {
            SourceError::Status { status: 404, .. } => {
                CallError::Permanent(not_found, e.to_string())
            }
            // Ironic: NodeLocked, a transition of the node is in flight.
            // Placement: the provider's generation moved on; read again.
            SourceError::Status {
                status: 409, body, ..
            } => CallError::Transient(
                unavailable,
                format!("{name} answered 409: {}", message(body)),
            ),
            SourceError::Status { status, body, .. }
                if *status < 500 && *status != 408 && *status != 429 =>
            {
                CallError::Permanent(
                    refused,
                    format!("{name} answered {status}: {}", message(body)),
                )
            }
            SourceError::Config(m) => CallError::Permanent(F::SiteNotConfigured, m.clone()),
            SourceError::Auth { .. } | SourceError::Malformed { .. } | SourceError::Protocol(_) => {
                CallError::Permanent(refused, e.to_string())
            }
            SourceError::Connect { .. }
            | SourceError::Timeout { .. }
            | SourceError::Status { .. } => CallError::Transient(unavailable, e.to_string()),
        }
    }
}

/// One site's systems and settings.
pub(crate) struct Site {
    pub name: String,
    /// Keystone, Ironic and Placement; `None` at a site configured for the
    /// fabric workflows only.
    session: Option<Session>,
    /// The site's slurmrestd, when configured (it caches the version it
    /// detects, so calls take turns).
    pub slurm: Option<tokio::sync::Mutex<fleet_slurm::Slurmrestd>>,
    pub config: SiteConfig,
    /// The site's switches and NMX-M; `None` without fabric configuration.
    pub fabric: Option<crate::fabric::FabricSite>,
    /// Nova with the dedicated SLURM credential; `None` when
    /// `workflow.sites.<site>.nova` is not configured.
    nova: Option<Session>,
    ironic_version: String,
    placement_version: String,
    nova_version: String,
}

impl Site {
    /// `session`, the site's `workflow.sites.<site>.<key>` credential, or
    /// the failure that it is not configured.
    fn configured<'a>(
        &self,
        session: &'a Option<Session>,
        key: &str,
    ) -> Result<&'a Session, CallError> {
        session.as_ref().ok_or_else(|| {
            CallError::Permanent(
                FailureCode::SiteNotConfigured,
                format!("workflow.sites.{}.{key} is not configured", self.name),
            )
        })
    }

    fn session(&self) -> Result<&Session, CallError> {
        self.configured(&self.session, "openstack")
    }

    fn ironic(&self) -> Result<Ironic<'_>, CallError> {
        Ok(Ironic {
            session: self.session()?,
            version: &self.ironic_version,
        })
    }

    pub async fn node(&self, ident: &str) -> Result<Node, CallError> {
        System::Ironic.call(self.ironic()?.node(ident).await)
    }

    pub async fn patch(&self, uuid: &str, ops: &Value) -> Result<(), CallError> {
        System::Ironic.call(self.ironic()?.patch(uuid, ops).await)
    }

    /// Leases the node to `project` (its `lessee`).
    pub async fn set_lessee(&self, uuid: &str, project: &str) -> Result<(), CallError> {
        let ops = json!([{"op": "add", "path": "/lessee", "value": project}]);
        self.patch(uuid, &ops).await
    }

    /// Whether the node carries `name`: the Placement resource provider's
    /// traits at a site with Placement, the node's own at a standalone one.
    pub async fn has_trait(
        &self,
        uuid: &str,
        placement: bool,
        name: &str,
    ) -> Result<bool, CallError> {
        let traits = if placement {
            self.traits(uuid).await?.traits
        } else {
            System::Ironic.call(self.ironic()?.traits(uuid).await)?
        };
        Ok(traits.iter().any(|t| t == name))
    }

    /// Adds `name` to the node: under the resource provider's generation at
    /// a site with Placement (a lost race is read again), on the node
    /// itself at a standalone one.
    pub async fn add_trait(
        &self,
        uuid: &str,
        placement: bool,
        name: &str,
    ) -> Result<(), CallError> {
        if !placement {
            return System::Ironic.call(self.ironic()?.add_trait(uuid, name).await);
        }
        let mut t = self.traits(uuid).await?;
        if t.traits.iter().any(|x| x == name) {
            return Ok(());
        }
        t.traits.push(name.to_string());
        self.put_traits(uuid, &t).await
    }

    /// Removes `name` from the node: under the resource provider's
    /// generation at a site with Placement, from the node's own traits at a
    /// standalone one.
    pub async fn remove_trait(
        &self,
        uuid: &str,
        placement: bool,
        name: &str,
    ) -> Result<(), CallError> {
        if !placement {
            return System::Ironic.call(self.ironic()?.remove_trait(uuid, name).await);
        }
        let mut t = self.traits(uuid).await?;
        if !t.traits.iter().any(|x| x == name) {
            return Ok(());
        }
        t.traits.retain(|x| x != name);
        self.put_traits(uuid, &t).await
    }

    pub async fn power(&self, uuid: &str, target: &str) -> Result<(), CallError> {
        System::Ironic.call(self.ironic()?.power(uuid, target).await)
    }

    /// Asks Ironic for a provision action, once. A refusal is read back:
    /// a node that already shows the action carries out this run's own
    /// earlier request (sent by a worker killed before it recorded it, or
    /// timed out after Ironic took it), so the step is done and the next
    /// read decides; any other refusal stands.
    pub async fn provision(&self, uuid: &str, body: &Value) -> Result<(), CallError> {
        let ironic = self.ironic()?;
        let Err(refused) = System::Ironic.call(ironic.provision(uuid, body).await) else {
            return Ok(());
        };
        let CallError::Permanent(FailureCode::IronicRequestRefused, _) = &refused else {
            return Err(refused);
        };
        let target = body["target"].as_str().unwrap_or_default();
        let node = self.node(uuid).await?;
        let (state, moving) = (
            node.provision_state.as_deref().unwrap_or(""),
            node.target_provision_state.as_deref().unwrap_or(""),
        );
        if fleet_domain::ironic::shows_action(target, state, moving) {
            tracing::info!(site = %self.name, node = uuid, target, provision_state = state, "ironic refused a provision action the node already shows; taken as done");
            return Ok(());
        }
        Err(refused)
    }

    /// Whether the Nova arm can run here.
    pub fn has_nova(&self) -> bool {
        self.nova.is_some()
    }

    fn nova(&self) -> Result<Nova<'_>, CallError> {
        Ok(Nova {
            session: self.configured(&self.nova, "nova")?,
            version: &self.nova_version,
        })
    }

    /// The server `id`, or `None` when Nova has no such server.
    pub async fn server(&self, id: &str) -> Result<Option<Server>, CallError> {
        System::Nova.call(self.nova()?.server(id).await)
    }

    /// The SLURM project's servers named exactly `name`.
    pub async fn servers_named(&self, name: &str) -> Result<Vec<Server>, CallError> {
        System::Nova.call(self.nova()?.servers_named(name).await)
    }

    pub async fn create_server(&self, c: &CreateServer<'_>) -> Result<String, CallError> {
        System::Nova.call(self.nova()?.create(c).await)
    }

    /// Deletes server `id` with the site's own credential (`openstack`,
    /// an administrator's): a customer's server, which the SLURM
    /// credential cannot see (Move to Test Cluster's `force_reclaim`).
    pub async fn delete_customer_server(&self, id: &str) -> Result<(), CallError> {
        let nova = Nova {
            session: self.session()?,
            version: &self.nova_version,
        };
        System::Nova.call(nova.delete(id).await)
    }

    pub async fn delete_server(&self, id: &str) -> Result<(), CallError> {
        System::Nova.call(self.nova()?.delete(id).await)
    }

    fn placement(&self) -> Result<Placement<'_>, CallError> {
        Ok(Placement {
            session: self.session()?,
            version: &self.placement_version,
        })
    }

    /// The resource provider's traits with their generation.
    pub async fn traits(&self, uuid: &str) -> Result<Traits, CallError> {
        System::Placement.call(self.placement()?.traits(uuid).await)
    }

    /// Replaces the provider's traits under the generation they were read
    /// at (a 409 is transient: the caller reads again).
    pub async fn put_traits(&self, uuid: &str, t: &Traits) -> Result<(), CallError> {
        System::Placement.call(self.placement()?.put_traits(uuid, t).await)
    }

    /// The bind patch of the Ironic-direct Image Node: the run's
    /// `instance_uuid` and the site's image.
    pub fn bind_ops(&self, instance_uuid: &str) -> Value {
        bind_ops(
            instance_uuid,
            &self.config.image_source,
            &self.config.image_checksum,
        )
    }

    /// The body of a provision action to `target`: a deploy (`active`)
    /// carries the config drive (`deploy_body`).
    pub fn provision_body(&self, target: &str) -> Value {
        if target == "active" {
            self.deploy_body()
        } else {
            json!({ "target": target })
        }
    }

    /// `{"target": "active", "configdrive": ...}` with the site's public
    /// keys in the config drive's metadata.
    pub fn deploy_body(&self) -> Value {
        let keys = &self.config.config_drive_public_keys;
        if keys.is_empty() {
            return json!({"target": "active"});
        }
        let public_keys: serde_json::Map<String, Value> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (i.to_string(), Value::String(k.clone())))
            .collect();
        json!({"target": "active", "configdrive": {"meta_data": {"public_keys": public_keys}}})
    }
}

/// An HTTP client with the service's timeouts and a short retry.
fn http_client(c: &Config) -> anyhow::Result<HttpClient> {
    let poll = PollConfig {
        request_timeout: c.request_timeout,
        connect_timeout: c.connect_timeout,
        max_retries: 2,
        backoff_initial: Duration::from_millis(200),
        backoff_max: Duration::from_secs(2),
        ..PollConfig::default()
    };
    HttpClient::new(&poll, ConnectorMetrics::new(), "workflow")
        .map_err(|e| anyhow::anyhow!("workflow http client: {e}"))
}

/// The NetBox a Release re-reads devices from.
pub(crate) struct NetboxClient {
    http: HttpClient,
    base: reqwest::Url,
    token: fleet_runtime::Credential,
    scheme: fleet_netbox::AuthScheme,
}

impl NetboxClient {
    /// `None` when `workflow.netbox.url` is empty.
    pub fn new(c: &crate::config::NetboxConfig, timeouts: &Config) -> anyhow::Result<Option<Self>> {
        if c.url.trim().is_empty() {
            return Ok(None);
        }
        let base = fleet_connector::paginate::base_url("workflow.netbox.url", &c.url)?;
        let scheme = fleet_netbox::AuthScheme::parse(&c.auth_scheme)
            .map_err(|e| anyhow::anyhow!("configuration key workflow.netbox.auth_scheme: {e}"))?;
        // Fail at start, not at the first hand-back, when the token cannot be read.
        c.token.resolve("workflow.netbox.token")?;
        Ok(Some(NetboxClient {
            http: http_client(timeouts)?,
            base,
            token: c.token.clone(),
            scheme,
        }))
    }

    /// The device's NetBox status now; `None` when NetBox has no such
    /// device. An outage is `NETBOX_UNAVAILABLE`, never an inventory verdict.
    pub async fn device_status(&self, id: i64) -> Result<Option<String>, CallError> {
        let token = self
            .token
            .resolve("workflow.netbox.token")
            .map_err(|e| CallError::Permanent(FailureCode::SiteNotConfigured, e.to_string()))?;
        let authorization = token.map(|t| self.scheme.header(t.expose()));
        let netbox = fleet_netbox::Netbox {
            http: &self.http,
            base: &self.base,
            authorization: authorization.as_deref(),
        };
        match netbox.device(id).await {
            Ok(d) => Ok(d.map(|d| d.status.value)),
            Err(e @ (SourceError::Connect { .. } | SourceError::Timeout { .. })) => Err(
                CallError::Transient(FailureCode::NetboxUnavailable, e.to_string()),
            ),
            Err(e @ SourceError::Status { status, .. }) if status >= 500 || status == 429 => Err(
                CallError::Transient(FailureCode::NetboxUnavailable, e.to_string()),
            ),
            Err(e) => Err(CallError::Permanent(
                FailureCode::NetboxUnavailable,
                e.to_string(),
            )),
        }
    }
}

/// The bind patch of an Ironic-direct deploy: the run's `instance_uuid`,
/// the image and its checksum.
pub(crate) fn bind_ops(instance_uuid: &str, image: &str, checksum: &str) -> Value {
    let mut ops = vec![
        json!({"op": "add", "path": "/instance_uuid", "value": instance_uuid}),
        json!({"op": "add", "path": "/instance_info/image_source", "value": image}),
    ];
    if !checksum.trim().is_empty() {
        ops.push(json!({"op": "add", "path": "/instance_info/image_checksum", "value": checksum}));
    }
    Value::Array(ops)
}

/// A slurmrestd failure as a step's.
pub(crate) fn slurm_error(e: SourceError) -> CallError {
    match &e {
        SourceError::Connect { .. } | SourceError::Timeout { .. } => {
            CallError::Transient(FailureCode::SlurmUnavailable, e.to_string())
        }
        SourceError::Status { status, .. }
            if *status >= 500 || *status == 429 || *status == 408 =>
        {
            CallError::Transient(FailureCode::SlurmUnavailable, e.to_string())
        }
        SourceError::Config(m) => CallError::Permanent(FailureCode::SiteNotConfigured, m.clone()),
        _ => CallError::Permanent(FailureCode::SlurmRequestRefused, e.to_string()),
    }
}

/// Every configured site.
pub(crate) struct Sites {
    by_site: HashMap<String, Arc<Site>>,
}

impl Sites {
    pub fn new(c: &Config) -> anyhow::Result<Self> {
        let http = http_client(c)?;
        let mut by_site = HashMap::new();
        for (site, sc) in &c.sites {
            let key = format!("workflow.sites.{site}.openstack");
            let os = &sc.openstack;
            let fabric = crate::fabric::FabricSite::new(site, c, sc, &http)?;
            // A site configured for the fabric workflows or burn-in alone
            // needs no OpenStack.
            let session = if (fabric.is_some() || !sc.slurm.url.trim().is_empty())
                && os.ironic_url.trim().is_empty()
                && os.auth_url.trim().is_empty()
            {
                None
            } else {
                Some(Session::new(site, &key, os, http.clone())?)
            };
            let nova = if sc.nova.is_configured() {
                let key = format!("workflow.sites.{site}.nova.credential");
                Some(Session::new(site, &key, &sc.nova.credential, http.clone())?)
            } else {
                None
            };
            let slurm = if sc.slurm.url.trim().is_empty() {
                None
            } else {
                let key = format!("workflow.sites.{site}.slurm");
                let s = fleet_slurm::Slurmrestd::new(site, &key, &sc.slurm, http.clone())?;
                Some(tokio::sync::Mutex::new(s))
            };
            by_site.insert(
                site.clone(),
                Arc::new(Site {
                    name: site.clone(),
                    session,
                    slurm,
                    fabric,
                    nova,
                    config: sc.clone(),
                    ironic_version: c.ironic_api_version.trim().to_string(),
                    placement_version: format!("placement {}", c.placement_api_version.trim()),
                    nova_version: format!("compute {}", c.nova_api_version.trim()),
                }),
            );
        }
        Ok(Sites { by_site })
    }

    pub fn get(&self, site: &str) -> Option<Arc<Site>> {
        self.by_site.get(site).cloned()
    }
}

/// A new `instance_uuid` (a random, version 4 UUID).
pub(crate) fn mint_instance_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_uuids_are_version_4() {
        let u = mint_instance_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"), "{u}");
        assert_ne!(u, mint_instance_uuid());
    }

    #[test]
    fn ironic_errors_are_retried_or_coded() {
        let status = |status: u16| SourceError::Status {
            url: "http://i/v1/nodes/x".into(),
            status,
            body: r#"{"error_message": "{\"faultstring\": \"Node x is locked by host h\"}"}"#
                .into(),
        };
        assert!(
            matches!(CallError::from_source(status(409), System::Ironic), CallError::Transient(FailureCode::IronicUnavailable, m) if m.contains("locked"))
        );
        assert!(matches!(
            CallError::from_source(status(503), System::Ironic),
            CallError::Transient(FailureCode::IronicUnavailable, _)
        ));
        assert!(matches!(
            CallError::from_source(status(404), System::Ironic),
            CallError::Permanent(FailureCode::IronicNodeNotFound, _)
        ));
        assert!(matches!(
            CallError::from_source(status(400), System::Ironic),
            CallError::Permanent(FailureCode::IronicRequestRefused, _)
        ));
    }
}
