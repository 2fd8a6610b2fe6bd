//! connector-borneo: the partner custody API. For each configured site (a
//! fleet site and its Borneo partner) an OAuth2 client-credentials token
//! (cached, refreshed before expiry and after a 401), then `GET
//! <url>/v1/partners/{partner}/machines?page_size=&page_token=` until the
//! last page, and one custody snapshot per machine (source `borneo`, key
//! kind `serial`, the `CustodyMirror`). The hub does the custody logic
//! (delegated, the `HandoverBreach` latch, lazy backfill, drained, the
//! partner-owned credential reference). The credential is kept only as a
//! reference and never logged ([`mapping`]).

mod config;
pub use config::Config;
pub(crate) mod mapping;
pub(crate) mod oauth;

use fleet_connector::paginate::{base_url, join, Pages};
use fleet_connector::{HttpClient, PollContext, Scope, Section, SourceError, Target};
use fleet_domain::Source;
use fleet_proto::v1;
use fleet_runtime::{Common, Shutdown};
use reqwest::Url;

use crate::mapping::{map_machine, parse_page, Machine, Warning};
use crate::oauth::OAuth;

/// Borneo owns no condition types: an unreadable API publishes nothing and
/// the custody mirrors stay as they are.
pub(crate) const OUTAGE_REASON: &str = "BorneoUnreachable";

/// One site's partner.
pub(crate) struct BorneoSite {
    site: String,
    partner: String,
    machines_url: Url,
    page_size: u32,
    max_pages: u32,
    oauth: OAuth,
    http: HttpClient,
}

/// `<url>/v1/partners/<partner>/machines`, the partner id path-escaped.
pub(crate) fn machines_url(base: &Url, partner: &str) -> Url {
    let mut u = join(base, "v1/partners");
    if let Ok(mut segs) = u.path_segments_mut() {
        segs.pop_if_empty().push(partner).push("machines");
    }
    u
}

impl BorneoSite {
    pub fn new(site: &str, partner: &str, c: &Config, http: HttpClient) -> anyhow::Result<Self> {
        let key = "connectors.borneo";
        anyhow::ensure!(
            !partner.trim().is_empty(),
            "configuration key {key}.sites.{site}: the partner id is empty"
        );
        for (field, v) in [
            ("url", &c.url),
            ("token_url", &c.token_url),
            ("client_id", &c.client_id),
        ] {
            anyhow::ensure!(
                !v.trim().is_empty(),
                "configuration key {key}.{field} is required"
            );
        }
        anyhow::ensure!(
            c.client_secret.is_configured(),
            "configuration key {key}.client_secret is required (value, file or env)"
        );
        c.client_secret.resolve(&format!("{key}.client_secret"))?;
        let base = base_url(&format!("{key}.url"), &c.url)?;
        let token_url = base_url(&format!("{key}.token_url"), &c.token_url)?;
        Ok(BorneoSite {
            site: site.to_string(),
            partner: partner.trim().to_string(),
            machines_url: machines_url(&base, partner.trim()),
            page_size: c.page_size.clamp(1, 10_000),
            max_pages: c.poll.max_pages,
            oauth: OAuth {
                token_url,
                client_id: c.client_id.trim().to_string(),
                client_secret: c.client_secret.clone(),
                scope: c.scope.clone(),
                cached: None,
            },
            http,
        })
    }

    fn page_url(&self, token: Option<&str>) -> Url {
        let mut u = self.machines_url.clone();
        {
            let mut q = u.query_pairs_mut();
            q.append_pair("page_size", &self.page_size.to_string());
            if let Some(t) = token {
                q.append_pair("page_token", t);
            }
        }
        u
    }

    /// One page; a 401 re-issues the token once.
    async fn page(&mut self, url: &Url) -> Result<(mapping::Page, Vec<Warning>), SourceError> {
        let mut refreshed = false;
        loop {
            let token = self.oauth.token(&self.http, refreshed).await?;
            let r = self
                .http
                .send(url.as_str(), |c| {
                    c.get(url.clone())
                        .header("Accept", "application/json")
                        .bearer_auth(&token)
                })
                .await;
            match r {
                Ok(resp) => {
                    let bytes = resp
                        .bytes()
                        .await
                        .map_err(|e| self.http.transport(url.as_str(), &e))?;
                    return parse_page(&bytes, &self.partner)
                        .map_err(|m| SourceError::malformed(url.as_str(), m));
                }
                Err(e) if e.is_unauthorized() && !refreshed => {
                    tracing::info!(site = %self.site, url = %url, "borneo token refused; re-issuing");
                    self.oauth.invalidate();
                    refreshed = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn read(&mut self) -> Result<(Vec<Machine>, Vec<Warning>), SourceError> {
        let first = self.page_url(None);
        let mut pages = Pages::new(&first, self.max_pages);
        let mut url = first;
        let mut machines = Vec::new();
        let mut warnings = Vec::new();
        loop {
            let (page, w) = self.page(&url).await?;
            machines.extend(page.machines);
            warnings.extend(w);
            let next = page
                .next_page_token
                .map(|t| self.page_url(Some(&t)).to_string());
            match pages.next(next.as_deref())? {
                Some(u) => url = u,
                None => return Ok((machines, warnings)),
            }
        }
    }
}

impl Target for BorneoSite {
    fn scope(&self) -> Scope<'_> {
        Scope::new(Source::Borneo, &self.site, OUTAGE_REASON)
    }

    async fn poll(
        &mut self,
        ctx: PollContext<'_>,
    ) -> Result<Vec<v1::ConditionSnapshot>, SourceError> {
        let (machines, warnings) = self.read().await?;
        for w in &warnings {
            // Positions and serials only: never a body value.
            match w {
                Warning::NoSerial { index } => {
                    tracing::warn!(site = %self.site, partner = %self.partner, index, "borneo machine without a serial; skipped")
                }
                Warning::NoState { index, serial } => {
                    tracing::warn!(site = %self.site, partner = %self.partner, index, serial = %serial, "borneo machine without a state; skipped")
                }
                Warning::BadStateChangedAt { serial } => {
                    tracing::warn!(site = %self.site, partner = %self.partner, serial = %serial, "borneo state_changed_at is not an RFC 3339 time; sent without it")
                }
                Warning::UnmodelledState { serial, state } => {
                    tracing::warn!(site = %self.site, partner = %self.partner, serial = %serial, state = %state, "borneo custody state outside the hub's vocabulary (GOOGLE_OWNED, PARTNER_OWNED, DRAINED); the machine is not published, its last custody stands")
                }
                Warning::NoCredential { serial } => {
                    tracing::warn!(site = %self.site, partner = %self.partner, serial = %serial, "borneo PARTNER_OWNED machine without a credential")
                }
            }
            ctx.metrics.warning(Source::Borneo.as_str(), w.kind());
        }
        Ok(machines
            .iter()
            .map(|m| map_machine(&self.site, m, ctx.observed_at))
            .collect())
    }
}

pub(crate) fn targets(c: &Config, http: &HttpClient) -> anyhow::Result<Vec<BorneoSite>> {
    fleet_connector::per_site("borneo", &c.sites, |(site, partner)| {
        BorneoSite::new(site, partner, c, http.clone())
    })
}

/// Runs the connector with its section (`connectors.borneo`) until shutdown.
pub async fn run(common: Common, c: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let section = Section::new(Source::Borneo, "borneo", &c.listen, &c.poll);
    fleet_connector::serve(&common, section, shutdown, |h| targets(&c, h)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_runtime::config::Credential;
    use fleet_runtime::config::Secret;

    fn http() -> HttpClient {
        HttpClient::with_defaults("borneo").unwrap()
    }

    #[test]
    fn configuration_errors_name_their_key_and_urls() {
        let full = Config {
            url: "https://borneo.example.com/api".into(),
            token_url: "https://auth.example.com/oauth2/token".into(),
            client_id: "fleet".into(),
            client_secret: Credential {
                value: Secret::new("shh"),
                ..Default::default()
            },
            ..Default::default()
        };
        let err = |c: Config| {
            BorneoSite::new("s1", "partner-1", &c, http())
                .err()
                .unwrap()
                .to_string()
        };
        assert!(err(Config::default()).contains("connectors.borneo.url"));
        let e = err(Config {
            client_secret: Credential::default(),
            ..full.clone()
        });
        assert!(e.contains("connectors.borneo.client_secret"), "{e}");
        assert!(!e.contains("shh"));
        let e = BorneoSite::new("s1", " ", &full, http())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("sites.s1"), "{e}");
        let ok = BorneoSite::new("s1", "partner/1", &full, http()).unwrap();
        assert_eq!(
            ok.machines_url.as_str(),
            "https://borneo.example.com/api/v1/partners/partner%2F1/machines"
        );
        assert_eq!(
            ok.page_url(Some("a b")).as_str(),
            "https://borneo.example.com/api/v1/partners/partner%2F1/machines?page_size=500&page_token=a+b"
        );
    }
}
