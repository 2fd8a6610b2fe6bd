//! The fabric side of the activities: one site's switches (NVUE), its
//! cable map (NetBox) and its NMX-M, through the clients connector-fabric
//! reads with (`fleet_fabric`), and how their failures become retries or
//! failure codes.

use std::collections::{BTreeMap, BTreeSet};

use fleet_connector::paginate::base_url;
use fleet_connector::{HttpClient, SourceError};
use fleet_domain::fabric_flip::Plane;
use fleet_domain::failure::FailureCode;
use fleet_fabric::netbox::{AuthScheme, Netbox};
use fleet_fabric::nmx::Nmx;
use fleet_fabric::nvue::Nvue;
use reqwest::Url;

use crate::activities::CallError;
use crate::config::{Config, SiteConfig};

/// One site's fabric as the workflows reach it.
pub(crate) struct FabricSite {
    /// NetBox, with the site's switches (required with any switch).
    pub netbox: Option<Netbox>,
    pub netbox_site: String,
    pub nvue: Nvue,
    pub frontend: BTreeMap<String, Url>,
    pub backend: BTreeMap<String, Url>,
    simulated: Vec<String>,
    pub isolate_vrf: String,
    pub maintenance_vrf: String,
    pub tenant_backend_vrf: String,
    pub nmx: Option<Nmx>,
    pub repair_partition: String,
}

/// `name` matches an exact name or a `prefix*` pattern of `patterns`.
fn matches(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| match p.trim().strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => p.trim() == name,
    })
}

impl FabricSite {
    /// The site's fabric, its configuration checked; `None` when it has no
    /// switch and no NMX-M.
    pub fn new(
        site: &str,
        c: &Config,
        sc: &SiteConfig,
        http: &HttpClient,
    ) -> anyhow::Result<Option<FabricSite>> {
        let f = &sc.fabric;
        let key = format!("workflow.sites.{site}.fabric");
        let has_switches = !f.frontend_switches.is_empty() || !f.backend_switches.is_empty();
        if !has_switches && f.nmx_url.trim().is_empty() {
            return Ok(None);
        }
        let netbox = if has_switches {
            let g = &c.fabric;
            let n = &c.netbox;
            anyhow::ensure!(
                !n.url.trim().is_empty(),
                "configuration key workflow.netbox.url is required with {key}'s switches"
            );
            anyhow::ensure!(
                !f.netbox_site.trim().is_empty(),
                "configuration key {key}.netbox_site is required with its switches"
            );
            anyhow::ensure!(
                !g.nvue_username.trim().is_empty() && g.nvue_password.is_configured(),
                "configuration keys workflow.fabric.nvue_username and nvue_password are required with {key}'s switches"
            );
            g.nvue_password.resolve("workflow.fabric.nvue_password")?;
            let scheme = AuthScheme::parse(&n.auth_scheme).map_err(|e| {
                anyhow::anyhow!("configuration key workflow.netbox.auth_scheme: {e}")
            })?;
            if n.token.is_configured() {
                n.token.resolve("workflow.netbox.token")?;
            }
            let base = base_url("workflow.netbox.url", &n.url)?;
            Some(Netbox::new(
                http.clone(),
                &base,
                n.token.clone(),
                "workflow.netbox.token",
                scheme,
            ))
        } else {
            None
        };
        if !f.frontend_switches.is_empty() {
            anyhow::ensure!(
                !f.isolate_vrf.trim().is_empty(),
                "configuration key {key}.isolate_vrf is required with frontend_switches"
            );
        }
        if !f.backend_switches.is_empty() {
            for (field, v) in [
                ("maintenance_vrf", &f.maintenance_vrf),
                ("tenant_backend_vrf", &f.tenant_backend_vrf),
            ] {
                anyhow::ensure!(
                    !v.trim().is_empty(),
                    "configuration key {key}.{field} is required with backend_switches"
                );
            }
        }
        let urls = |field: &str, m: &BTreeMap<String, String>| -> anyhow::Result<_> {
            m.iter()
                .map(|(name, url)| {
                    Ok((
                        name.trim().to_string(),
                        base_url(&format!("{key}.{field}.{name}"), url)?,
                    ))
                })
                .collect::<anyhow::Result<BTreeMap<String, Url>>>()
        };
        let nmx = if f.nmx_url.trim().is_empty() {
            None
        } else {
            anyhow::ensure!(
                !f.repair_partition.trim().is_empty(),
                "configuration key {key}.repair_partition is required with {key}.nmx_url"
            );
            anyhow::ensure!(
                f.nmx_username.trim().is_empty() != f.nmx_password.is_configured(),
                "configuration keys {key}.nmx_username and {key}.nmx_password go together"
            );
            for (field, cred) in [
                ("nmx_password", &f.nmx_password),
                ("nmx_token", &f.nmx_token),
            ] {
                if cred.is_configured() {
                    cred.resolve(&format!("{key}.{field}"))?;
                }
            }
            Some(Nmx {
                http: http.clone(),
                base: base_url(&format!("{key}.nmx_url"), &f.nmx_url)?,
                username: f.nmx_username.trim().to_string(),
                password: f.nmx_password.clone(),
                token: f.nmx_token.clone(),
                key: key.clone(),
            })
        };
        Ok(Some(FabricSite {
            netbox,
            netbox_site: f.netbox_site.trim().to_string(),
            nvue: Nvue {
                http: http.clone(),
                username: c.fabric.nvue_username.trim().to_string(),
                password: c.fabric.nvue_password.clone(),
                password_key: "workflow.fabric.nvue_password".into(),
            },
            frontend: urls("frontend_switches", &f.frontend_switches)?,
            backend: urls("backend_switches", &f.backend_switches)?,
            simulated: f.simulated_switches.clone(),
            isolate_vrf: f.isolate_vrf.trim().to_string(),
            maintenance_vrf: f.maintenance_vrf.trim().to_string(),
            tenant_backend_vrf: f.tenant_backend_vrf.trim().to_string(),
            nmx,
            repair_partition: f.repair_partition.trim().to_string(),
        }))
    }

    /// The plane's switches, by NetBox name.
    pub fn switches(&self, plane: Plane) -> &BTreeMap<String, Url> {
        match plane {
            Plane::Frontend => &self.frontend,
            Plane::Backend => &self.backend,
        }
    }

    pub fn switch_names(&self, plane: Plane) -> BTreeSet<String> {
        self.switches(plane).keys().cloned().collect()
    }

    /// A switch the site lists in `simulated_switches`.
    pub fn simulated(&self, switch: &str) -> bool {
        matches(&self.simulated, switch)
    }
}

/// A fabric system's failure as a step's: an outage is retried, a refusal
/// or a malformed answer ends the device with `code`.
pub(crate) fn fabric_error(e: SourceError, code: FailureCode) -> CallError {
    match &e {
        SourceError::Config(m) => CallError::Permanent(FailureCode::SiteNotConfigured, m.clone()),
        _ if e.is_retryable() => CallError::Transient(code, e.to_string()),
        _ => CallError::Permanent(code, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_switch_patterns() {
        let p = vec!["leaf9*".to_string(), "be01".to_string()];
        assert!(matches(&p, "leaf90"));
        assert!(matches(&p, "be01"));
        assert!(!matches(&p, "be011"));
        assert!(!matches(&p, "leaf01"));
    }

    #[test]
    fn outages_are_retried_refusals_are_not() {
        let url = "http://leaf01/nvue_v1/interface".to_string();
        let code = FailureCode::SwitchVrfFlipFailed;
        assert!(matches!(
            fabric_error(
                SourceError::Status {
                    url: url.clone(),
                    status: 503,
                    body: String::new()
                },
                code
            ),
            CallError::Transient(FailureCode::SwitchVrfFlipFailed, _)
        ));
        assert!(matches!(
            fabric_error(
                SourceError::Status {
                    url,
                    status: 400,
                    body: String::new()
                },
                code
            ),
            CallError::Permanent(FailureCode::SwitchVrfFlipFailed, _)
        ));
        assert!(matches!(
            fabric_error(SourceError::Config("x".into()), code),
            CallError::Permanent(FailureCode::SiteNotConfigured, _)
        ));
    }
}
