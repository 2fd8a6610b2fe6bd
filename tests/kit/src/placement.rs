//! A Placement of the test's own (wiremock): resource providers with traits and a
//! generation, `GET`/`PUT /placement/resource_providers/{uuid}/traits` as
//! the real one answers them (404 for an unknown provider, 409 when the
//! generation moved on, the `errors` body), and faults on demand: the next
//! `n` requests answering 503, or the next `n` writes losing a race to a
//! concurrent writer. It counts the writes it accepted, so a test can tell
//! a re-run that repeated nothing from one that wrote again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::json;
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::connector::{header, json_body};

#[derive(Default)]
struct Inner {
    providers: HashMap<String, (Vec<String>, i64)>,
    unavailable: u32,
    conflicts: u32,
    writes: usize,
}

#[derive(Clone)]
pub struct FakePlacement {
    /// The Placement endpoint (`.../placement`).
    pub url: String,
    inner: Arc<Mutex<Inner>>,
    /// Served while any clone lives.
    _server: Arc<MockServer>,
}

fn error(status: u16, detail: &str) -> ResponseTemplate {
    let title = http_reason(status);
    ResponseTemplate::new(status)
        .set_body_json(json!({"errors": [{"status": status, "title": title, "detail": detail}]}))
}

fn http_reason(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        404 => "Not Found",
        409 => "Conflict",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// `GET` and `PUT /placement/resource_providers/{uuid}/traits`.
struct Traits(Arc<Mutex<Inner>>);

impl Respond for Traits {
    fn respond(&self, r: &Request) -> ResponseTemplate {
        // Traits need placement 1.6 or later.
        let versioned = header(r, "openstack-api-version")
            .strip_prefix("placement 1.")
            .and_then(|m| m.parse::<u32>().ok())
            .is_some_and(|m| m >= 6);
        if !versioned {
            return error(404, "traits need placement 1.6");
        }
        let uuid = r.url.path().split('/').nth(3).unwrap_or_default();
        let mut s = self.0.lock().unwrap();
        if s.unavailable > 0 {
            s.unavailable -= 1;
            return error(503, "simulated outage");
        }
        if r.method.as_str() == "PUT" {
            return s.write(uuid, r);
        }
        match s.providers.get(uuid) {
            None => error(404, &format!("No resource provider with uuid {uuid} found")),
            Some((traits, generation)) => ResponseTemplate::new(200).set_body_json(
                json!({"traits": traits, "resource_provider_generation": generation}),
            ),
        }
    }
}

impl Inner {
    fn write(&mut self, uuid: &str, r: &Request) -> ResponseTemplate {
        let body = match json_body(r) {
            Ok(b) => b,
            Err(refused) => return refused,
        };
        let (Some(traits), Some(generation)) = (
            body["traits"].as_array(),
            body["resource_provider_generation"].as_i64(),
        ) else {
            return error(400, "traits and resource_provider_generation are required");
        };
        let traits: Vec<String> = traits
            .iter()
            .filter_map(|t| t.as_str().map(str::to_string))
            .collect();
        let lose = self.conflicts > 0;
        if lose {
            self.conflicts -= 1;
        }
        let Some(p) = self.providers.get_mut(uuid) else {
            return error(404, &format!("No resource provider with uuid {uuid} found"));
        };
        if lose {
            // A concurrent writer got there first.
            p.1 += 1;
        }
        if p.1 != generation {
            return error(409, "resource provider generation conflict");
        }
        p.0 = traits;
        p.1 += 1;
        let out = json!({"traits": p.0, "resource_provider_generation": p.1});
        self.writes += 1;
        ResponseTemplate::new(200).set_body_json(out)
    }
}

impl FakePlacement {
    pub async fn start() -> FakePlacement {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let server = MockServer::start().await;
        for verb in ["GET", "PUT"] {
            Mock::given(method(verb))
                .and(path_regex("^/placement/resource_providers/[^/]+/traits$"))
                .respond_with(Traits(inner.clone()))
                .mount(&server)
                .await;
        }
        FakePlacement {
            url: format!("{}/placement", server.uri()),
            inner,
            _server: Arc::new(server),
        }
    }

    /// A provider with these traits (generation 1).
    pub fn provider(&self, uuid: &str, traits: &[&str]) {
        self.inner.lock().unwrap().providers.insert(
            uuid.to_string(),
            (traits.iter().map(|t| t.to_string()).collect(), 1),
        );
    }

    pub fn traits(&self, uuid: &str) -> Option<Vec<String>> {
        self.inner
            .lock()
            .unwrap()
            .providers
            .get(uuid)
            .map(|p| p.0.clone())
    }

    /// Writes accepted so far.
    pub fn writes(&self) -> usize {
        self.inner.lock().unwrap().writes
    }

    /// The next `n` requests answer 503.
    pub fn unavailable(&self, n: u32) {
        self.inner.lock().unwrap().unavailable = n;
    }

    /// The next `n` writes find the generation moved on (409).
    pub fn conflicts(&self, n: u32) {
        self.inner.lock().unwrap().conflicts = n;
    }

    /// The site configuration that points the workflow service at it.
    pub fn site_config(&self) -> fleet_workflow::SiteConfig {
        fleet_workflow::SiteConfig {
            openstack: fleet_openstack::SiteConfig {
                // No Ironic call is made by an impairment; the session
                // needs one endpoint or a Keystone to start.
                ironic_url: "http://127.0.0.1:9/".into(),
                placement_url: self.url.clone(),
                placement_enabled: true,
                ..Default::default()
            },
            ..Default::default()
        }
    }
}
