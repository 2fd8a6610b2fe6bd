//! A Placement of the test's own: resource providers with traits and a
//! generation, `GET`/`PUT /placement/resource_providers/{uuid}/traits` as
//! the real one answers them (404 for an unknown provider, 409 when the
//! generation moved on, the `errors` body), and faults on demand: the next
//! `n` requests answering 503, or the next `n` writes losing a race to a
//! concurrent writer. It counts the writes it accepted, so a test can tell
//! a re-run that repeated nothing from one that wrote again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

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
    task: Arc<tokio::task::JoinHandle<()>>,
}

fn error(status: StatusCode, detail: &str) -> Response {
    (
        status,
        Json(json!({"errors": [{"status": status.as_u16(), "title": status.canonical_reason(), "detail": detail}]})),
    )
        .into_response()
}

type S = State<Arc<Mutex<Inner>>>;

fn versioned(h: &HeaderMap) -> bool {
    let v = h
        .get("openstack-api-version")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // Traits need placement 1.6 or later.
    v.strip_prefix("placement 1.")
        .and_then(|m| m.parse::<u32>().ok())
        .is_some_and(|m| m >= 6)
}

async fn read(State(s): S, Path(uuid): Path<String>, h: HeaderMap) -> Response {
    if !versioned(&h) {
        return error(StatusCode::NOT_FOUND, "traits need placement 1.6");
    }
    let mut s = s.lock().unwrap();
    if s.unavailable > 0 {
        s.unavailable -= 1;
        return error(StatusCode::SERVICE_UNAVAILABLE, "simulated outage");
    }
    match s.providers.get(&uuid) {
        None => error(
            StatusCode::NOT_FOUND,
            &format!("No resource provider with uuid {uuid} found"),
        ),
        Some((traits, generation)) => {
            Json(json!({"traits": traits, "resource_provider_generation": generation}))
                .into_response()
        }
    }
}

async fn write(
    State(s): S,
    Path(uuid): Path<String>,
    h: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if !versioned(&h) {
        return error(StatusCode::NOT_FOUND, "traits need placement 1.6");
    }
    let mut s = s.lock().unwrap();
    if s.unavailable > 0 {
        s.unavailable -= 1;
        return error(StatusCode::SERVICE_UNAVAILABLE, "simulated outage");
    }
    let (Some(traits), Some(generation)) = (
        body["traits"].as_array(),
        body["resource_provider_generation"].as_i64(),
    ) else {
        return error(
            StatusCode::BAD_REQUEST,
            "traits and resource_provider_generation are required",
        );
    };
    let traits: Vec<String> = traits
        .iter()
        .filter_map(|t| t.as_str().map(str::to_string))
        .collect();
    let lose = s.conflicts > 0;
    if lose {
        s.conflicts -= 1;
    }
    let Some(p) = s.providers.get_mut(&uuid) else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("No resource provider with uuid {uuid} found"),
        );
    };
    if lose {
        // A concurrent writer got there first.
        p.1 += 1;
    }
    if p.1 != generation {
        return error(
            StatusCode::CONFLICT,
            "resource provider generation conflict",
        );
    }
    p.0 = traits;
    p.1 += 1;
    let out = json!({"traits": p.0, "resource_provider_generation": p.1});
    s.writes += 1;
    Json(out).into_response()
}

impl FakePlacement {
    pub async fn start() -> FakePlacement {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route(
                "/placement/resource_providers/{uuid}/traits",
                get(read).put(write),
            )
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/placement", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        FakePlacement {
            url,
            inner,
            task: Arc::new(task),
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

impl Drop for FakePlacement {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}
