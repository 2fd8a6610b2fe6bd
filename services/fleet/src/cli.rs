//! The operator CLI against the API: `fleet devices ...`,
//! `fleet impairments ...`, `fleet allocations ...` and `fleet pools ...`. The API URL and token come from flags or
//! `FLEET_API_URL` / `FLEET_TOKEN`. Errors name the API's code and say
//! what to do about it.

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};
use fleet_api::jobs::{Job, JobCreateBody};
use fleet_api::model::{
    DeviceChange, DeviceDetail, DeviceSummary, ImpairmentEvent, ImpairmentEventDetail,
    LifecycleEvent,
};
use fleet_placer_client::{AllocateRequest, Allocation, Capacity};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

#[derive(Args, Debug, Clone)]
pub struct Target {
    /// The API, e.g. the address `fleet dev` prints.
    #[arg(
        long,
        env = "FLEET_API_URL",
        default_value = "http://127.0.0.1:9402",
        global = true
    )]
    pub api_url: String,
    /// A bearer token (`fleet token create`, or the one `fleet dev` prints).
    #[arg(long, env = "FLEET_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
}

impl Target {
    /// A client of the API this target names.
    pub fn api(&self) -> anyhow::Result<Api> {
        Api::new(&self.api_url, self.token.as_deref())
    }

    /// Whether the output is JSON (`-o json`).
    pub fn json(&self) -> bool {
        self.output == Output::Json
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug, Clone)]
pub enum DevicesCommand {
    /// List devices with the API's filters (every page unless --limit).
    List(ListArgs),
    /// One device: every axis, the decisive conditions, recent lifecycle events.
    Show {
        /// The id, as `list` shows it.
        id: String,
    },
    /// Cordon: no new work is scheduled on the device.
    Cordon(Change),
    /// Lift a cordon.
    Uncordon {
        /// The id, as `list` shows it.
        id: String,
    },
    /// Drain the device.
    Drain(Change),
    /// Promote an inventory-only device to managed: an audited operation,
    /// its reason kept in the lifecycle (admin token).
    Promote(Change),
    /// Put devices into triage (or take them out with --off).
    Triage {
        /// Device ids.
        #[arg(required = true)]
        ids: Vec<String>,
        /// Take the devices out of triage instead.
        #[arg(long)]
        off: bool,
        /// The ticket that tracks it.
        #[arg(long)]
        ticket_url: Option<String>,
        /// The parent ticket.
        #[arg(long)]
        parent_ticket_url: Option<String>,
    },
}

/// A device command that says why.
#[derive(Args, Debug, Clone)]
pub struct Change {
    /// The id, as `list` shows it.
    pub id: String,
    /// Why: recorded with the change.
    #[arg(long)]
    pub reason: String,
}

#[derive(Args, Debug, Clone, Default)]
pub struct ListArgs {
    /// The site.
    #[arg(long)]
    pub site: Option<String>,
    /// The pool.
    #[arg(long)]
    pub pool: Option<String>,
    /// Comma-separated values.
    #[arg(long)]
    pub inventory_status: Option<String>,
    /// Comma-separated values, e.g. `failed,quarantine`.
    #[arg(long)]
    pub operational_status: Option<String>,
    /// Comma-separated values, e.g. `degraded,unhealthy`.
    #[arg(long)]
    pub health_status: Option<String>,
    /// SLURM state tokens, comma-separated.
    #[arg(long)]
    pub slurm_states: Option<String>,
    /// Only devices in triage (true) or not (false).
    #[arg(long)]
    pub in_triage: Option<bool>,
    /// Only inventory-only devices (true) or managed ones (false).
    #[arg(long)]
    pub inventory_only: Option<bool>,
    /// Only customer-ready devices (true) or not (false).
    #[arg(long)]
    pub customer_ready: Option<bool>,
    /// Only schedulable devices (true) or not (false).
    #[arg(long)]
    pub schedulable: Option<bool>,
    /// Only cordoned devices (true) or not (false).
    #[arg(long)]
    pub cordoned: Option<bool>,
    /// Only devices in maintenance (true) or not (false).
    #[arg(long)]
    pub maintenance: Option<bool>,
    /// Comma-separated values: connected, disconnected, unreachable, lost.
    #[arg(long)]
    pub connectivity: Option<String>,
    /// At most this many devices (default: all of them, page by page).
    #[arg(long)]
    pub limit: Option<usize>,
}

#[derive(Subcommand, Debug, Clone)]
pub enum ImpairmentsCommand {
    /// Open an impairment event holding the devices' operational status.
    Create {
        /// Device ids.
        #[arg(required = true)]
        ids: Vec<String>,
        /// Why: recorded with the change.
        #[arg(long)]
        reason: String,
        /// The ticket that tracks it.
        #[arg(long)]
        ticket_url: Option<String>,
        /// Follow the event until its cordon is done.
        #[arg(long)]
        watch: bool,
    },
    /// List impairment events.
    List {
        /// An event status (`accepted`, `cordoned`, `partially_failed`,
        /// `failed`, `release_pending`, `release_retrying`,
        /// `release_failed`, `cleared`).
        #[arg(long)]
        status: Option<String>,
    },
    /// One event with every device's status and Placement work.
    Show {
        /// The id, as `list` shows it.
        id: String,
    },
    /// Confirm an event the storm guard holds: its cordon is queued.
    Confirm {
        /// The id, as `list` shows it.
        id: String,
        /// Why taking these devices out of service is right.
        #[arg(long)]
        reason: String,
    },
    /// Clear an impairment event: release every device not cleared yet.
    Clear {
        /// The id, as `list` shows it.
        id: String,
        /// Follow the event until its release is done.
        #[arg(long)]
        watch: bool,
    },
}

/// An API error, with the stable code when the API gave one.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
    /// The error's `details` (an `INELIGIBLE` job's refusals).
    pub details: Value,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use fleet_proto::ErrorCode as E;
        let hint = match E::from_str_name(&self.code) {
            Some(E::Unauthenticated) => " (pass --token or set FLEET_TOKEN)",
            Some(E::Forbidden) => " (the token lacks the scope this needs)",
            Some(E::NotFound) => {
                " (check the id with `fleet devices list` or `fleet allocations list`)"
            }
            Some(E::InsufficientCapacity) => {
                " (no schedulable GPUs fit the request; see `fleet pools capacity <pool>`)"
            }
            Some(E::Conflict) => " (the device changed meanwhile; run the command again)",
            Some(E::InvalidState) => " (the device's state does not allow this now)",
            Some(E::Unavailable) => {
                " (the hub, the placer, the workflow service, NATS or PostgreSQL is not answering; retry shortly)"
            }
            _ => "",
        };
        write!(
            f,
            "{} (HTTP {}): {}{hint}",
            self.code, self.status, self.message
        )?;
        // An ineligible job: every refusal, device by device.
        for r in self.details["refusals"].as_array().into_iter().flatten() {
            write!(
                f,
                "\n  {}: {} ({})",
                r["device_id"].as_str().unwrap_or("?"),
                r["refusal"].as_str().unwrap_or("?"),
                r["detail"].as_str().unwrap_or("")
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

/// A client of the API.
pub struct Api {
    url: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Api {
    pub fn new(url: &str, token: Option<&str>) -> anyhow::Result<Api> {
        crate::dev::install_tls_provider();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            anyhow::bail!("the API URL {url:?} is not an http(s) URL (--api-url or FLEET_API_URL)");
        }
        Ok(Api {
            url: url.trim_end_matches('/').to_string(),
            token: token.map(str::to_string),
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(30))
                .build()?,
        })
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.url);
        let mut req = self.http.request(method, &url).query(query);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|e| {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg = format!("{msg}: {s}");
                src = s.source();
            }
            anyhow::anyhow!("cannot reach the API at {}: {msg}", self.url)
        })?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if !status.is_success() {
            let err = &value["error"];
            return Err(ApiError {
                status: status.as_u16(),
                code: err["code"].as_str().unwrap_or("HTTP_ERROR").to_string(),
                message: err["message"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| text.chars().take(200).collect()),
                details: err["details"].clone(),
            }
            .into());
        }
        if value.is_null() && !text.trim().is_empty() {
            anyhow::bail!("the API at {url} answered {status} with a body that is not JSON");
        }
        Ok(value)
    }

    pub async fn get(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<Value> {
        self.call(reqwest::Method::GET, path, query, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.call(reqwest::Method::POST, path, &[], Some(body))
            .await
    }

    pub async fn patch(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.call(reqwest::Method::PATCH, path, &[], Some(body))
            .await
    }

    pub async fn delete(&self, path: &str) -> anyhow::Result<Value> {
        self.call(reqwest::Method::DELETE, path, &[], None).await
    }

    /// A POST whose arguments are in the query (no body).
    pub async fn post_query(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<Value> {
        self.call(reqwest::Method::POST, path, query, None).await
    }

    /// Every page of a list, following `next_cursor`, up to `want` items,
    /// each read as the API's own type.
    pub async fn list_all<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
        want: Option<usize>,
    ) -> anyhow::Result<Vec<T>> {
        let want = want.unwrap_or(usize::MAX);
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut q = query.to_vec();
            q.push((
                "limit",
                want.saturating_sub(out.len()).min(1000).to_string(),
            ));
            if let Some(c) = &cursor {
                q.push(("cursor", c.clone()));
            }
            let mut page = self.get(path, &q).await?;
            let items: Vec<T> = serde_json::from_value(page["items"].take())
                .with_context(|| format!("the API's {path} page is not what this CLI reads"))?;
            out.extend(items);
            cursor = page["next_cursor"].as_str().map(str::to_string);
            if cursor.is_none() || out.len() >= want {
                break;
            }
        }
        out.truncate(want);
        Ok(out)
    }

    /// A `GET` read as the API's own type.
    pub async fn get_as<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        decode(self.get(path, &[]).await?, &format!("{path} answer"))
    }

    pub async fn device(&self, id: &str) -> anyhow::Result<DeviceDetail> {
        self.get_as(&format!("/api/v1/devices/{id}/")).await
    }

    /// Devices matching the filters, following `next_cursor`.
    pub async fn list_devices(&self, a: &ListArgs) -> anyhow::Result<Vec<DeviceSummary>> {
        let mut q: Vec<(&str, String)> = Vec::new();
        let strings = [
            ("site", &a.site),
            ("pool", &a.pool),
            ("inventory_status", &a.inventory_status),
            ("operational_status", &a.operational_status),
            ("health_status", &a.health_status),
            ("slurm_states", &a.slurm_states),
            ("connectivity", &a.connectivity),
        ];
        for (k, v) in strings {
            if let Some(v) = v {
                q.push((k, v.clone()));
            }
        }
        let bools = [
            ("in_triage", a.in_triage),
            ("inventory_only", a.inventory_only),
            ("customer_ready", a.customer_ready),
            ("schedulable", a.schedulable),
            ("cordoned", a.cordoned),
            ("maintenance", a.maintenance),
        ];
        for (k, v) in bools {
            if let Some(v) = v {
                q.push((k, v.to_string()));
            }
        }
        self.list_all("/api/v1/devices/", &q, a.limit).await
    }

    /// A device command with the version just read (`cordon`, `drain`
    /// carry a reason, `uncordon` none).
    pub async fn device_command(
        &self,
        id: &str,
        verb: &str,
        reason: Option<&str>,
    ) -> anyhow::Result<DeviceChange> {
        // The version is the one just read, not one the operator saw: when
        // the device moved in between (a heartbeat, a connector's snapshot),
        // read it again and retry, a few times.
        let mut attempt = 1;
        loop {
            let d = self.device(id).await?;
            let mut body = json!({ "version": d.summary.version });
            if let Some(r) = reason {
                body["reason"] = r.into();
            }
            match self
                .post(&format!("/api/v1/devices/{id}/{verb}"), body)
                .await
            {
                Err(e) if attempt < COMMAND_ATTEMPTS && is_conflict(&e) => attempt += 1,
                answer => return decode(answer?, "device change"),
            }
        }
    }
}

/// How many times a device command reads the device's version and sends
/// it before a `CONFLICT` is the answer.
const COMMAND_ATTEMPTS: u32 = 3;

/// The API refused a write made at a version the device has moved past.
fn is_conflict(e: &anyhow::Error) -> bool {
    e.downcast_ref::<ApiError>().is_some_and(|a| {
        fleet_proto::ErrorCode::from_str_name(&a.code) == Some(fleet_proto::ErrorCode::Conflict)
    })
}

/// An API answer read as the API's own type; `what` names it in the error.
pub(crate) fn decode<T: DeserializeOwned>(v: Value, what: &str) -> anyhow::Result<T> {
    serde_json::from_value(v)
        .with_context(|| format!("the API's {what} is not what this CLI reads"))
}

/// `v` as JSON, or as `text` renders it.
pub(crate) fn emit<T: serde::Serialize + ?Sized>(
    json_out: bool,
    v: &T,
    text: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    if json_out {
        print_json(&v)
    } else {
        print!("{}", text(v));
        Ok(())
    }
}

/// A list as JSON, or as its table with a count of `noun` on stderr.
fn emit_list<T: serde::Serialize>(
    json_out: bool,
    items: &[T],
    rows: fn(&[T]) -> String,
    noun: &str,
) -> anyhow::Result<()> {
    emit(json_out, items, rows)?;
    if !json_out {
        eprintln!("{} {noun}", items.len());
    }
    Ok(())
}

/// The query pairs of the filters that are set.
pub(crate) fn filters<const N: usize>(
    pairs: [(&'static str, Option<String>); N],
) -> Vec<(&'static str, String)> {
    pairs
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
}

/// Reads a record again and again, `every` apart, until `settled` says it
/// is: its text each time the text changes, or its JSON once, at the end.
async fn watch<T, Fut>(
    json_out: bool,
    every: std::time::Duration,
    read: impl Fn() -> Fut,
    settled: impl Fn(&T) -> bool,
    text: impl Fn(&T) -> String,
) -> anyhow::Result<()>
where
    T: serde::Serialize,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let mut last = String::new();
    loop {
        let v = read().await?;
        let settled = settled(&v);
        if json_out {
            if settled {
                return print_json(&v);
            }
        } else {
            let text = text(&v);
            if text != last {
                print!("{text}");
                last = text;
            }
            if settled {
                return Ok(());
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Columns padded to their widest cell, two spaces apart, no borders
/// (comfy-table with nothing drawn), one line per row.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_header(header.to_vec())
        .add_rows(rows.iter().cloned());
    for c in t.column_iter_mut() {
        c.set_padding((0, 2));
    }
    let mut out = String::new();
    for line in t.lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A table of `items`, a row each as `row` makes it.
pub(crate) fn table_of<T>(
    header: &[&str],
    items: &[T],
    row: impl FnMut(&T) -> Vec<String>,
) -> String {
    table(header, &items.iter().map(row).collect::<Vec<_>>())
}

fn device_rows(items: &[DeviceSummary]) -> String {
    table_of(
        &[
            "ID",
            "NAME",
            "SITE",
            "OPERATIONAL",
            "HEALTH",
            "CORDONED",
            "SCHEDULABLE",
            "NO-SCHEDULE",
        ],
        items,
        |d| {
            vec![
                d.id.clone(),
                d.name.clone(),
                d.site_id.clone(),
                d.operational_status.clone(),
                d.health_status.clone(),
                d.cordoned.to_string(),
                d.schedulable.to_string(),
                list_or_dash(&d.no_schedule_reasons),
            ]
        },
    )
}

pub(crate) fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub async fn devices(t: Target, what: DevicesCommand) -> anyhow::Result<()> {
    let api = t.api()?;
    let json_out = t.json();
    match what {
        DevicesCommand::List(a) => {
            let items = api.list_devices(&a).await?;
            emit_list(json_out, &items, device_rows, "devices")?;
        }
        DevicesCommand::Show { id } => {
            let d = api.device(&id).await?;
            let events: Vec<LifecycleEvent> = api
                .list_all(
                    &format!("/api/v1/devices/{id}/lifecycle-events/"),
                    &[],
                    Some(10),
                )
                .await?;
            if json_out {
                print_json(&json!({"device": d, "lifecycle_events": events}))?;
            } else {
                print!("{}", show_device(&d, &events));
            }
        }
        DevicesCommand::Cordon(c) => {
            report(&api, json_out, &c.id, "cordon", Some(&c.reason)).await?
        }
        DevicesCommand::Promote(c) => {
            report(&api, json_out, &c.id, "promote-to-managed", Some(&c.reason)).await?
        }
        DevicesCommand::Uncordon { id } => report(&api, json_out, &id, "uncordon", None).await?,
        DevicesCommand::Drain(c) => report(&api, json_out, &c.id, "drain", Some(&c.reason)).await?,
        DevicesCommand::Triage {
            ids,
            off,
            ticket_url,
            parent_ticket_url,
        } => {
            let v = api
                .post(
                    "/api/v1/devices/triage/",
                    json!({"device_ids": ids, "in_triage": !off,
                           "triage_ticket_url": ticket_url, "parent_ticket_url": parent_ticket_url}),
                )
                .await?;
            emit(json_out, &v, |v| format!("{v}\n"))?;
        }
    }
    Ok(())
}

/// Runs a device command and prints the change.
async fn report(
    api: &Api,
    json_out: bool,
    id: &str,
    verb: &str,
    reason: Option<&str>,
) -> anyhow::Result<()> {
    let d = api.device_command(id, verb, reason).await?;
    emit(json_out, &d, |d: &DeviceChange| {
        format!(
            "{} {}: version {}, cordoned {}, operational {}\n",
            d.id, d.name, d.version, d.cordoned, d.operational_status
        )
    })
}

pub(crate) fn or_dash(v: Option<impl ToString>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn list_or_dash<S: std::borrow::Borrow<str>>(v: &[S]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.join(",")
    }
}

/// `key value` lines, the keys padded to `width`.
fn fields(width: usize, pairs: &[(&str, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k:<width$} {v}\n"))
        .collect()
}

/// `fleet devices show`: the record, the decisive conditions and the
/// recent lifecycle.
fn show_device(d: &DeviceDetail, events: &[LifecycleEvent]) -> String {
    let s = &d.summary;
    let mut out = fields(
        20,
        &[
            ("id", s.id.clone()),
            ("name", s.name.clone()),
            ("site_id", s.site_id.clone()),
            ("rack", or_dash(s.rack.as_ref())),
            ("version", s.version.to_string()),
            ("inventory_status", s.inventory_status.clone()),
            ("operational_status", s.operational_status.clone()),
            ("health_status", s.health_status.clone()),
            ("provision_state", s.provision_state.clone()),
            ("maintenance", s.maintenance.to_string()),
            ("cordoned", s.cordoned.to_string()),
            ("cordon_reason", or_dash(d.cordon_reason.as_ref())),
            ("in_triage", s.in_triage.to_string()),
            ("connectivity", s.connectivity.clone()),
            ("power", s.power.clone()),
            ("custody", or_dash(d.custody.as_ref())),
            ("customer_ready", s.customer_ready.to_string()),
            ("schedulable", s.schedulable.to_string()),
            ("capacity_bucket", s.capacity_bucket.clone()),
            ("no_schedule_reasons", list_or_dash(&s.no_schedule_reasons)),
            ("slurm_states", list_or_dash(&s.slurm_states)),
            ("impairment_hold", or_dash(s.impairment_hold.as_ref())),
            ("failure_state", or_dash(d.failure_state.as_ref())),
        ],
    );
    out.push_str("\ndecisive conditions:\n");
    out.push_str(&table_of(
        &["TYPE", "STATUS", "REASON", "SOURCE", "MESSAGE"],
        &d.operational_status_conditions,
        |c| {
            vec![
                c.condition_type.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.source.clone(),
                c.message.clone(),
            ]
        },
    ));
    out.push_str("\nrecent lifecycle events:\n");
    out.push_str(&table_of(
        &["AT", "KIND", "VALUE", "CAUSE", "ENDED"],
        events,
        |e| {
            vec![
                e.created_at.to_rfc3339(),
                e.kind.clone(),
                e.value.clone(),
                e.cause.clone(),
                or_dash(e.ended_at.map(|t| t.to_rfc3339())),
            ]
        },
    ));
    out
}

pub async fn impairments(t: Target, what: ImpairmentsCommand) -> anyhow::Result<()> {
    let api = t.api()?;
    let json_out = t.json();
    let (v, watch) = match what {
        ImpairmentsCommand::Create {
            ids,
            reason,
            ticket_url,
            watch,
        } => (
            api.post(
                "/api/v1/operations/impairment-events/",
                json!({"device_ids": ids, "reason": reason, "ticket_url": ticket_url}),
            )
            .await?,
            watch,
        ),
        ImpairmentsCommand::List { status } => {
            let q = filters([("status", status)]);
            let events: Vec<ImpairmentEvent> = api
                .list_all("/api/v1/operations/impairment-events/", &q, None)
                .await?;
            return emit(json_out, &events[..], impairment_rows);
        }
        ImpairmentsCommand::Show { id } => (
            api.get(&format!("/api/v1/operations/impairment-events/{id}/"), &[])
                .await?,
            false,
        ),
        ImpairmentsCommand::Confirm { id, reason } => (
            api.post(
                &format!("/api/v1/operations/impairment-events/{id}/confirm"),
                json!({ "reason": reason }),
            )
            .await?,
            false,
        ),
        ImpairmentsCommand::Clear { id, watch } => (
            api.post(
                &format!("/api/v1/operations/impairment-events/{id}/clear"),
                json!({}),
            )
            .await?,
            watch,
        ),
    };
    let d: ImpairmentEventDetail = decode(v, "impairment event")?;
    if watch {
        return watch_impairment(&api, &d.event.id, json_out).await;
    }
    emit(json_out, &d, impairment_text)
}

fn impairment_rows(events: &[ImpairmentEvent]) -> String {
    table_of(
        &["ID", "STATUS", "DEVICES", "REASON", "CREATED"],
        events,
        |e| {
            vec![
                e.id.clone(),
                e.status.clone(),
                e.device_count.to_string(),
                e.reason.clone(),
                e.created_at.to_rfc3339(),
            ]
        },
    )
}

/// The storm guard's hold, a line per tripped scope.
fn storm_guard_text(g: &fleet_api::jobs::StormGuard) -> String {
    let mut out = String::new();
    if g.awaiting_confirmation {
        out.push_str("awaiting an operator's confirmation (storm guard):\n");
        for t in &g.trips {
            out.push_str(&format!(
                "  {} {}: {} of {} in service, {} already out in the window, limit {}\n",
                t.scope_kind, t.scope_id, t.taking, t.in_service, t.in_window, t.limit
            ));
        }
    } else if let Some(by) = &g.confirmed_by {
        out.push_str(&format!(
            "storm guard confirmed by {by}: {}\n",
            g.confirm_reason.as_deref().unwrap_or("")
        ));
    }
    out
}

fn impairment_text(d: &ImpairmentEventDetail) -> String {
    let e = &d.event;
    let mut out = format!(
        "{} {}: {} device(s), {}\n",
        e.id, e.status, e.device_count, e.reason
    );
    if let Some(g) = &d.storm_guard {
        out.push_str(&storm_guard_text(g));
    }
    out.push_str(&table_of(
        &[
            "DEVICE",
            "STATUS",
            "PRE-HOLD",
            "PLACEMENT",
            "PLACEMENT-STATUS",
            "ERROR",
            "MESSAGE",
        ],
        &d.devices,
        |x| {
            vec![
                x.device_id.clone(),
                x.status.clone(),
                x.pre_hold_operational_status.clone(),
                x.placement_action.clone().unwrap_or_default(),
                x.placement_status.clone().unwrap_or_default(),
                x.error_code.clone().unwrap_or_default(),
                x.error_message.clone().unwrap_or_default(),
            ]
        },
    ));
    out
}

/// Follows an event until no device is left to work on.
async fn watch_impairment(api: &Api, id: &str, json_out: bool) -> anyhow::Result<()> {
    use fleet_domain::impairment::EventStatus as S;
    let path = &format!("/api/v1/operations/impairment-events/{id}/");
    watch(
        json_out,
        std::time::Duration::from_secs(1),
        || async move { decode(api.get(path, &[]).await?, "impairment event") },
        |d: &ImpairmentEventDetail| {
            !matches!(
                S::parse(&d.event.status),
                Ok(S::Accepted | S::ReleasePending | S::ReleaseRetrying)
            )
        },
        impairment_text,
    )
    .await
}

#[derive(Subcommand, Debug, Clone)]
pub enum AllocationsCommand {
    /// Book GPUs in a pool for a tenant (through the placer).
    Create {
        /// The pool.
        #[arg(long)]
        pool: String,
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// How many GPUs.
        #[arg(long)]
        gpus: u32,
        /// All GPUs on one device.
        #[arg(long)]
        same_device: bool,
        /// An NVLink domain, or `*` for one domain, whichever fits.
        #[arg(long)]
        nvlink_domain: Option<String>,
        /// Idempotency key: running the command again with it answers the
        /// first allocation instead of booking twice.
        #[arg(long)]
        request_id: Option<String>,
    },
    /// One allocation with its GPUs.
    Show {
        /// The id, as `list` shows it.
        id: String,
    },
    /// Release an allocation's GPUs (releasing twice is harmless).
    Release {
        /// The id, as `list` shows it.
        id: String,
        /// Refuse (NOT_FOUND) unless the allocation is this tenant's.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// List allocations, newest first (every page unless --limit).
    List {
        /// The pool.
        #[arg(long)]
        pool: Option<String>,
        /// The tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// `active`, `impaired` or `released`.
        #[arg(long)]
        status: Option<String>,
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
    },
}

#[derive(Subcommand, Debug, Clone)]
pub enum PoolsCommand {
    /// GPUs of a pool per capacity bucket, as the placer books against them.
    Capacity {
        /// The id, as `list` shows it.
        id: String,
    },
    #[command(flatten)]
    Inventory(crate::inventory_cmd::PoolCommand),
}

fn allocation_rows(items: &[Allocation]) -> String {
    table_of(
        &[
            "ID", "TENANT", "POOL", "GPUS", "STATUS", "DEVICES", "CREATED",
        ],
        items,
        |a| {
            let devices: std::collections::BTreeSet<&str> =
                a.atoms.iter().map(|t| t.device_id.as_str()).collect();
            vec![
                a.id.clone(),
                a.tenant_id.clone(),
                a.pool_id.clone(),
                a.gpus.to_string(),
                a.status.clone(),
                list_or_dash(&devices.into_iter().collect::<Vec<_>>()),
                a.created_at.to_rfc3339(),
            ]
        },
    )
}

fn show_allocation(a: &Allocation) -> String {
    let at = |v: &Option<chrono::DateTime<chrono::Utc>>| or_dash(v.map(|t| t.to_rfc3339()));
    let mut out = fields(
        16,
        &[
            ("id", a.id.clone()),
            ("tenant_id", a.tenant_id.clone()),
            ("pool_id", a.pool_id.clone()),
            ("gpus", a.gpus.to_string()),
            ("status", a.status.clone()),
            ("same_device", a.same_device.to_string()),
            ("nvlink_domain", or_dash(a.nvlink_domain.as_ref())),
            ("request_id", or_dash(a.request_id.as_ref())),
            ("created_at", a.created_at.to_rfc3339()),
            ("impaired_reason", or_dash(a.impaired_reason.as_ref())),
            ("impaired_at", at(&a.impaired_at)),
            ("released_at", at(&a.released_at)),
        ],
    );
    out.push('\n');
    out.push_str(&table_of(&["DEVICE", "GPU"], &a.atoms, |t| {
        vec![t.device_id.clone(), t.atom.to_string()]
    }));
    out
}

pub async fn allocations(t: Target, what: AllocationsCommand) -> anyhow::Result<()> {
    let api = t.api()?;
    let json_out = t.json();
    let v = match what {
        AllocationsCommand::Create {
            pool,
            tenant,
            gpus,
            same_device,
            nvlink_domain,
            request_id,
        } => {
            let body = AllocateRequest {
                pool_id: pool,
                tenant_id: tenant,
                gpus,
                same_device,
                nvlink_domain,
                request_id,
            };
            api.post("/api/v1/allocations/", serde_json::to_value(&body)?)
                .await?
        }
        AllocationsCommand::Show { id } => {
            api.get(&format!("/api/v1/allocations/{id}/"), &[]).await?
        }
        AllocationsCommand::Release { id, tenant } => {
            let q = filters([("tenant_id", tenant)]);
            api.post_query(&format!("/api/v1/allocations/{id}/release"), &q)
                .await?
        }
        AllocationsCommand::List {
            pool,
            tenant,
            status,
            limit,
        } => {
            let q = filters([("pool", pool), ("tenant", tenant), ("status", status)]);
            let items: Vec<Allocation> = api.list_all("/api/v1/allocations/", &q, limit).await?;
            return emit_list(json_out, &items, allocation_rows, "allocations");
        }
    };
    emit(
        json_out,
        &decode::<Allocation>(v, "allocation")?,
        show_allocation,
    )
}

pub fn capacity_table(c: &Capacity) -> String {
    // The buckets in the order `device.md` checks them, then their total.
    let rows: Vec<Vec<String>> = [
        ("schedulable_available", c.schedulable_available),
        ("schedulable_allocated", c.schedulable_allocated),
        ("excluded", c.excluded),
        ("maintenance", c.maintenance),
        ("provisioning", c.provisioning),
        ("unreachable", c.unreachable),
        ("unhealthy", c.unhealthy),
        ("total", c.total),
    ]
    .iter()
    .map(|(k, v)| vec![k.to_string(), v.to_string()])
    .collect();
    format!(
        "pool {} ({} devices)\n{}",
        c.pool_id,
        c.devices,
        table(&["BUCKET", "GPUS"], &rows)
    )
}

pub async fn pools(t: Target, what: PoolsCommand) -> anyhow::Result<()> {
    let api = t.api()?;
    match what {
        PoolsCommand::Capacity { id } => {
            let c: Capacity = api.get_as(&format!("/api/v1/pools/{id}/capacity")).await?;
            emit(t.json(), &c, capacity_table)
        }
        PoolsCommand::Inventory(what) => crate::inventory_cmd::pools(&api, t.output, what).await,
    }
}

#[derive(Subcommand, Debug, Clone)]
pub enum JobsCommand {
    /// Create a job: one workflow over devices. Every eligibility refusal
    /// is printed, device by device, and nothing is created.
    Create {
        /// The workflow (image_node, unimage_node, ...).
        #[arg(long)]
        workflow: String,
        /// A device id; repeat for more.
        #[arg(long = "device", required = true)]
        devices: Vec<String>,
        /// Move to Test Cluster's cordon_only.
        #[arg(long)]
        cordon_only: bool,
        /// Move to Test Cluster's force_reclaim.
        #[arg(long)]
        force_reclaim: bool,
        /// Release: hand the devices back to the customer pool.
        #[arg(long)]
        release_to_customer_pool: bool,
        /// Release: fully_managed, metal or self_managed.
        #[arg(long)]
        engagement_mode: Option<String>,
        /// The fabric flips: plan and read back, write nothing.
        #[arg(long)]
        simulate: bool,
        /// Enrolment: false makes a diagnostic run that proves nothing.
        #[arg(long)]
        run_inspection: Option<bool>,
        /// The front-end VRF return: DEVICE=VRF, the customer VRF a device's
        /// ports go back into; repeat per device.
        #[arg(long = "customer-vrf", value_name = "DEVICE=VRF")]
        customer_vrfs: Vec<String>,
        /// Follow the job until it is terminal (as `watch` does).
        #[arg(long)]
        watch: bool,
    },
    /// List jobs, newest first.
    List {
        /// Only jobs with this status.
        #[arg(long)]
        status: Option<String>,
        /// Only jobs of this workflow.
        #[arg(long)]
        workflow: Option<String>,
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// One job with every device's status, step and failure.
    Show {
        /// The job id.
        id: String,
    },
    /// Cancel a job: devices not started are cancelled at once, running
    /// ones at their next step.
    Cancel {
        /// The job id.
        id: String,
    },
    /// Confirm a job the storm guard holds: its work is queued.
    Confirm {
        /// The job id.
        id: String,
        /// Why taking these devices out of service is right.
        #[arg(long)]
        reason: String,
    },
    /// Follow a job's progress until it is terminal.
    Watch {
        /// The job id.
        id: String,
        /// Seconds between two reads.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
}

fn job_rows(items: &[Job]) -> String {
    table_of(
        &[
            "ID",
            "WORKFLOW",
            "STATUS",
            "DEVICES",
            "CREATED-BY",
            "CREATED",
        ],
        items,
        |j| {
            vec![
                j.id.clone(),
                j.workflow.clone(),
                j.status.clone(),
                j.device_count.to_string(),
                j.created_by.clone(),
                j.created_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
            ]
        },
    )
}

/// A job's summary line and one row per device.
pub fn job_text(j: &Job) -> String {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for d in &j.devices {
        *counts
            .entry(d.status.as_deref().unwrap_or("not started"))
            .or_default() += 1;
    }
    let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    let guard = j
        .storm_guard
        .as_ref()
        .map(storm_guard_text)
        .unwrap_or_default();
    format!(
        "job {} {} {}{} ({})\n{guard}{}",
        j.id,
        j.workflow,
        j.status,
        if j.cancel_requested {
            " (cancel requested)"
        } else {
            ""
        },
        summary.join(", "),
        table_of(
            &[
                "DEVICE",
                "STATUS",
                "STEP",
                "FAILURE-CODE",
                "FAILURE-MESSAGE"
            ],
            &j.devices,
            |d| {
                vec![
                    d.device_id.clone(),
                    or_dash(d.status.as_ref()),
                    if d.step.is_empty() {
                        "-".into()
                    } else {
                        d.step.clone()
                    },
                    or_dash(d.failure_code.as_ref()),
                    d.failure_message.clone().unwrap_or_default(),
                ]
            }
        )
    )
}

async fn watch_job(api: &Api, id: &str, interval: f64, json_out: bool) -> anyhow::Result<()> {
    let path = &format!("/api/v1/jobs/{id}/");
    watch(
        json_out,
        std::time::Duration::from_secs_f64(interval.max(0.1)),
        || api.get_as::<Job>(path),
        |j| fleet_domain::jobs::JobStatus::parse(&j.status).is_ok_and(|s| s.is_terminal()),
        job_text,
    )
    .await
}

pub async fn jobs(t: Target, what: JobsCommand) -> anyhow::Result<()> {
    let api = t.api()?;
    let json_out = t.json();
    let job: Job = match what {
        JobsCommand::Create {
            workflow,
            devices,
            cordon_only,
            force_reclaim,
            release_to_customer_pool,
            engagement_mode,
            simulate,
            run_inspection,
            customer_vrfs,
            watch,
        } => {
            let mut params = std::collections::BTreeMap::new();
            for p in customer_vrfs {
                let (d, vrf) = p
                    .split_once('=')
                    .with_context(|| format!("--customer-vrf {p:?}: expected DEVICE=VRF"))?;
                params.insert(
                    d.trim().to_string(),
                    fleet_api::jobs::JobDeviceParams {
                        customer_vrf: Some(vrf.trim().to_string()),
                    },
                );
            }
            let body = JobCreateBody {
                workflow,
                device_ids: devices,
                cordon_only,
                force_reclaim,
                release_to_customer_pool,
                engagement_mode,
                simulate,
                run_inspection,
                params,
            };
            let v = api
                .post("/api/v1/jobs/", serde_json::to_value(&body)?)
                .await?;
            let j: Job = decode(v, "job")?;
            if watch {
                return watch_job(&api, &j.id, 1.0, json_out).await;
            }
            j
        }
        JobsCommand::Show { id } => api.get_as(&format!("/api/v1/jobs/{id}/")).await?,
        JobsCommand::Cancel { id } => decode(
            api.post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
                .await?,
            "job",
        )?,
        JobsCommand::Confirm { id, reason } => decode(
            api.post(
                &format!("/api/v1/jobs/{id}/confirm"),
                json!({ "reason": reason }),
            )
            .await?,
            "job",
        )?,
        JobsCommand::Watch { id, interval } => {
            return watch_job(&api, &id, interval, json_out).await
        }
        JobsCommand::List {
            status,
            workflow,
            limit,
        } => {
            let q = filters([("status", status), ("workflow", workflow)]);
            let items: Vec<Job> = api.list_all("/api/v1/jobs/", &q, limit).await?;
            return emit_list(json_out, &items, job_rows, "jobs");
        }
    };
    emit(json_out, &job, job_text)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tables_pad_columns() {
        let t = super::table(
            &["A", "LONGER"],
            &[
                vec!["xyz".into(), "1".into()],
                vec!["q".into(), "22".into()],
            ],
        );
        assert_eq!(t, "A    LONGER\nxyz  1\nq    22\n");
    }

    #[test]
    fn capacity_lists_every_bucket_and_the_total() {
        let c = fleet_placer_client::Capacity {
            pool_id: "p1".into(),
            devices: 2,
            total: 16,
            schedulable_available: 12,
            schedulable_allocated: 4,
            ..Default::default()
        };
        let t = super::capacity_table(&c);
        assert!(t.starts_with("pool p1 (2 devices)\nBUCKET"), "{t}");
        assert!(t.contains("schedulable_available  12\n"), "{t}");
        assert!(t.ends_with("total                  16\n"), "{t}");
    }

    #[test]
    fn only_a_conflict_is_retried() {
        let api = |status, code: &str| -> anyhow::Error {
            super::ApiError {
                status,
                code: code.into(),
                message: String::new(),
                details: serde_json::Value::Null,
            }
            .into()
        };
        assert!(super::is_conflict(&api(409, "CONFLICT")));
        assert!(!super::is_conflict(&api(409, "INVALID_STATE")));
        assert!(!super::is_conflict(&api(404, "NOT_FOUND")));
        assert!(!super::is_conflict(&anyhow::anyhow!("CONFLICT")));
    }

    #[test]
    fn errors_name_the_code_and_what_to_do() {
        let e = super::ApiError {
            status: 409,
            code: "CONFLICT".into(),
            message: "version 3 is not 4".into(),
            details: serde_json::Value::Null,
        };
        let s = e.to_string();
        assert!(
            s.starts_with("CONFLICT (HTTP 409): version 3 is not 4"),
            "{s}"
        );
        assert!(s.contains("run the command again"), "{s}");
    }
}
