//! connector-borneo against a fake partner custody API and OAuth2 token
//! endpoint, through the hub: custody entry (delegated and the
//! `HandoverBreach` latch in one transaction), no re-log on the next poll,
//! the partner-owned credential kept as a reference only, drained; token
//! caching and refresh; outages publish nothing; the credential never
//! reaches a message, a metric or a log.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use fleet_latch::{Latch, LatchWrite, LatchWriter};
use fleet_proto::v1;
use fleet_proto::v1::condition_snapshot::Mirror;
use fleet_runtime::config::{Credential, Secret};
use wiremock::{Request, ResponseTemplate};

use crate::support::*;

const CLIENT_ID: &str = "fleet-custody";
const CLIENT_SECRET: &str = "oauth-client-s3cret-value";
const PARTNER: &str = "partner-1";
/// The partner-owned machine's credential: must never leave the connector.
const BMC_PASSWORD: &str = "bmc-Pa55w0rd-never-logged";

pub struct BorneoFake {
    issued: Mutex<u32>,
    valid_token: Mutex<String>,
    pub machines: Mutex<Vec<serde_json::Value>>,
    /// A 200 body to send instead of the page (a broken one).
    pub raw_body: Mutex<Option<String>>,
}

impl BorneoFake {
    pub fn new(machines: Vec<serde_json::Value>) -> Self {
        BorneoFake {
            issued: Mutex::new(0),
            valid_token: Mutex::new(String::new()),
            machines: Mutex::new(machines),
            raw_body: Mutex::new(None),
        }
    }

    pub fn issued(&self) -> u32 {
        *self.issued.lock().unwrap()
    }

    /// The partner revokes the current token.
    pub fn revoke(&self) {
        self.valid_token.lock().unwrap().clear();
    }

    /// The OAuth2 token endpoint: client credentials in basic auth.
    fn token(&self, r: &Request) -> ResponseTemplate {
        let want = format!(
            "Basic {}",
            base64(format!("{CLIENT_ID}:{CLIENT_SECRET}").as_bytes())
        );
        if header(r, "authorization") != want {
            return json(
                401,
                serde_json::json!({"error": "invalid_client", "error_description": "client authentication failed"}),
            );
        }
        let body = String::from_utf8_lossy(&r.body);
        if !header(r, "content-type").starts_with("application/x-www-form-urlencoded")
            || !body
                .split('&')
                .any(|kv| kv == "grant_type=client_credentials")
        {
            return json(400, serde_json::json!({"error": "unsupported_grant_type"}));
        }
        let n = {
            let mut i = self.issued.lock().unwrap();
            *i += 1;
            *i
        };
        let t = format!("borneo-access-token-{n}-opaque");
        *self.valid_token.lock().unwrap() = t.clone();
        json(
            200,
            serde_json::json!({"access_token": t, "token_type": "Bearer", "expires_in": 3600}),
        )
    }

    /// `/custody/v1/partners/{partner}/machines?page_size=&page_token=`.
    fn machines(&self, r: &Request) -> ResponseTemplate {
        let valid = self.valid_token.lock().unwrap().clone();
        if valid.is_empty() || header(r, "authorization") != format!("Bearer {valid}") {
            return json(
                401,
                serde_json::json!({"error": {"code": 401, "message": "Request had invalid authentication credentials.", "status": "UNAUTHENTICATED"}}),
            );
        }
        let partner = r.url.path().split('/').nth(4).unwrap_or_default();
        if partner != PARTNER {
            return json(
                404,
                serde_json::json!({"error": {"code": 404, "message": format!("partner {partner} not found")}}),
            );
        }
        if let Some(raw) = self.raw_body.lock().unwrap().clone() {
            return ResponseTemplate::new(200).set_body_raw(raw, "application/json");
        }
        let size: usize = param(r, "page_size")
            .and_then(|s| s.parse().ok())
            .unwrap_or(100);
        let start: usize = param(r, "page_token")
            .and_then(|t| t.strip_prefix("o").and_then(|s| s.parse().ok()))
            .unwrap_or(0);
        let all = self.machines.lock().unwrap().clone();
        let page: Vec<_> = all.iter().skip(start).take(size).cloned().collect();
        let next = if start + size < all.len() {
            format!("o{}", start + size)
        } else {
            String::new()
        };
        json(
            200,
            serde_json::json!({"machines": page, "next_page_token": next}),
        )
    }
}

pub async fn borneo_fake(fake: BorneoFake) -> (FakeHttp, Arc<BorneoFake>) {
    let fake = Arc::new(fake);
    let http = FakeHttp::start().await;
    http.route("POST", "^/oauth2/token$", with(&fake, BorneoFake::token))
        .await;
    let machines = "^/custody/v1/partners/[^/]+/machines$";
    http.route("GET", machines, with(&fake, BorneoFake::machines))
        .await;
    (http, fake)
}

fn machine(serial: &str, state: &str) -> serde_json::Value {
    serde_json::json!({"serial": serial, "state": state, "state_changed_at": "2026-11-28T09:14:02Z"})
}

fn partner_owned(serial: &str) -> serde_json::Value {
    serde_json::json!({"serial": serial, "state": "PARTNER_OWNED", "state_changed_at": "2026-11-27T22:40:11Z",
        "credential": {"id": "cred-7f3a91", "username": "bmc-admin", "password": BMC_PASSWORD}})
}

fn borneo_config(url: &str, listen: &str) -> fleet_connector_borneo::Config {
    let mut config = fleet_connector_borneo::Config::default();
    let c = &mut config;
    c.listen = listen.into();
    c.poll = fast_poll();
    c.url = format!("{url}/custody");
    c.token_url = format!("{url}/oauth2/token");
    c.client_id = CLIENT_ID.into();
    c.client_secret = Credential {
        value: Secret::new(CLIENT_SECRET),
        ..Default::default()
    };
    c.page_size = 2;
    c.sites.insert("s1".into(), PARTNER.into());
    config
}

/// Runs the connector against `url`, its ops server on a free port (returned,
/// for `/metrics`).
fn run_borneo(env: &TestEnv, url: &str) -> (Running, u16) {
    let port = free_port();
    let config = borneo_config(url, &format!("127.0.0.1:{port}"));
    (
        Running::spawn(env, config, fleet_connector_borneo::run),
        port,
    )
}

async fn create_with_serial(env: &TestEnv, name: &str, serial: &str) -> String {
    env.create_device_with(v1::CreateDevice {
        site: "s1".into(),
        name: name.into(),
        serial: serial.into(),
        ..Default::default()
    })
    .await
}

/// `(operational_status, latch status, latch reason)` read in one statement.
async fn custody_view(env: &TestEnv, id: &str) -> (String, Option<String>, Option<String>) {
    sqlx::query_as(
        "SELECT d.operational_status, c.status, c.reason FROM devices d \
         LEFT JOIN device_conditions c ON c.device_id = d.id AND c.type = 'FrontendPortsInCustomerVrf' \
         WHERE d.id = $1",
    )
    .bind(id)
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

/// Waits until the hub has applied `n` more Borneo polls to `id`.
async fn polls_applied(env: &TestEnv, id: &str, n: usize) {
    let mut last = observed_at(env, id, "borneo").await;
    for i in 0..n {
        last = Some(
            eventually(&format!("borneo poll {i} applied"), || async {
                let now = observed_at(env, id, "borneo").await;
                (now.is_some() && now != last).then_some(now.unwrap())
            })
            .await,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn borneo_custody_through_the_hub_breach_once_no_relog_credential_reference_drained() {
    let env = TestEnv::new().await;
    let hub = HubTask::start(&env).await;
    let entering = create_with_serial(&env, "gpu-c1-01", "SN-GB200-0001").await;
    let partner = create_with_serial(&env, "gpu-c1-02", "SN-GB200-0002").await;
    let drained = create_with_serial(&env, "gpu-c1-03", "SN-GB200-0003").await;
    let verified = create_with_serial(&env, "gpu-c1-04", "SN-GB200-0004").await;
    // A verified front-end flip is on record for gpu-c1-04 before custody.
    let writer = LatchWriter::new(env.nats.clone(), env.subjects.clone(), "test:frontend-flip");
    let flip = LatchWrite::new(
        Latch::FrontendVrf,
        LatchWrite::device_id(&verified),
        "CustomerVrfFlipVerified",
        "leaf01:swp1 read back in cust-0042",
        micros(Utc::now()),
    )
    .unwrap();
    writer.write(&flip).await.unwrap();

    let (control, fake) = borneo_fake(BorneoFake::new(vec![
        machine("SN-GB200-0001", "GOOGLE_OWNED"),
        partner_owned("SN-GB200-0002"),
        machine("SN-GB200-0003", "DRAINED"),
        machine("SN-GB200-0004", "GOOGLE_OWNED"),
        machine("SN-UNKNOWN-9", "GOOGLE_OWNED"),
    ]))
    .await;
    let (connector, port) = run_borneo(&env, &control.url());

    // Delegated and the HandoverBreach latch appear together: no read
    // ever sees one without the other.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, latch, reason) = custody_view(&env, &entering).await;
        if status == "delegated" {
            assert_eq!(
                (latch.as_deref(), reason.as_deref()),
                (Some("Unknown"), Some("HandoverBreach")),
                "the latch is written in the custody entry's transaction"
            );
            break;
        }
        assert!(latch.is_none(), "a latch before custody entry");
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for delegated"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let source: String = sqlx::query_scalar(
        "SELECT source FROM device_conditions WHERE device_id = $1 AND type = 'FrontendPortsInCustomerVrf'",
    )
    .bind(&entering)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(source, "borneo");
    eventually("drained and partner-owned", || async {
        let d = env.device_field(&drained, "operational_status").await;
        let c: Option<String> = sqlx::query_scalar("SELECT custody FROM devices WHERE id = $1")
            .bind(&partner)
            .fetch_one(&env.pool)
            .await
            .unwrap();
        (d == "drained" && c.as_deref() == Some("PARTNER_OWNED")).then_some(())
    })
    .await;
    assert_eq!(
        env.device_field(&partner, "custody_credential_ref").await,
        "borneo:cred-7f3a91"
    );
    assert_eq!(
        env.device_field(&partner, "operational_status").await,
        "unknown",
        "PARTNER_OWNED changes no status"
    );
    // A verified flip on record: delegated without a breach, latch kept.
    eventually("gpu-c1-04 delegated", || async {
        (env.device_field(&verified, "operational_status").await == "delegated").then_some(())
    })
    .await;
    assert_eq!(
        condition_row(&env, &verified, "FrontendPortsInCustomerVrf")
            .await
            .unwrap(),
        (
            "True".into(),
            "CustomerVrfFlipVerified".into(),
            "leaf01:swp1 read back in cust-0042".into()
        )
    );
    // The serial inventory does not know: kept, not dropped.
    eventually("unresolved serial", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM unresolved_observations WHERE source = 'borneo' AND key_kind = 'serial' AND key = 'SN-UNKNOWN-9'",
        )
        .fetch_one(&env.pool)
        .await
        .unwrap();
        (n == 1).then_some(())
    })
    .await;

    // A second identical poll changes nothing: version, lifecycle rows,
    // events and the latch row all stay as they were.
    let snapshot_of = || async {
        let version: i64 = env
            .device_field(&entering, "version")
            .await
            .parse()
            .unwrap();
        let lifecycle: i64 =
            sqlx::query_scalar("SELECT count(*) FROM device_lifecycle_events WHERE device_id = $1")
                .bind(&entering)
                .fetch_one(&env.pool)
                .await
                .unwrap();
        let latch: (String, String, DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
            "SELECT status, reason, observed_at, received_at FROM device_conditions WHERE device_id = $1 AND type = 'FrontendPortsInCustomerVrf'",
        )
        .bind(&entering)
        .fetch_one(&env.pool)
        .await
        .unwrap();
        (version, lifecycle, latch)
    };
    // Let the first application's events reach STATUS.
    polls_applied(&env, &entering, 1).await;
    let before = snapshot_of().await;
    let events_before = eventually("status events relayed and settled", || async {
        let n = status_events(&env, &entering).await.len();
        tokio::time::sleep(Duration::from_millis(300)).await;
        (n > 0 && n == status_events(&env, &entering).await.len()).then_some(n)
    })
    .await;
    let kinds: Vec<String> = sqlx::query_scalar(
        "SELECT kind || '=' || value FROM device_lifecycle_events WHERE device_id = $1 ORDER BY id",
    )
    .bind(&entering)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert!(
        kinds.contains(&"operational=delegated".to_string()),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&"custody=GOOGLE_OWNED".to_string()),
        "{kinds:?}"
    );
    polls_applied(&env, &entering, 3).await;
    assert_eq!(
        snapshot_of().await,
        before,
        "later identical polls change nothing"
    );
    assert_eq!(
        status_events(&env, &entering).await.len(),
        events_before,
        "no new events"
    );

    // One token for all of that; a revoked token is re-issued once.
    assert_eq!(fake.issued(), 1, "the token is cached");
    fake.revoke();
    eventually("token re-issued", || async {
        (fake.issued() == 2).then_some(())
    })
    .await;
    polls_applied(&env, &entering, 1).await;
    assert_eq!(fake.issued(), 2);

    // The credential is nowhere: not in a row, an event, an unresolved
    // payload, the outbox or the connector's metrics.
    let hits: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM devices d WHERE row_to_json(d)::text LIKE '%' || $1 || '%') \
         + (SELECT count(*) FROM device_conditions c WHERE row_to_json(c)::text LIKE '%' || $1 || '%') \
         + (SELECT count(*) FROM device_lifecycle_events e WHERE row_to_json(e)::text LIKE '%' || $1 || '%') \
         + (SELECT count(*) FROM unresolved_observations u WHERE position(convert_to($1, 'UTF8') in u.payload) > 0) \
         + (SELECT count(*) FROM outbox o WHERE position(convert_to($1, 'UTF8') in o.payload) > 0)",
    )
    .bind(BMC_PASSWORD)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(hits, 0);
    for e in status_events(&env, &partner).await {
        assert!(!format!("{e:?}").contains(BMC_PASSWORD));
    }
    let m = metrics(port).await;
    assert!(
        m.contains(r#"fleet_connector_devices_seen{source="borneo",site="s1"} 5"#),
        "{m}"
    );
    assert!(!m.contains(BMC_PASSWORD) && !m.contains(CLIENT_SECRET));

    connector.assert_alive();
    hub.stop(connector, env).await;
}

/// Every log line the connector writes on this thread.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).to_string()
    }
}

/// On one thread so every log line of the connector is captured: the
/// snapshots carry the reference only; a token endpoint outage and a
/// malformed page holding the credential publish nothing and are counted;
/// no log line, message or metric carries the credential, the client
/// secret or a token.
#[tokio::test(flavor = "current_thread")]
async fn borneo_outages_publish_nothing_and_secrets_reach_no_log_message_or_metric() {
    quiet_global_subscriber();
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let env = TestEnv::new().await;
    let reader = ObsReader::new(&env, "borneo").await;
    let (control, fake) = borneo_fake(BorneoFake::new(vec![
        partner_owned("SN-GB200-0002"),
        machine("SN-GB200-0001", "GOOGLE_OWNED"),
    ]))
    .await;
    let (connector, port) = run_borneo(&env, &control.url());

    let s = reader
        .until("the partner-owned machine", |s| {
            key_of(s) == "SN-GB200-0002"
        })
        .await;
    match &s.mirror {
        Some(Mirror::Custody(c)) => {
            assert_eq!(c.state, "PARTNER_OWNED");
            assert_eq!(c.credential_ref, "borneo:cred-7f3a91");
            assert!(c.state_changed_at.is_some());
        }
        other => panic!("{other:?}"),
    }
    let k = s.device.as_ref().unwrap();
    assert_eq!((k.site.as_str(), k.kind.as_str()), ("s1", "serial"));
    assert!(s.conditions.is_empty());
    assert!(!format!("{s:?}").contains(BMC_PASSWORD));

    // The token endpoint fails while the token is refused: an outage, and
    // Borneo owns no conditions, so nothing is published.
    control.fail(
        "/oauth2/token",
        Fault::Status(500, r#"{"error": "server_error"}"#),
    );
    fake.revoke();
    let (settle, quiet) = (Duration::from_millis(1200), Duration::from_millis(600));
    reader
        .assert_silent(settle, quiet, "an outage publishes nothing")
        .await;
    connector.assert_alive();
    control.heal();
    reader
        .until("readable again", |s| key_of(s) == "SN-GB200-0001")
        .await;

    // A broken page with the credential inside: malformed, never echoed.
    *fake.raw_body.lock().unwrap() = Some(format!(
        r#"{{"machines": [{{"serial": "SN-GB200-0002", "credential": {{"password": "{BMC_PASSWORD}"#
    ));
    reader
        .assert_silent(settle, quiet, "a malformed page publishes nothing")
        .await;
    connector.assert_alive();

    let m = metrics(port).await;
    for kind in ["http_5xx", "malformed"] {
        let line =
            format!(r#"fleet_connector_errors_total{{source="borneo",site="s1",kind="{kind}"}}"#);
        assert!(m.contains(&line), "metrics lack {line}:\n{m}");
    }
    connector.stop().await;
    let text = logs.text();
    assert!(
        text.contains("borneo token issued"),
        "the capture works:\n{text}"
    );
    assert!(text.contains("malformed body"), "{text}");
    assert!(text.contains("HTTP 500"), "{text}");
    for secret in [BMC_PASSWORD, CLIENT_SECRET, "borneo-access-token-"] {
        assert!(!text.contains(secret), "{secret} in the logs:\n{text}");
        assert!(!m.contains(secret), "{secret} in the metrics");
    }
    env.cleanup().await;
}
