//! Conditions: the list with `stale` derived at read time from persisted
//! timestamps, the single write and the snapshot apply (both hub commands).

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use fleet_domain::state::check_observed_at_by;
use fleet_domain::*;
use fleet_proto::{timestamp, v1};
use serde::Deserialize;
use sqlx::{Postgres, QueryBuilder};
use utoipa::ToSchema;
use v1::hub_command::Command as C;

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, J, Q};
use crate::model::*;
use crate::page::Keyset;
use crate::App;

const CONDITION_COLUMNS: &str = "c.device_id, c.type, c.status, c.reason, c.message, c.source, \
    c.condition_of, c.durable, c.observed_at, c.received_at, c.decisive, c.last_transition_at";

/// `stale`: a non-durable row whose last confirmation (its own
/// `observed_at` or its source's snapshot freshness, the later) is older
/// than the source's TTL. Needs `c` and `f` (the freshness row) in scope.
fn push_stale(qb: &mut QueryBuilder<'_, Postgres>, app: &App) {
    qb.push("(NOT c.durable AND greatest(c.observed_at, f.observed_at) + ");
    push_ttl(qb, app, "c.source");
    qb.push(" < now())");
}

/// The TTL of the source named by `source_column`, as an interval: the
/// hub's `hub.ttl_secs` for it, or the default.
pub fn push_ttl(qb: &mut QueryBuilder<'_, Postgres>, app: &App, source_column: &str) {
    qb.push("make_interval(secs => COALESCE((SELECT t.secs FROM unnest(")
        .push_bind(app.ttls.sources.clone())
        .push("::text[], ")
        .push_bind(app.ttls.secs.clone())
        .push(format!(
            "::bigint[]) AS t(src, secs) WHERE t.src = {source_column}), "
        ))
        .push_bind(app.ttls.default_secs)
        .push(")::double precision)");
}

fn select(app: &App) -> QueryBuilder<'static, Postgres> {
    let mut qb = QueryBuilder::new(format!("SELECT {CONDITION_COLUMNS}, "));
    push_stale(&mut qb, app);
    qb.push(
        " AS stale FROM device_conditions c LEFT JOIN device_source_freshness f \
         ON f.device_id = c.device_id AND f.source = c.source WHERE true",
    );
    qb
}

/// The rows that decided a device's `operational_status`.
pub async fn decisive_rows(app: &App, device_id: &str) -> ApiResult<Vec<ConditionOut>> {
    let mut qb = select(app);
    qb.push(" AND c.device_id = ")
        .push_bind(device_id.to_string())
        .push(" AND c.decisive ORDER BY c.type");
    Ok(qb.build_query_as().fetch_all(&app.pool).await?)
}

crate::page::page_query! {
    pub struct ConditionFilter {
        pub device: Option<String>,
        #[param(schema_with = condition_of_schema)]
        pub condition_of: Option<String>,
        pub decisive: Option<bool>,
        #[serde(rename = "type")]
        #[param(schema_with = condition_type_schema)]
        pub condition_type: Option<String>,
        pub stale: Option<bool>,
    }
}

#[utoipa::path(get, operation_id = "list_device_conditions", path = "/api/v1/device-conditions/", params(ConditionFilter),
    responses((status = 200, body = ConditionPage), (status = 400, body = crate::error::ErrorBody)),
    tag = "conditions")]
pub async fn list(
    State(app): State<App>,
    Q(f): Q<ConditionFilter>,
) -> ApiResult<Json<ConditionPage>> {
    let page = f.page(&app)?;
    if let Some(of) = &f.condition_of {
        ConditionOf::parse(of)?;
    }
    if let Some(t) = &f.condition_type {
        ConditionType::parse(t)?;
    }
    let mut qb = select(&app);
    if let Some(d) = &f.device {
        qb.push(" AND c.device_id = ").push_bind(d.clone());
    }
    if let Some(of) = &f.condition_of {
        qb.push(" AND c.condition_of = ").push_bind(of.clone());
    }
    if let Some(t) = &f.condition_type {
        qb.push(" AND c.type = ").push_bind(t.clone());
    }
    if let Some(d) = f.decisive {
        qb.push(" AND c.decisive = ").push_bind(d);
    }
    if let Some(s) = f.stale {
        qb.push(" AND ");
        push_stale(&mut qb, &app);
        qb.push(" = ").push_bind(s);
    }
    let keyset = Keyset::ascending(&["c.device_id", "c.type"]);
    let (items, next_cursor) = page
        .fetch(&app, qb, keyset, |c: &ConditionOut| {
            (c.device_id.clone(), c.condition_type.clone())
        })
        .await?;
    Ok(Json(ConditionPage { items, next_cursor }))
}

/// How a source names the device: `device_id`, or an external key.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceKeyBody {
    /// Required for every kind but `device_id` and `serial`.
    pub site: Option<String>,
    #[schema(schema_with = key_kind_schema)]
    pub kind: String,
    pub key: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConditionBody {
    #[serde(rename = "type")]
    #[schema(schema_with = condition_type_schema)]
    pub condition_type: String,
    #[schema(schema_with = condition_status_schema)]
    pub status: String,
    pub reason: Option<String>,
    pub message: Option<String>,
}

fn device_key(id: Option<String>, key: Option<DeviceKeyBody>) -> ApiResult<v1::DeviceKey> {
    match (id, key) {
        (Some(id), None) if !id.trim().is_empty() => Ok(v1::DeviceKey {
            site: String::new(),
            kind: KeyKind::DeviceId.as_str().into(),
            key: id,
        }),
        (None, Some(k)) => {
            KeyKind::parse(&k.kind)?;
            Ok(v1::DeviceKey {
                site: k.site.unwrap_or_default(),
                kind: k.kind,
                key: k.key,
            })
        }
        _ => Err(ApiError::invalid(
            "name the device with exactly one of device_id or device",
        )),
    }
}

fn condition(c: ConditionBody, source: Source) -> ApiResult<v1::Condition> {
    let t = ConditionType::lookup(&c.condition_type)?;
    ConditionStatus::parse(&c.status)?;
    t.check_owner(source)?;
    Ok(v1::Condition {
        r#type: c.condition_type,
        status: c.status,
        reason: c.reason.unwrap_or_default(),
        message: c.message.unwrap_or_default(),
    })
}

/// One condition (`ConditionWrite`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConditionWriteBody {
    #[schema(schema_with = source_schema)]
    pub source: String,
    pub device_id: Option<String>,
    pub device: Option<DeviceKeyBody>,
    pub condition: ConditionBody,
    /// The source's clock; required unless `hub_ordered`.
    pub observed_at: Option<DateTime<Utc>>,
    /// The custody-entry latch write: the hub stamps `observed_at`.
    #[serde(default)]
    pub hub_ordered: bool,
    /// Optional: when given, a changed device is `CONFLICT`.
    pub version: Option<i64>,
}

/// The API refuses a future `observed_at` before it asks the hub, which
/// checks again against its own clock.
const API_CLOCK: &str = "the API's clock";

/// The reply is the stored row: a row different from what was sent means
/// the write was stale-rejected.
#[utoipa::path(post, path = "/api/v1/device-conditions/", request_body = ConditionWriteBody,
    responses((status = 200, body = ConditionOut), (status = 400, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)),
    tag = "conditions")]
pub async fn write(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    J(b): J<ConditionWriteBody>,
) -> ApiResult<Json<ConditionOut>> {
    let source = Source::parse(&b.source)?;
    let device = device_key(b.device_id, b.device)?;
    let condition = condition(b.condition, source)?;
    if !b.hub_ordered {
        let at = b
            .observed_at
            .ok_or_else(|| ApiError::invalid("observed_at is required unless hub_ordered"))?;
        check_observed_at_by(at, Utc::now(), API_CLOCK)?;
    }
    let version = b.version.unwrap_or(0).max(0);
    let c = C::WriteCondition(v1::ConditionWrite {
        source: b.source,
        device: Some(device),
        condition: Some(condition),
        observed_at: b.observed_at.map(timestamp),
        hub_ordered: b.hub_ordered,
    });
    let reply = app.hub.command(&caller.token_id, version, c).await?;
    let row = reply.condition().map_err(crate::hub::unreadable)?;
    Ok(Json(crate::hub::condition(row)?))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IronicMirrorBody {
    pub provision_state: String,
    #[serde(default)]
    pub maintenance: bool,
    pub maintenance_reason: Option<String>,
    pub instance_uuid: Option<String>,
    pub lessee: Option<String>,
    /// `power on`, `power off`, or absent.
    pub power_state: Option<String>,
    /// The node's uuid: recorded as the device's `infrastructure_ref` when
    /// it has none.
    pub node_uuid: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmMirrorBody {
    #[schema(schema_with = slurm_states_schema)]
    pub states: Vec<String>,
    /// `observed` (default), `keep` (SchedulerUnreachable), `clear` (NoLongerObserved).
    pub mode: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetboxMirrorBody {
    /// NetBox status; absent keeps the last known one.
    pub status: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthMirrorBody {
    /// The chassis_health composite: `Ok`, `Warning`, `Critical`, or absent.
    pub chassis_health: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CustodyMirrorBody {
    pub state: String,
    pub credential_ref: Option<String>,
}

/// One `ResourceBinding`: resolved to `resource_id`, or, without one, not
/// resolved this time, with a CamelCase `reason`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceBindingBody {
    #[schema(schema_with = crate::model::resource_schema)]
    pub resource: String,
    pub resource_id: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// One source's full snapshot for one device (`ConditionSnapshot`): types
/// the source owns and leaves out are written Unknown/NotReported.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotBody {
    #[schema(schema_with = source_schema)]
    pub source: String,
    pub device_id: Option<String>,
    pub device: Option<DeviceKeyBody>,
    pub observed_at: DateTime<Utc>,
    pub conditions: Vec<ConditionBody>,
    /// At most one mirror, of the source's own kind.
    pub ironic: Option<IronicMirrorBody>,
    pub slurm: Option<SlurmMirrorBody>,
    pub netbox: Option<NetboxMirrorBody>,
    pub health: Option<HealthMirrorBody>,
    pub custody: Option<CustodyMirrorBody>,
    /// The resources the source resolved (or failed to) for the device.
    #[serde(default)]
    pub resource_bindings: Vec<ResourceBindingBody>,
    /// Optional: when given, a changed device is `CONFLICT`.
    pub version: Option<i64>,
}

fn mirror(b: &mut SnapshotBody) -> ApiResult<Option<v1::condition_snapshot::Mirror>> {
    use v1::condition_snapshot::Mirror as M;
    let mut mirrors = Vec::new();
    if let Some(m) = b.ironic.take() {
        mirrors.push(M::Ironic(v1::IronicMirror {
            provision_state: m.provision_state,
            maintenance: m.maintenance,
            maintenance_reason: m.maintenance_reason.unwrap_or_default(),
            instance_uuid: m.instance_uuid.unwrap_or_default(),
            lessee: m.lessee.unwrap_or_default(),
            power_state: m.power_state.unwrap_or_default(),
            node_uuid: m.node_uuid.unwrap_or_default(),
        }));
    }
    if let Some(m) = b.slurm.take() {
        mirrors.push(M::Slurm(v1::SlurmMirror {
            states: m.states,
            mode: m.mode.unwrap_or_default(),
        }));
    }
    if let Some(m) = b.netbox.take() {
        mirrors.push(M::Netbox(v1::NetboxMirror {
            status: m.status.unwrap_or_default(),
            tags: m.tags,
            ..Default::default()
        }));
    }
    if let Some(m) = b.health.take() {
        mirrors.push(M::Health(v1::HealthMirror {
            chassis_health: m.chassis_health.unwrap_or_default(),
        }));
    }
    if let Some(m) = b.custody.take() {
        mirrors.push(M::Custody(v1::CustodyMirror {
            state: m.state,
            state_changed_at: None,
            credential_ref: m.credential_ref.unwrap_or_default(),
        }));
    }
    if mirrors.len() > 1 {
        return Err(ApiError::invalid("a snapshot carries at most one mirror"));
    }
    Ok(mirrors.pop())
}

#[utoipa::path(post, path = "/api/v1/device-conditions/apply/", request_body = SnapshotBody,
    responses((status = 200, body = SnapshotResult),
        (status = 202, description = "`unresolved`: the key names no device; kept as an unresolved observation", body = SnapshotResult),
        (status = 400, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)),
    tag = "conditions")]
pub async fn apply(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    J(mut b): J<SnapshotBody>,
) -> ApiResult<(StatusCode, Json<SnapshotResult>)> {
    let source = Source::parse(&b.source)?;
    check_observed_at_by(b.observed_at, Utc::now(), API_CLOCK)?;
    let mirror = mirror(&mut b)?;
    let device = device_key(b.device_id.take(), b.device.take())?;
    let conditions = std::mem::take(&mut b.conditions)
        .into_iter()
        .map(|c| condition(c, source))
        .collect::<ApiResult<Vec<_>>>()?;
    let version = b.version.unwrap_or(0).max(0);
    let resource_bindings = std::mem::take(&mut b.resource_bindings)
        .into_iter()
        .map(|r| v1::ResourceBinding {
            resource: r.resource,
            resource_id: r.resource_id.unwrap_or_default(),
            reason: r.reason.unwrap_or_default(),
            message: r.message.unwrap_or_default(),
        })
        .collect();
    let c = C::ApplySnapshot(v1::ConditionSnapshot {
        resource_bindings,
        source: b.source,
        device: Some(device),
        observed_at: Some(timestamp(b.observed_at)),
        conditions,
        mirror,
    });
    let reply = app.hub.command(&caller.token_id, version, c).await?;
    let applied = crate::hub::snapshot(reply.snapshot().map_err(crate::hub::unreadable)?)?;
    let status = if applied.device.is_none() {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(applied)))
}
