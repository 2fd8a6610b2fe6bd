//! The device-to-port map from NetBox cables.
//!
//! Contract, switch-side (connector-fabric): `GET <netbox>/api/dcim/
//! interfaces/?site=<slug>&cabled=true&device=<switch>&device=<switch>...
//! &limit=<n>`, `next` followed, token auth as connector-netbox.
//! Device-side (a flip's plan, [`device_port_links`]): the same call with
//! `device=<the device>`: its cabled interfaces, whose far ends on the
//! plane's switches are its ports there. For each interface of a configured switch the
//! far end is `connected_endpoints` (NetBox 3.3+: the path traced through
//! patch panels) when its type is `dcim.interface`, else `link_peers` (the
//! cable's other end) when that is an interface. An end on another
//! configured switch (an inter-switch link), on a device the site's
//! `exclude_peers` names (a spine) or on something that is not an interface
//! (a circuit) is not a device port.

use std::collections::BTreeSet;

use fleet_connector::paginate::join;
use fleet_connector::{HttpClient, SourceError};
pub use fleet_netbox::AuthScheme;
use fleet_runtime::Credential;
use reqwest::Url;
use serde::Deserialize;

pub type InterfacePage = fleet_netbox::Page<Interface>;

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Named {
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Endpoint {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub device: Option<Named>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Interface {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub device: Option<Named>,
    #[serde(default)]
    pub connected_endpoints: Option<Vec<Endpoint>>,
    #[serde(default)]
    pub connected_endpoints_type: Option<String>,
    #[serde(default)]
    pub link_peers: Option<Vec<Endpoint>>,
    #[serde(default)]
    pub link_peers_type: Option<String>,
}

/// One cabled switch port and the device port at its far end.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortLink {
    pub switch: String,
    pub port: String,
    pub device: String,
    pub device_port: String,
}

const INTERFACE: &str = "dcim.interface";

fn name(n: &Option<String>) -> Option<&str> {
    n.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

fn device_name(d: &Option<Named>) -> Option<&str> {
    d.as_ref().and_then(|d| name(&d.name))
}

/// The ends of `eps` when they are interfaces (`t` is `dcim.interface`).
fn interface_ends<'a>(
    eps: &'a Option<Vec<Endpoint>>,
    t: &Option<String>,
) -> Option<Vec<(&'a str, &'a str)>> {
    if t.as_deref() != Some(INTERFACE) {
        return None;
    }
    let v: Vec<(&str, &str)> = eps
        .iter()
        .flatten()
        .filter_map(|e| Some((device_name(&e.device)?, name(&e.name)?)))
        .collect();
    (!v.is_empty()).then_some(v)
}

/// The far ends of one interface, as `(device, port)`.
fn far_ends(i: &Interface) -> Vec<(&str, &str)> {
    interface_ends(&i.connected_endpoints, &i.connected_endpoints_type)
        .or_else(|| interface_ends(&i.link_peers, &i.link_peers_type))
        .unwrap_or_default()
}

/// Each cable of `interfaces` whose near device `near` accepts and whose
/// far device `far` accepts, as `((near, near port), (far, far port))`,
/// sorted by `link`, without duplicates.
fn cabled(
    interfaces: &[Interface],
    near: impl Fn(&str) -> bool,
    far: impl Fn(&str) -> bool,
    link: impl Fn((&str, &str), (&str, &str)) -> PortLink,
) -> Vec<PortLink> {
    let mut out = BTreeSet::new();
    for i in interfaces {
        let (Some(owner), Some(port)) = (device_name(&i.device), name(&i.name)) else {
            continue;
        };
        if !near(owner) {
            continue;
        }
        for end in far_ends(i) {
            if far(end.0) {
                out.insert(link((owner, port), end));
            }
        }
    }
    out.into_iter().collect()
}

fn port_link(switch: &str, port: &str, device: &str, device_port: &str) -> PortLink {
    PortLink {
        switch: switch.to_string(),
        port: port.to_string(),
        device: device.to_string(),
        device_port: device_port.to_string(),
    }
}

/// The device ports cabled to `switches`, sorted, without duplicates;
/// far ends on a device `excluded` names (uplinks to spines) are not
/// device ports.
pub fn port_links(
    interfaces: &[Interface],
    switches: &BTreeSet<String>,
    excluded: impl Fn(&str) -> bool,
) -> Vec<PortLink> {
    cabled(
        interfaces,
        |switch| switches.contains(switch),
        |device| !switches.contains(device) && !excluded(device),
        |(switch, port), (device, device_port)| port_link(switch, port, device, device_port),
    )
}

/// The switch ports `device` is cabled to, as seen from the device's own
/// interfaces: far ends on one of `switches`, sorted, without duplicates.
pub fn device_port_links(
    interfaces: &[Interface],
    device: &str,
    switches: &BTreeSet<String>,
) -> Vec<PortLink> {
    cabled(
        interfaces,
        |owner| owner == device,
        |switch| switches.contains(switch),
        |(device, device_port), (switch, port)| port_link(switch, port, device, device_port),
    )
}

/// A NetBox whose cables map switch ports to devices.
#[derive(Clone)]
pub struct Netbox {
    pub http: HttpClient,
    /// `<netbox>/api/dcim/interfaces/`.
    pub interfaces_url: Url,
    pub token: Credential,
    /// The configuration key of `token`, named in errors.
    pub token_key: String,
    pub scheme: AuthScheme,
    pub page_size: u32,
    pub max_pages: u32,
}

impl Netbox {
    /// A NetBox at `base` (its configured URL).
    pub fn new(
        http: HttpClient,
        base: &Url,
        token: Credential,
        token_key: &str,
        scheme: AuthScheme,
    ) -> Self {
        Netbox {
            http,
            interfaces_url: join(base, "api/dcim/interfaces/"),
            token,
            token_key: token_key.to_string(),
            scheme,
            page_size: 1000,
            max_pages: 1000,
        }
    }

    fn auth(&self) -> Result<Option<String>, SourceError> {
        Ok(crate::secret(&self.token, &self.token_key)?.map(|t| self.scheme.header(&t)))
    }

    /// The cabled interfaces of `devices` at `site` (`next` followed).
    pub async fn cabled_interfaces(
        &self,
        site: &str,
        devices: impl IntoIterator<Item = &str>,
    ) -> Result<Vec<Interface>, SourceError> {
        let auth = self.auth()?;
        let mut first = self.interfaces_url.clone();
        {
            let mut q = first.query_pairs_mut();
            q.append_pair("site", site).append_pair("cabled", "true");
            for d in devices {
                q.append_pair("device", d);
            }
            q.append_pair("limit", &self.page_size.clamp(1, 1000).to_string());
        }
        fleet_netbox::list(&self.http, first, self.max_pages, auth.as_deref()).await
    }

    /// Every device port cabled to `switches` at `site` (far ends on an
    /// `excluded` device are not device ports).
    pub async fn switch_links(
        &self,
        site: &str,
        switches: &BTreeSet<String>,
        excluded: impl Fn(&str) -> bool,
    ) -> Result<Vec<PortLink>, SourceError> {
        let interfaces = self
            .cabled_interfaces(site, switches.iter().map(String::as_str))
            .await?;
        Ok(port_links(&interfaces, switches, excluded))
    }

    /// The ports of `device` on `switches` at `site`.
    pub async fn device_links(
        &self,
        site: &str,
        device: &str,
        switches: &BTreeSet<String>,
    ) -> Result<Vec<PortLink>, SourceError> {
        let interfaces = self.cabled_interfaces(site, [device]).await?;
        Ok(device_port_links(&interfaces, device, switches))
    }
}

#[cfg(test)]
mod tests {
    use super::port_link as link;
    use super::*;
    use serde_json::{json, Value};

    const SAMPLE: &str = include_str!("../testdata/netbox-interfaces-cabled.json");

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn interfaces(results: Value) -> Vec<Interface> {
        serde_json::from_value::<InterfacePage>(json!({ "results": results }))
            .unwrap()
            .results
    }

    /// Interface `name` of `device`, whose `via` (`connected_endpoints` or
    /// `link_peers`) is interface `peer_port` of `peer`.
    fn cabled_to(device: &str, name: &str, via: &str, peer: &str, peer_port: &str) -> Value {
        let via_type = format!("{via}_type");
        json!({"name": name, "device": {"name": device},
               via: [{"name": peer_port, "device": {"name": peer}}],
               via_type: "dcim.interface"})
    }

    #[test]
    fn the_sample_page() {
        let page: InterfacePage = serde_json::from_str(SAMPLE).unwrap();
        let switches = set(&["leaf01", "leaf02", "spine01"]);
        assert_eq!(
            port_links(&page.results, &switches, |_| false),
            vec![
                // Direct cable.
                link("leaf01", "swp1", "gpu-a1-01", "eth0"),
                // Through a patch panel: the traced endpoint, not the panel.
                link("leaf01", "swp2", "gpu-a1-02", "eth0"),
                link("leaf02", "swp1", "gpu-a1-01", "eth1"),
                // The spine uplink and the circuit are not device ports.
            ]
        );
        // A switch not configured for this plane contributes nothing.
        let only = set(&["leaf02"]);
        assert_eq!(
            port_links(&page.results, &only, |_| false),
            vec![
                link("leaf02", "swp1", "gpu-a1-01", "eth1"),
                link("leaf02", "swp31", "spine01", "swp1"),
            ]
        );
        assert_eq!(
            port_links(&page.results, &only, |d| d.starts_with("spine")),
            vec![link("leaf02", "swp1", "gpu-a1-01", "eth1")]
        );
    }

    #[test]
    fn a_devices_own_interfaces_name_its_switch_ports() {
        let results = interfaces(json!([
            cabled_to("gpu-a1-01", "eth0", "connected_endpoints", "leaf01", "swp1"),
            cabled_to("gpu-a1-01", "eth1", "link_peers", "leaf02", "swp1"),
            cabled_to("gpu-a1-01", "ens1f0", "connected_endpoints", "be01", "swp7"),
            cabled_to("gpu-a1-02", "eth0", "connected_endpoints", "leaf01", "swp2"),
        ]));
        assert_eq!(
            device_port_links(&results, "gpu-a1-01", &set(&["leaf01", "leaf02"])),
            vec![
                link("leaf01", "swp1", "gpu-a1-01", "eth0"),
                link("leaf02", "swp1", "gpu-a1-01", "eth1"),
            ]
        );
        assert_eq!(
            device_port_links(&results, "gpu-a1-01", &set(&["be01"])),
            vec![link("be01", "swp7", "gpu-a1-01", "ens1f0")]
        );
    }

    #[test]
    fn older_and_partial_shapes() {
        // Only link_peers (connected_endpoints missing), names with blanks.
        let results = interfaces(json!([
            cabled_to("leaf01", "swp7", "link_peers", "gpu-b1-01", "eth3"),
            {"name": " ", "device": {"name": "leaf01"}},
            {"name": "swp8", "device": null},
            cabled_to("leaf01", "swp9", "connected_endpoints", "", "eth0"),
        ]));
        assert_eq!(
            port_links(&results, &set(&["leaf01"]), |_| false),
            vec![link("leaf01", "swp7", "gpu-b1-01", "eth3")]
        );
        for body in [r#"{"results": {}}"#, r#"{"count": 1}"#, "nope"] {
            assert!(
                serde_json::from_str::<InterfacePage>(body).is_err(),
                "{body}"
            );
        }
    }
}
