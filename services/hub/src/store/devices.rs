//! Locking, reading and writing device state for the hub. Writes are diffs:
//! a freshness-only resync writes its one freshness row and nothing else.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use fleet_domain::binding::{BindingRow, Resource};
use fleet_domain::state::{
    sweep_turn, ConditionRow, Deadlines, DeviceRecord, DeviceState, Freshness, Mirrors, Session,
    SweepSettings, SweepTurn,
};
use fleet_domain::*;
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{Postgres, Row, Transaction};

use fleet_store::StoreError;

type Tx<'a> = Transaction<'a, Postgres>;

const DEVICE_COLUMNS: &str = "d.id, d.site_id, d.name, d.version, d.serial, d.rack, d.netbox_id, d.inventory_only, d.role, d.trust, d.pool_id, \
    d.owner_tenant_id, p.owner_tenant_id AS pool_owner_tenant_id, d.infrastructure_ref, d.provision_state, \
    d.failed_from, d.maintenance, d.maintenance_reason, d.cordoned, d.cordon_reason, d.draining, d.power, \
    d.connectivity, d.inventory_status, d.operational_status, d.health_status, d.capacity_bucket, d.in_triage, \
    d.triage_ticket_url, d.parent_ticket_url, d.entered_triage_at, d.custody, d.custody_credential_ref, \
    d.impairment_hold, d.taints, d.no_schedule_reasons, d.observed_generation, d.identity_generation, \
    d.enrollment_validated_ref, d.enrollment_proof_source, d.enrollment_proof_at, d.entered_service_at, \
    d.failure_state, d.failed_at, d.ironic_provision_state, d.ironic_maintenance, d.ironic_maintenance_reason, \
    d.ironic_instance_uuid, d.ironic_lessee, d.slurm_states, d.netbox_tags, d.chassis_health, d.session_epoch, \
    d.session_gateway_id, d.session_connected_at, d.session_disconnected_at, d.session_last_seen, \
    (d.deleted_at IS NOT NULL) AS deleted";

fn parse<T>(
    row: &PgRow,
    col: &str,
    f: impl Fn(&str) -> Result<T, DomainError>,
) -> Result<T, StoreError> {
    let s: String = row.try_get(col)?;
    f(&s).map_err(|e| StoreError::Corrupt(format!("devices.{col}: {e}")))
}

fn record_from_row(row: &PgRow) -> Result<DeviceRecord, StoreError> {
    let failed_from: Option<String> = row.try_get("failed_from")?;
    let chassis: Option<String> = row.try_get("chassis_health")?;
    Ok(DeviceRecord {
        id: row.try_get("id")?,
        site_id: row.try_get("site_id")?,
        name: row.try_get("name")?,
        version: row.try_get("version")?,
        serial: row.try_get("serial")?,
        rack: row.try_get("rack")?,
        netbox_id: row.try_get("netbox_id")?,
        inventory_only: row.try_get("inventory_only")?,
        role: parse(row, "role", Role::parse)?,
        trust: parse(row, "trust", Trust::parse)?,
        pool_id: row.try_get("pool_id")?,
        owner_tenant_id: row.try_get("owner_tenant_id")?,
        pool_owner_tenant_id: row.try_get("pool_owner_tenant_id")?,
        infrastructure_ref: row.try_get("infrastructure_ref")?,
        provision_state: parse(row, "provision_state", ProvisionState::parse)?,
        failed_from: failed_from
            .map(|s| ProvisionState::parse(&s))
            .transpose()
            .map_err(|e| StoreError::Corrupt(e.to_string()))?,
        maintenance: row.try_get("maintenance")?,
        maintenance_reason: row.try_get("maintenance_reason")?,
        cordoned: row.try_get("cordoned")?,
        cordon_reason: row.try_get("cordon_reason")?,
        draining: row.try_get("draining")?,
        power: parse(row, "power", Power::parse)?,
        connectivity: parse(row, "connectivity", Connectivity::parse)?,
        inventory_status: parse(row, "inventory_status", InventoryStatus::parse)?,
        operational_status: parse(row, "operational_status", OperationalStatus::parse)?,
        health_status: parse(row, "health_status", HealthStatus::parse)?,
        capacity_bucket: parse(row, "capacity_bucket", CapacityBucket::parse)?,
        in_triage: row.try_get("in_triage")?,
        triage_ticket_url: row.try_get("triage_ticket_url")?,
        parent_ticket_url: row.try_get("parent_ticket_url")?,
        entered_triage_at: row.try_get("entered_triage_at")?,
        custody: row.try_get("custody")?,
        custody_credential_ref: row.try_get("custody_credential_ref")?,
        impairment_hold: row.try_get("impairment_hold")?,
        taints: row.try_get("taints")?,
        no_schedule_reasons: row.try_get("no_schedule_reasons")?,
        observed_generation: row.try_get("observed_generation")?,
        identity_generation: row.try_get("identity_generation")?,
        enrollment_validated_ref: row.try_get("enrollment_validated_ref")?,
        enrollment_proof_source: row.try_get("enrollment_proof_source")?,
        enrollment_proof_at: row.try_get("enrollment_proof_at")?,
        entered_service_at: row.try_get("entered_service_at")?,
        failure_state: row.try_get("failure_state")?,
        failed_at: row.try_get("failed_at")?,
        mirrors: Mirrors {
            ironic_provision_state: row.try_get("ironic_provision_state")?,
            ironic_maintenance: row.try_get("ironic_maintenance")?,
            ironic_maintenance_reason: row.try_get("ironic_maintenance_reason")?,
            ironic_instance_uuid: row.try_get("ironic_instance_uuid")?,
            ironic_lessee: row.try_get("ironic_lessee")?,
            slurm_states: row.try_get("slurm_states")?,
            netbox_tags: row.try_get("netbox_tags")?,
            chassis_health: chassis
                .map(|s| ChassisHealth::parse(&s))
                .transpose()
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
        },
        session: Session {
            epoch: row.try_get("session_epoch")?,
            gateway_id: row.try_get("session_gateway_id")?,
            connected_at: row.try_get("session_connected_at")?,
            disconnected_at: row.try_get("session_disconnected_at")?,
            last_seen: row.try_get("session_last_seen")?,
        },
        deleted: row.try_get("deleted")?,
    })
}

fn condition_from_row(row: &PgRow) -> Result<ConditionRow, StoreError> {
    let corrupt = |e: DomainError| StoreError::Corrupt(format!("device_conditions: {e}"));
    let t: String = row.try_get("type")?;
    Ok(ConditionRow {
        condition_type: ConditionType::parse(&t).map_err(corrupt)?,
        status: ConditionStatus::parse(row.try_get::<&str, _>("status")?).map_err(corrupt)?,
        reason: row.try_get("reason")?,
        message: row.try_get("message")?,
        source: Source::parse(row.try_get::<&str, _>("source")?).map_err(corrupt)?,
        condition_of: ConditionOf::parse(row.try_get::<&str, _>("condition_of")?)
            .map_err(corrupt)?,
        durable: row.try_get("durable")?,
        observed_at: row.try_get("observed_at")?,
        received_at: row.try_get("received_at")?,
        decisive: row.try_get("decisive")?,
        last_transition_at: row.try_get("last_transition_at")?,
    })
}

/// Locks the devices (in id order, so concurrent batches never deadlock)
/// and reads their conditions and freshness. Deleted devices are included;
/// callers decide what a deleted device accepts.
///
/// The lock is `FOR NO KEY UPDATE`: it excludes every other writer of the
/// row (the placer's `lock_devices` too) but not the key-share lock a
/// foreign-key check takes, because the hub never changes a device's id.
/// With `FOR UPDATE` each gateway insert of a session or credential, and
/// each placer atom, waited for the whole lane batch that held its device
/// (at 100,000 joining agents, most of a join's time).
pub async fn lock_states(
    tx: &mut Tx<'_>,
    ids: &[String],
) -> Result<BTreeMap<String, DeviceState>, StoreError> {
    read_states(tx, ids, Some(HeldRows::Wait)).await
}

/// [`lock_states`] without waiting: a device another transaction holds is
/// missing from the answer.
pub async fn lock_free_states(
    tx: &mut Tx<'_>,
    ids: &[String],
) -> Result<BTreeMap<String, DeviceState>, StoreError> {
    read_states(tx, ids, Some(HeldRows::Skip)).await
}

/// Reads devices this transaction locked already (see [`lock_heads`]).
pub async fn locked_states(
    tx: &mut Tx<'_>,
    ids: &[String],
) -> Result<BTreeMap<String, DeviceState>, StoreError> {
    read_states(tx, ids, None).await
}

async fn read_states(
    tx: &mut Tx<'_>,
    ids: &[String],
    lock: Option<HeldRows>,
) -> Result<BTreeMap<String, DeviceState>, StoreError> {
    let mut out = BTreeMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let lock = lock.map_or("", HeldRows::lock);
    let sql = format!(
        "SELECT {DEVICE_COLUMNS} FROM devices d LEFT JOIN pools p ON p.id = d.pool_id \
         WHERE d.id = ANY($1) ORDER BY d.id{lock}"
    );
    for row in sqlx::query(&sql).bind(ids).fetch_all(&mut **tx).await? {
        let record = record_from_row(&row)?;
        out.insert(record.id.clone(), DeviceState::new(record));
    }
    let rows = sqlx::query(
        "SELECT device_id, type, status, reason, message, source, condition_of, durable, observed_at, \
         received_at, decisive, last_transition_at FROM device_conditions WHERE device_id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(&mut **tx)
    .await?;
    for row in rows {
        let id: String = row.try_get("device_id")?;
        let c = condition_from_row(&row)?;
        if let Some(s) = out.get_mut(&id) {
            s.conditions.insert(c.condition_type, c);
        }
    }
    let rows = sqlx::query("SELECT device_id, source, observed_at, digest, settled_version FROM device_source_freshness WHERE device_id = ANY($1)")
        .bind(ids)
        .fetch_all(&mut **tx)
        .await?;
    for row in rows {
        let id: String = row.try_get("device_id")?;
        let (source, freshness) = freshness_from_row(&row, row.try_get("source")?)?;
        if let Some(s) = out.get_mut(&id) {
            s.freshness.insert(source, freshness);
        }
    }
    let rows = sqlx::query(
        "SELECT device_id, resource, source, resource_id, resolved_at, failed_at, reason, message, \
         observed_at FROM device_resource_bindings WHERE device_id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(&mut **tx)
    .await?;
    for row in rows {
        let id: String = row.try_get("device_id")?;
        let b = BindingRow {
            resource: parse(&row, "resource", Resource::parse)?,
            source: parse(&row, "source", Source::parse)?,
            resource_id: row.try_get("resource_id")?,
            resolved_at: row.try_get("resolved_at")?,
            failed_at: row.try_get("failed_at")?,
            reason: row.try_get("reason")?,
            message: row.try_get("message")?,
            observed_at: row.try_get("observed_at")?,
        };
        if let Some(s) = out.get_mut(&id) {
            s.bindings.insert(b.resource, b);
        }
    }
    Ok(out)
}

/// One column of the device rows a batch writes, as one typed array.
#[derive(Debug, PartialEq)]
enum Values<'a> {
    Text(Vec<Option<&'a str>>),
    Int(Vec<Option<i64>>),
    Bool(Vec<Option<bool>>),
    Time(Vec<Option<DateTime<Utc>>>),
    /// A `text[]` column, each row's array as its literal (see
    /// [`text_array_literal`]): `UNNEST` cannot take an array of arrays.
    TextArray(Vec<String>),
}

impl Values<'_> {
    fn pg_type(&self) -> &'static str {
        match self {
            Values::Text(_) | Values::TextArray(_) => "text",
            Values::Int(_) => "bigint",
            Values::Bool(_) => "boolean",
            Values::Time(_) => "timestamptz",
        }
    }

    fn bind<'q>(
        self,
        q: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>
    where
        Self: 'q,
    {
        match self {
            Values::Text(v) => q.bind(v),
            Values::Int(v) => q.bind(v),
            Values::Bool(v) => q.bind(v),
            Values::Time(v) => q.bind(v),
            Values::TextArray(v) => q.bind(v),
        }
    }
}

/// A `text[]` as PostgreSQL's array literal: every element double-quoted,
/// with `"` and `\` backslash-escaped, so any string reads back as itself.
fn text_array_literal(items: &[String]) -> String {
    let mut out = String::from("{");
    for (k, item) in items.iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        out.push('"');
        for c in item.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
    }
    out.push('}');
    out
}

/// How one column of `devices` the hub writes is read from a record.
enum Column {
    Text(for<'r> fn(&'r DeviceRecord) -> Option<&'r str>),
    Int(fn(&DeviceRecord) -> Option<i64>),
    Bool(fn(&DeviceRecord) -> Option<bool>),
    Time(fn(&DeviceRecord) -> Option<DateTime<Utc>>),
    TextArray(for<'r> fn(&'r DeviceRecord) -> &'r [String]),
}

impl Column {
    /// Whether the column's value differs between the two records.
    fn differs(&self, a: &DeviceRecord, b: &DeviceRecord) -> bool {
        match self {
            Column::Text(f) => f(a) != f(b),
            Column::Int(f) => f(a) != f(b),
            Column::Bool(f) => f(a) != f(b),
            Column::Time(f) => f(a) != f(b),
            Column::TextArray(f) => f(a) != f(b),
        }
    }

    /// The column of `records`, one typed array.
    fn values<'a>(&self, records: &[&'a DeviceRecord]) -> Values<'a> {
        match self {
            Column::Text(f) => Values::Text(records.iter().map(|r| f(r)).collect()),
            Column::Int(f) => Values::Int(records.iter().map(|r| f(r)).collect()),
            Column::Bool(f) => Values::Bool(records.iter().map(|r| f(r)).collect()),
            Column::Time(f) => Values::Time(records.iter().map(|r| f(r)).collect()),
            Column::TextArray(f) => {
                Values::TextArray(records.iter().map(|r| text_array_literal(f(r))).collect())
            }
        }
    }
}

/// Every column of `devices` the hub writes, each named once beside what it
/// takes from the record, so a name and its values cannot drift apart.
/// `id` finds the row; `deleted` sets `deleted_at` (see [`update_devices`]).
const DEVICE_COLUMNS_WRITTEN: &[(&str, Column)] = &[
    ("id", Column::Text(|r| Some(&r.id))),
    ("version", Column::Int(|r| Some(r.version))),
    (
        "infrastructure_ref",
        Column::Text(|r| r.infrastructure_ref.as_deref()),
    ),
    (
        "provision_state",
        Column::Text(|r| Some(r.provision_state.as_str())),
    ),
    (
        "failed_from",
        Column::Text(|r| r.failed_from.map(|s| s.as_str())),
    ),
    ("maintenance", Column::Bool(|r| Some(r.maintenance))),
    (
        "maintenance_reason",
        Column::Text(|r| r.maintenance_reason.as_deref()),
    ),
    ("cordoned", Column::Bool(|r| Some(r.cordoned))),
    (
        "cordon_reason",
        Column::Text(|r| r.cordon_reason.as_deref()),
    ),
    ("draining", Column::Bool(|r| Some(r.draining))),
    ("power", Column::Text(|r| Some(r.power.as_str()))),
    (
        "connectivity",
        Column::Text(|r| Some(r.connectivity.as_str())),
    ),
    (
        "inventory_status",
        Column::Text(|r| Some(r.inventory_status.as_str())),
    ),
    (
        "operational_status",
        Column::Text(|r| Some(r.operational_status.as_str())),
    ),
    (
        "health_status",
        Column::Text(|r| Some(r.health_status.as_str())),
    ),
    (
        "capacity_bucket",
        Column::Text(|r| Some(r.capacity_bucket.as_str())),
    ),
    ("in_triage", Column::Bool(|r| Some(r.in_triage))),
    (
        "triage_ticket_url",
        Column::Text(|r| r.triage_ticket_url.as_deref()),
    ),
    (
        "parent_ticket_url",
        Column::Text(|r| r.parent_ticket_url.as_deref()),
    ),
    ("entered_triage_at", Column::Time(|r| r.entered_triage_at)),
    ("custody", Column::Text(|r| r.custody.as_deref())),
    (
        "custody_credential_ref",
        Column::Text(|r| r.custody_credential_ref.as_deref()),
    ),
    (
        "impairment_hold",
        Column::Text(|r| r.impairment_hold.as_deref()),
    ),
    ("taints", Column::TextArray(|r| &r.taints)),
    (
        "no_schedule_reasons",
        Column::TextArray(|r| &r.no_schedule_reasons),
    ),
    (
        "observed_generation",
        Column::Int(|r| Some(r.observed_generation)),
    ),
    (
        "identity_generation",
        Column::Int(|r| Some(r.identity_generation)),
    ),
    (
        "enrollment_validated_ref",
        Column::Text(|r| r.enrollment_validated_ref.as_deref()),
    ),
    (
        "enrollment_proof_source",
        Column::Text(|r| r.enrollment_proof_source.as_deref()),
    ),
    (
        "enrollment_proof_at",
        Column::Time(|r| r.enrollment_proof_at),
    ),
    ("entered_service_at", Column::Time(|r| r.entered_service_at)),
    (
        "failure_state",
        Column::Text(|r| r.failure_state.as_deref()),
    ),
    ("failed_at", Column::Time(|r| r.failed_at)),
    (
        "ironic_provision_state",
        Column::Text(|r| r.mirrors.ironic_provision_state.as_deref()),
    ),
    (
        "ironic_maintenance",
        Column::Bool(|r| r.mirrors.ironic_maintenance),
    ),
    (
        "ironic_maintenance_reason",
        Column::Text(|r| r.mirrors.ironic_maintenance_reason.as_deref()),
    ),
    (
        "ironic_instance_uuid",
        Column::Text(|r| r.mirrors.ironic_instance_uuid.as_deref()),
    ),
    (
        "ironic_lessee",
        Column::Text(|r| r.mirrors.ironic_lessee.as_deref()),
    ),
    (
        "slurm_states",
        Column::TextArray(|r| &r.mirrors.slurm_states),
    ),
    ("netbox_tags", Column::TextArray(|r| &r.mirrors.netbox_tags)),
    (
        "chassis_health",
        Column::Text(|r| r.mirrors.chassis_health.map(|c| c.as_str())),
    ),
    ("session_epoch", Column::Int(|r| Some(r.session.epoch))),
    (
        "session_gateway_id",
        Column::Text(|r| r.session.gateway_id.as_deref()),
    ),
    (
        "session_connected_at",
        Column::Time(|r| r.session.connected_at),
    ),
    (
        "session_disconnected_at",
        Column::Time(|r| r.session.disconnected_at),
    ),
    ("session_last_seen", Column::Time(|r| r.session.last_seen)),
    ("deleted", Column::Bool(|r| Some(r.deleted))),
    ("inventory_only", Column::Bool(|r| Some(r.inventory_only))),
    ("serial", Column::Text(|r| r.serial.as_deref())),
    ("rack", Column::Text(|r| r.rack.as_deref())),
    ("netbox_id", Column::Int(|r| r.netbox_id)),
];

/// The columns of [`DEVICE_COLUMNS_WRITTEN`] that differ for any of the
/// `(before, after)` record pairs, with their `after` values, and `id`.
/// The rest are left out of the `UPDATE`: `before` is what this
/// transaction read under the device's lock, so the row already holds
/// those values. A status change moves about ten of the 51 columns;
/// binding only those saves the hub building, and PostgreSQL decoding,
/// arrays that rewrite a value with itself. Columns are compared on the
/// records and built only when written.
fn changed_columns<'a>(
    records: &[(&'a DeviceRecord, &'a DeviceRecord)],
) -> Vec<(&'static str, Values<'a>)> {
    let after: Vec<&DeviceRecord> = records.iter().map(|r| r.1).collect();
    DEVICE_COLUMNS_WRITTEN
        .iter()
        .filter(|(name, column)| *name == "id" || records.iter().any(|(b, a)| column.differs(b, a)))
        .map(|(name, column)| (*name, column.values(&after)))
        .collect()
}

/// `UPDATE devices` for `columns` (of [`DEVICE_COLUMNS_WRITTEN`]), one typed array
/// parameter each. Bound as arrays rather than one jsonb document:
/// building that document was about a tenth of the hub's CPU in `fleet
/// bench hub`'s initial load, and PostgreSQL parsed it again
/// (`docs/benchmarks.md`, "The hub's own CPU in the initial load").
fn update_devices(columns: &[(&'static str, Values<'_>)]) -> String {
    let mut set = Vec::with_capacity(columns.len() + 2);
    let mut params = Vec::with_capacity(columns.len());
    let mut names = Vec::with_capacity(columns.len());
    for (k, (name, values)) in columns.iter().enumerate() {
        params.push(format!("${}::{}[]", k + 1, values.pg_type()));
        names.push(*name);
        match (*name, values) {
            ("id", _) => {}
            ("deleted", _) => set.push(
                "deleted_at = CASE WHEN x.deleted THEN COALESCE(d.deleted_at, now()) ELSE NULL END"
                    .to_string(),
            ),
            (_, Values::TextArray(_)) => set.push(format!("{name} = x.{name}::text[]")),
            _ => set.push(format!("{name} = x.{name}")),
        }
    }
    set.push("updated_at = now()".into());
    set.push("derived_at = now()".into());
    format!(
        "UPDATE devices d SET {} FROM UNNEST({}) AS x({}) WHERE d.id = x.id",
        set.join(", "),
        params.join(", "),
        names.join(", ")
    )
}

/// The live devices holding any of the `claimed` (site, NetBox id) pairs:
/// (site, NetBox id, device id).
pub async fn netbox_id_holders(
    tx: &mut Transaction<'_, Postgres>,
    claimed: &[(&str, i64)],
) -> Result<Vec<(String, i64, String)>, StoreError> {
    let sites: Vec<&str> = claimed.iter().map(|c| c.0).collect();
    let ids: Vec<i64> = claimed.iter().map(|c| c.1).collect();
    // By site and id, as `devices_netbox_id` is ordered: by id alone the
    // whole index was read (515 ms for 256 claims at 100,000 devices, 1 ms
    // this way).
    Ok(sqlx::query_as(
        "SELECT d.site_id, d.netbox_id, d.id FROM UNNEST($1::text[], $2::bigint[]) AS c(site, netbox_id) \
         JOIN devices d ON d.site_id = c.site AND d.netbox_id = c.netbox_id AND d.deleted_at IS NULL",
    )
    .bind(&sites)
    .bind(&ids)
    .fetch_all(&mut **tx)
    .await?)
}

/// Counts of rows one write touched, for the benchmark's rows/snapshot.
#[derive(Debug, Default, Clone, Copy)]
pub struct Written {
    pub devices: u64,
    pub conditions: u64,
    pub freshness: u64,
}

impl Written {
    pub fn total(&self) -> u64 {
        self.devices + self.conditions + self.freshness
    }
}

/// Writes what changed between each `(before, after)` pair, and brings
/// the `sweep_at` of a device forward to a deadline it did not have. The
/// caller has already bumped `after.record.version` where the record
/// changed.
pub async fn write_diffs(
    tx: &mut Tx<'_>,
    pairs: &[(&DeviceState, &DeviceState)],
    now: DateTime<Utc>,
    deadlines: &Deadlines,
) -> Result<Written, StoreError> {
    let mut written = Written::default();
    let records: Vec<(&DeviceRecord, &DeviceRecord)> = pairs
        .iter()
        .filter(|(b, a)| b.record != a.record)
        .map(|(b, a)| (&b.record, &a.record))
        .collect();
    if !records.is_empty() {
        written.devices = records.len() as u64;
        let columns = changed_columns(&records);
        let sql = update_devices(&columns);
        // Planned for each batch (an unnamed statement), never from a
        // cached generic plan: a generic plan made while `devices` was
        // small (a fleet imported from NetBox into an empty database) can
        // be a nested loop over a sequential scan of `devices`, which cost
        // 1 - 17 s a batch once the table had grown (`docs/benchmarks.md`,
        // "The hub's own CPU in the initial load"). A custom plan sees the
        // table's size and the arrays' length every time.
        let mut q = sqlx::query(&sql).persistent(false);
        for (_, values) in columns {
            q = values.bind(q);
        }
        q.execute(&mut **tx).await?;
    }

    // The devices are locked and `before` is what this transaction read of
    // them, so a row `before` lacks is new: a plain INSERT, which costs
    // about half of an upsert's speculative insertion (issue 20).
    let (mut new, mut changed) = (ConditionColumns::default(), ConditionColumns::default());
    for (before, after) in pairs {
        for (is_new, _, row) in diff(&before.conditions, &after.conditions) {
            let to = if is_new { &mut new } else { &mut changed };
            to.push(&after.record.id, row);
        }
    }
    written.conditions = (new.device_id.len() + changed.device_id.len()) as u64;
    new.write(tx, INSERT_CONDITIONS).await?;
    changed.write(tx, UPDATE_CONDITIONS).await?;

    let (mut new, mut changed) = (FreshnessColumns::default(), FreshnessColumns::default());
    for (before, after) in pairs {
        for (is_new, source, f) in diff(&before.freshness, &after.freshness) {
            let to = if is_new { &mut new } else { &mut changed };
            to.push(&after.record.id, *source, f);
        }
    }
    written.freshness = (new.ids.len() + changed.ids.len()) as u64;
    new.write(tx, INSERT_FRESHNESS, now).await?;
    changed.write(tx, UPDATE_FRESHNESS, now).await?;
    write_bindings(tx, pairs).await?;
    let lowered: Vec<(&str, DateTime<Utc>)> = pairs
        .iter()
        .filter_map(|(before, after)| {
            let at = after.sweep_lowered(before, deadlines)?;
            Some((after.record.id.as_str(), at))
        })
        .collect();
    lower_sweep(tx, &lowered).await?;
    Ok(written)
}

/// The rows of `after` to write, each with whether `before` lacks it (an
/// INSERT) or holds another value (an UPDATE); rows equal in both are left
/// out.
fn diff<'a, K: Ord, V: PartialEq>(
    before: &'a BTreeMap<K, V>,
    after: &'a BTreeMap<K, V>,
) -> impl Iterator<Item = (bool, &'a K, &'a V)> {
    after.iter().filter_map(|(k, v)| match before.get(k) {
        None => Some((true, k, v)),
        Some(b) if b != v => Some((false, k, v)),
        Some(_) => None,
    })
}

const INSERT_FRESHNESS: &str = "INSERT INTO device_source_freshness \
    (device_id, source, observed_at, digest, settled_version, received_at) \
    SELECT i, s, o, g, v, $6 FROM UNNEST($1::text[], $2::text[], $3::timestamptz[], $4::bytea[], $5::bigint[]) \
    AS u(i, s, o, g, v)";

const UPDATE_FRESHNESS: &str = "UPDATE device_source_freshness f SET observed_at = u.o, digest = u.g, \
    settled_version = u.v, received_at = $6 \
    FROM UNNEST($1::text[], $2::text[], $3::timestamptz[], $4::bytea[], $5::bigint[]) AS u(i, s, o, g, v) \
    WHERE f.device_id = u.i AND f.source = u.s";

/// Freshness rows to write, one array per column.
#[derive(Default)]
struct FreshnessColumns<'a> {
    ids: Vec<&'a str>,
    sources: Vec<&'static str>,
    observed: Vec<DateTime<Utc>>,
    digests: Vec<&'a [u8]>,
    settled: Vec<i64>,
}

impl<'a> FreshnessColumns<'a> {
    fn push(&mut self, id: &'a str, source: Source, f: &'a Freshness) {
        self.ids.push(id);
        self.sources.push(source.as_str());
        self.observed.push(f.observed_at);
        self.digests.push(f.digest.as_slice());
        self.settled.push(f.settled_version);
    }

    async fn write(
        self,
        tx: &mut Tx<'_>,
        sql: &str,
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        if self.ids.is_empty() {
            return Ok(());
        }
        sqlx::query(sql)
            .bind(&self.ids)
            .bind(&self.sources)
            .bind(&self.observed)
            .bind(&self.digests)
            .bind(&self.settled)
            .bind(now)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

/// Upserts the `device_resource_bindings` rows that changed. Rows are never
/// deleted: a failed resource keeps its last-known row.
async fn write_bindings(
    tx: &mut Tx<'_>,
    pairs: &[(&DeviceState, &DeviceState)],
) -> Result<(), StoreError> {
    let changed: Vec<(&str, &BindingRow)> = pairs
        .iter()
        .flat_map(|(before, after)| {
            diff(&before.bindings, &after.bindings).map(|(_, _, b)| (after.record.id.as_str(), b))
        })
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    let col = |f: fn(&BindingRow) -> Option<String>| -> Vec<Option<String>> {
        changed.iter().map(|(_, b)| f(b)).collect()
    };
    let at = |f: fn(&BindingRow) -> Option<DateTime<Utc>>| -> Vec<Option<DateTime<Utc>>> {
        changed.iter().map(|(_, b)| f(b)).collect()
    };
    sqlx::query(
        "INSERT INTO device_resource_bindings (device_id, resource, source, resource_id, resolved_at, \
         failed_at, reason, message, observed_at) \
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], \
         $6::timestamptz[], $7::text[], $8::text[], $9::timestamptz[]) \
         ON CONFLICT (device_id, resource) DO UPDATE SET source = EXCLUDED.source, \
         resource_id = EXCLUDED.resource_id, resolved_at = EXCLUDED.resolved_at, \
         failed_at = EXCLUDED.failed_at, reason = EXCLUDED.reason, message = EXCLUDED.message, \
         observed_at = EXCLUDED.observed_at",
    )
    .bind(changed.iter().map(|(id, _)| *id).collect::<Vec<_>>())
    .bind(col(|b| Some(b.resource.as_str().to_string())))
    .bind(col(|b| Some(b.source.as_str().to_string())))
    .bind(col(|b| b.resource_id.clone()))
    .bind(at(|b| b.resolved_at))
    .bind(at(|b| b.failed_at))
    .bind(col(|b| Some(b.reason.clone())))
    .bind(col(|b| Some(b.message.clone())))
    .bind(at(|b| Some(b.observed_at)))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A device as the fast path sees it: locked, with its version and the
/// freshness rows of the sources a batch brings, nothing else loaded.
#[derive(Debug, Clone, Default)]
pub struct Head {
    pub version: i64,
    pub deleted: bool,
    pub connectivity: Option<Connectivity>,
    pub observed_generation: i64,
    pub identity_generation: i64,
    pub session: Session,
    pub freshness: BTreeMap<Source, Freshness>,
}

/// How [`lock_heads`] treats a device another transaction holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldRows {
    /// Wait for it.
    Wait,
    /// Pass it over (`SKIP LOCKED`): it is missing from the answer.
    Skip,
}

impl HeldRows {
    /// The locking clause of a read of `devices d`.
    fn lock(self) -> &'static str {
        match self {
            HeldRows::Wait => " FOR NO KEY UPDATE OF d",
            HeldRows::Skip => " FOR NO KEY UPDATE OF d SKIP LOCKED",
        }
    }
}

/// The columns of a [`Head`], from `devices d` and the freshness rows
/// `f` of the batch's sources.
const HEAD_COLUMNS: &str = "d.id, d.version, d.deleted_at IS NOT NULL AS deleted, d.connectivity, d.observed_generation, \
    d.identity_generation, d.session_epoch, d.session_gateway_id, d.session_connected_at, d.session_disconnected_at, \
    d.session_last_seen, f.source, f.observed_at, f.digest, f.settled_version";

/// Locks the devices in id order (as [`lock_states`] does) and reads only
/// their heads; with [`HeldRows::Skip`] a device held elsewhere is left out.
pub async fn lock_heads(
    tx: &mut Tx<'_>,
    ids: &[String],
    sources: &[&str],
    held: HeldRows,
) -> Result<BTreeMap<String, Head>, StoreError> {
    let mut out: BTreeMap<String, Head> = BTreeMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let lock = held.lock();
    let sql = format!(
        "SELECT {HEAD_COLUMNS} FROM devices d LEFT JOIN device_source_freshness f \
         ON f.device_id = d.id AND f.source = ANY($2) \
         WHERE d.id = ANY($1) ORDER BY d.id{lock}"
    );
    let rows = sqlx::query(&sql)
        .bind(ids)
        .bind(sources)
        .fetch_all(&mut **tx)
        .await?;
    for row in rows {
        read_head(&row, &mut out)?;
    }
    Ok(out)
}

/// [`resolve`] and [`lock_heads`] in one statement, for keys of a kind
/// that [`names_one_device`]: each device is found through its key's
/// unique index and locked, in id order, without a second look-up by id.
/// With [`HeldRows::Skip`] a key whose device another transaction holds
/// is missing from the answer, as a key that names no device is.
pub async fn resolve_and_lock_heads(
    tx: &mut Tx<'_>,
    kind: KeyKind,
    keys: &[(String, String)],
    sources: &[&str],
    held: HeldRows,
) -> Result<(Vec<((String, String), String)>, BTreeMap<String, Head>), StoreError> {
    let mut heads: BTreeMap<String, Head> = BTreeMap::new();
    let mut resolved = vec![];
    if keys.is_empty() {
        return Ok((resolved, heads));
    }
    let sites: Vec<&str> = keys.iter().map(|(s, _)| s.as_str()).collect();
    let values: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
    let sql = format!(
        "SELECT k.site AS key_site, k.key AS key_value, {HEAD_COLUMNS} \
         FROM UNNEST($1::text[], $2::text[]) AS k(site, key) JOIN devices d ON {} \
         LEFT JOIN device_source_freshness f ON f.device_id = d.id AND f.source = ANY($3) \
         ORDER BY d.id{}",
        key_match(kind),
        held.lock()
    );
    let rows = sqlx::query(&sql)
        .bind(&sites)
        .bind(&values)
        .bind(sources)
        .fetch_all(&mut **tx)
        .await?;
    for row in rows {
        let id = read_head(&row, &mut heads)?;
        let key: (String, String) = (row.try_get("key_site")?, row.try_get("key_value")?);
        // One row a freshness row of the device: its key once.
        if resolved.last().map(|(k, _)| k) != Some(&key) {
            resolved.push((key, id));
        }
    }
    Ok((resolved, heads))
}

/// Adds one row of [`HEAD_COLUMNS`] to its device's head; returns the
/// device id.
fn read_head(row: &PgRow, out: &mut BTreeMap<String, Head>) -> Result<String, StoreError> {
    let id: String = row.try_get("id")?;
    let head = out.entry(id.clone()).or_default();
    head.version = row.try_get("version")?;
    head.deleted = row.try_get("deleted")?;
    head.connectivity = Some(parse(row, "connectivity", Connectivity::parse)?);
    head.observed_generation = row.try_get("observed_generation")?;
    head.identity_generation = row.try_get("identity_generation")?;
    head.session = Session {
        epoch: row.try_get("session_epoch")?,
        gateway_id: row.try_get("session_gateway_id")?,
        connected_at: row.try_get("session_connected_at")?,
        disconnected_at: row.try_get("session_disconnected_at")?,
        last_seen: row.try_get("session_last_seen")?,
    };
    if let Some(source) = row.try_get("source")? {
        let (source, freshness) = freshness_from_row(row, source)?;
        head.freshness.insert(source, freshness);
    }
    Ok(id)
}

/// A `device_source_freshness` row (`observed_at`, `digest`,
/// `settled_version`) of `source`.
fn freshness_from_row(row: &PgRow, source: &str) -> Result<(Source, Freshness), StoreError> {
    let source = Source::parse(source).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok((
        source,
        Freshness {
            observed_at: row.try_get("observed_at")?,
            digest: row.try_get("digest")?,
            settled_version: row.try_get("settled_version")?,
        },
    ))
}

/// The heartbeat fast path's only write: a confirmed heartbeat moves
/// `session_last_seen` (never `version`, nor `derived_at`: nothing was
/// re-derived, so the sweeper's deadlines still count from the last
/// derivation).
pub async fn refresh_last_seen(
    tx: &mut Tx<'_>,
    rows: &[(&str, DateTime<Utc>)],
) -> Result<u64, sqlx::Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let ids: Vec<&str> = rows.iter().map(|r| r.0).collect();
    let seen: Vec<DateTime<Utc>> = rows.iter().map(|r| r.1).collect();
    let done = sqlx::query(
        "UPDATE devices d SET session_last_seen = u.t, updated_at = now() \
         FROM UNNEST($1::text[], $2::timestamptz[]) AS u(i, t) WHERE d.id = u.i",
    )
    .bind(&ids)
    .bind(&seen)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected())
}

/// The fast path's only write: a confirmed snapshot moves `observed_at`.
pub async fn refresh_freshness(
    tx: &mut Tx<'_>,
    rows: &[(&str, Source, DateTime<Utc>)],
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let ids: Vec<&str> = rows.iter().map(|r| r.0).collect();
    let sources: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    let observed: Vec<DateTime<Utc>> = rows.iter().map(|r| r.2).collect();
    let done = sqlx::query(
        "UPDATE device_source_freshness f SET observed_at = u.o, received_at = $4 \
         FROM UNNEST($1::text[], $2::text[], $3::timestamptz[]) AS u(i, s, o) \
         WHERE f.device_id = u.i AND f.source = u.s",
    )
    .bind(&ids)
    .bind(&sources)
    .bind(&observed)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected())
}

/// The condition rows' twelve column arrays, as [`ConditionColumns::write`]
/// binds them.
macro_rules! condition_arrays {
    () => {
        "UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], \
         $8::bool[], $9::timestamptz[], $10::timestamptz[], $11::bool[], $12::timestamptz[])"
    };
}

const INSERT_CONDITIONS: &str = concat!(
    "INSERT INTO device_conditions (device_id, type, status, reason, message, source, condition_of, durable, \
     observed_at, received_at, decisive, last_transition_at) SELECT * FROM ",
    condition_arrays!()
);

const UPDATE_CONDITIONS: &str = concat!(
    "UPDATE device_conditions c SET status = u.status, reason = u.reason, message = u.message, \
     source = u.source, condition_of = u.condition_of, durable = u.durable, observed_at = u.observed_at, \
     received_at = u.received_at, decisive = u.decisive, last_transition_at = u.last_transition_at FROM ",
    condition_arrays!(),
    " AS u(device_id, type, status, reason, message, source, condition_of, durable, observed_at, \
     received_at, decisive, last_transition_at) WHERE c.device_id = u.device_id AND c.type = u.type"
);

#[derive(Default)]
struct ConditionColumns<'a> {
    device_id: Vec<&'a str>,
    ctype: Vec<&'static str>,
    status: Vec<&'static str>,
    reason: Vec<&'a str>,
    message: Vec<&'a str>,
    source: Vec<&'static str>,
    condition_of: Vec<&'static str>,
    durable: Vec<bool>,
    observed_at: Vec<DateTime<Utc>>,
    received_at: Vec<DateTime<Utc>>,
    decisive: Vec<bool>,
    last_transition_at: Vec<DateTime<Utc>>,
}

impl<'a> ConditionColumns<'a> {
    fn push(&mut self, id: &'a str, r: &'a ConditionRow) {
        self.device_id.push(id);
        self.ctype.push(r.condition_type.as_str());
        self.status.push(r.status.as_str());
        self.reason.push(&r.reason);
        self.message.push(&r.message);
        self.source.push(r.source.as_str());
        self.condition_of.push(r.condition_of.as_str());
        self.durable.push(r.durable);
        self.observed_at.push(r.observed_at);
        self.received_at.push(r.received_at);
        self.decisive.push(r.decisive);
        self.last_transition_at.push(r.last_transition_at);
    }

    /// Runs `sql` ([`INSERT_CONDITIONS`] or [`UPDATE_CONDITIONS`]) over
    /// the rows.
    async fn write(self, tx: &mut Tx<'_>, sql: &str) -> Result<(), sqlx::Error> {
        if self.device_id.is_empty() {
            return Ok(());
        }
        sqlx::query(sql)
            .bind(&self.device_id)
            .bind(&self.ctype)
            .bind(&self.status)
            .bind(&self.reason)
            .bind(&self.message)
            .bind(&self.source)
            .bind(&self.condition_of)
            .bind(&self.durable)
            .bind(&self.observed_at)
            .bind(&self.received_at)
            .bind(&self.decisive)
            .bind(&self.last_transition_at)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

/// One lifecycle row per changed axis.
#[derive(Debug, Clone)]
pub struct LifecycleRow {
    pub device_id: String,
    pub kind: String,
    pub value: String,
    pub cause: String,
}

pub async fn insert_lifecycle(
    tx: &mut Tx<'_>,
    rows: &[LifecycleRow],
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = rows.iter().map(|r| r.device_id.as_str()).collect();
    let kinds: Vec<&str> = rows.iter().map(|r| r.kind.as_str()).collect();
    let values: Vec<&str> = rows.iter().map(|r| r.value.as_str()).collect();
    let causes: Vec<&str> = rows.iter().map(|r| r.cause.as_str()).collect();
    sqlx::query(
        "INSERT INTO device_lifecycle_events (device_id, kind, value, cause, created_at) \
         SELECT i, k, v, c, $5 FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[]) AS u(i, k, v, c)",
    )
    .bind(&ids)
    .bind(&kinds)
    .bind(&values)
    .bind(&causes)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Sets `derived_at` for devices a sweep re-derived without other changes,
/// so the sweeper does not pick them again.
pub async fn touch_derived(tx: &mut Tx<'_>, ids: &[String]) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE devices SET derived_at = now() WHERE id = ANY($1)")
        .bind(ids)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The sweeper's deadlines as query parameters `$2` - `$6` of the
/// statements below (`$1` is the devices' ids, or how many to look at):
/// each source's TTL and the default one, in seconds, and the two liveness
/// timeouts.
pub struct SweepParams {
    sources: Vec<&'static str>,
    ttl_secs: Vec<f64>,
    default_secs: f64,
    unreachable_secs: f64,
    lost_secs: f64,
}

impl SweepParams {
    pub fn new(d: &Deadlines) -> Self {
        let secs = |d: chrono::Duration| d.num_milliseconds() as f64 / 1000.0;
        SweepParams {
            sources: d.ttls.per_source.keys().map(|s| s.as_str()).collect(),
            ttl_secs: d.ttls.per_source.values().map(|d| secs(*d)).collect(),
            default_secs: secs(d.ttls.default),
            unreachable_secs: secs(d.unreachable_after),
            lost_secs: secs(d.lost_after),
        }
    }

    fn bind<'q>(
        &'q self,
        q: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
        q.bind(&self.sources)
            .bind(&self.ttl_secs)
            .bind(self.default_secs)
            .bind(self.unreachable_secs)
            .bind(self.lost_secs)
    }
}

/// When freshness row `f` goes silent: its source's TTL from the arrays
/// of [`SweepParams`] (`$2` the sources, `$3` their seconds), else the
/// default (`$4`).
const SILENT_AT: &str = "f.observed_at + make_interval(secs => \
    COALESCE(($3::float8[])[array_position($2::text[], f.source)], $4))";
/// Device `d`'s liveness deadlines (`$5`, `$6`).
const UNREACHABLE_AT: &str =
    "CASE WHEN d.connectivity = 'connected' THEN d.session_last_seen + make_interval(secs => $5) END";
const LOST_AT: &str = "CASE WHEN d.connectivity IN ('connected', 'unreachable') \
    THEN d.session_last_seen + make_interval(secs => $6) END";
/// Device `d` (of a `LEFT JOIN`: `d.id` may be NULL) exists and is not
/// deleted.
const LIVE: &str = "(d.id IS NOT NULL AND d.deleted_at IS NULL)";

/// `nf.at`: the earliest silence of device `d` still to come since it was
/// last derived (or passed since then), one read of its freshness rows.
fn next_silence() -> String {
    format!(
        "LEFT JOIN LATERAL (SELECT min({SILENT_AT}) AS at FROM device_source_freshness f \
         WHERE f.device_id = d.id AND {SILENT_AT} >= d.derived_at) nf ON true"
    )
}

/// Whether device `d` is live and due now: a source's silence passed since
/// it was last derived, or its session is past a liveness timeout.
fn due_now() -> String {
    format!("COALESCE({LIVE} AND (nf.at <= now() OR {UNREACHABLE_AT} < now() OR {LOST_AT} < now()), false)")
}

/// Device `d`'s earliest deadline since its last derivation; NULL for
/// none, and for a deleted or missing device.
fn next_sweep() -> String {
    format!("CASE WHEN {LIVE} THEN LEAST(nf.at, {UNREACHABLE_AT}, {LOST_AT}) END")
}

/// Looks at up to `limit` devices whose `sweep_at` has passed, earliest
/// first (`device_sweep_at` finds them), in one statement and without
/// locking the devices: returns each with whether it is due now, and sets
/// the `sweep_at` of each one not due to its next deadline. A due device
/// is left to [`due_among`] and [`set_sweep`] under its lock.
///
/// The statement never waits for a writer: a `device_sweep` row another
/// transaction holds (a lane bringing `sweep_at` forward) is passed over
/// until the next sweep, so a lane never queues behind a look that queues
/// behind another lane. A row it locks may still have been brought forward
/// by a write that committed after this statement's snapshot, whose rows
/// the computed deadline lacks: `lowered` as of the snapshot (read apart
/// from the locking read, which sees the latest) then differs from the
/// row's, and the row is left alone, to be looked at again.
pub async fn look_for_sweep(
    pool: &sqlx::PgPool,
    limit: i64,
    p: &SweepParams,
) -> Result<Vec<(String, bool)>, sqlx::Error> {
    let sql = format!(
        "WITH c AS (SELECT device_id FROM device_sweep WHERE sweep_at <= now() \
               ORDER BY sweep_at LIMIT $1 FOR UPDATE SKIP LOCKED), \
         n AS (SELECT c.device_id, w.lowered, {} AS due, {} AS next \
               FROM c JOIN device_sweep w ON w.device_id = c.device_id \
               LEFT JOIN devices d ON d.id = c.device_id {}), \
         u AS (UPDATE device_sweep s SET sweep_at = n.next FROM n \
               WHERE s.device_id = n.device_id AND s.lowered = n.lowered AND NOT n.due) \
         SELECT device_id, due FROM n",
        due_now(),
        next_sweep(),
        next_silence()
    );
    let rows = p
        .bind(sqlx::query(&sql).bind(limit))
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("device_id")?, r.try_get("due")?)))
        .collect()
}

/// How many whole seconds ago the earliest `sweep_at` still waiting
/// passed; 0 when none has.
pub async fn sweep_behind(pool: &sqlx::PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT COALESCE(floor(extract(epoch FROM now() - min(sweep_at))), 0)::bigint \
         FROM device_sweep WHERE sweep_at <= now()",
    )
    .fetch_one(pool)
    .await
}

/// Of `ids` (locked by this transaction), the live devices due now.
pub async fn due_among(
    tx: &mut Tx<'_>,
    ids: &[String],
    p: &SweepParams,
) -> Result<Vec<String>, sqlx::Error> {
    let sql = format!(
        "SELECT d.id FROM devices d {} WHERE d.id = ANY($1) AND {} ORDER BY d.id",
        next_silence(),
        due_now()
    );
    let rows = p
        .bind(sqlx::query(&sql).bind(ids))
        .fetch_all(&mut **tx)
        .await?;
    rows.iter().map(|r| r.try_get("id")).collect()
}

/// Sets `sweep_at` of `ids` (locked by this transaction, and read after
/// the lock, so no write of theirs is missed) to their next deadline.
pub async fn set_sweep(
    tx: &mut Tx<'_>,
    ids: &[String],
    p: &SweepParams,
) -> Result<(), sqlx::Error> {
    let sql = format!(
        "INSERT INTO device_sweep (device_id, sweep_at) \
         SELECT i.id, {} FROM UNNEST($1::text[]) AS i(id) LEFT JOIN devices d ON d.id = i.id {} \
         ON CONFLICT (device_id) DO UPDATE SET sweep_at = EXCLUDED.sweep_at",
        next_sweep(),
        next_silence()
    );
    p.bind(sqlx::query(&sql).bind(ids))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Brings `sweep_at` forward to a deadline a write brought
/// ([`DeviceState::sweep_lowered`]), one row a device, and counts
/// `lowered` up, so that a sweep that read the device before this write
/// does not set a later one.
pub async fn lower_sweep(
    tx: &mut Tx<'_>,
    rows: &[(&str, DateTime<Utc>)],
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = rows.iter().map(|r| r.0).collect();
    let at: Vec<DateTime<Utc>> = rows.iter().map(|r| r.1).collect();
    sqlx::query(
        "INSERT INTO device_sweep (device_id, sweep_at) \
         SELECT * FROM UNNEST($1::text[], $2::timestamptz[]) \
         ON CONFLICT (device_id) DO UPDATE SET \
         sweep_at = LEAST(device_sweep.sweep_at, EXCLUDED.sweep_at), lowered = device_sweep.lowered + 1",
    )
    .bind(&ids)
    .bind(&at)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A sweeper's turn ([`fleet_domain::state::sweep_turn`]) for a replica
/// whose settings have `fingerprint` ([`Deadlines::fingerprint`]), read and
/// acted on in one transaction that holds `hub_sweep_settings`: on
/// [`SweepTurn::Sweep`] with `mark_all` every live device is made due, so
/// the sweeper computes its `sweep_at` again under these settings, and the
/// settings are recorded. Returns the turn and how many devices were
/// marked.
pub async fn take_sweep_turn(
    pool: &sqlx::PgPool,
    fingerprint: &str,
) -> Result<(SweepTurn, Option<u64>), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let recorded: Option<(String, bool)> =
        sqlx::query_as("SELECT deadlines, mixed FROM hub_sweep_settings FOR UPDATE")
            .fetch_optional(&mut *tx)
            .await?;
    let (newest, others_live): (Option<String>, bool) = sqlx::query_as(
        "SELECT (SELECT deadlines FROM hub_replicas \
                  WHERE expires_at > now() AND deadlines IS NOT NULL \
                  ORDER BY started_at DESC, replica DESC LIMIT 1), \
                EXISTS (SELECT 1 FROM hub_replicas \
                         WHERE expires_at > now() AND deadlines IS DISTINCT FROM $1)",
    )
    .bind(fingerprint)
    .fetch_one(&mut *tx)
    .await?;
    let seen = SweepSettings {
        recorded: recorded.as_ref().map(|(f, mixed)| (f.as_str(), *mixed)),
        newest: newest.as_deref(),
        others_live,
    };
    let turn = sweep_turn(fingerprint, &seen);
    let SweepTurn::Sweep { mark_all, mixed } = turn else {
        return Ok((turn, None));
    };
    let marked = if mark_all {
        Some(
            sqlx::query(
                "INSERT INTO device_sweep (device_id, sweep_at) \
                 SELECT id, now() FROM devices WHERE deleted_at IS NULL \
                 ON CONFLICT (device_id) DO UPDATE SET sweep_at = now(), lowered = device_sweep.lowered + 1",
            )
            .execute(&mut *tx)
            .await?
            .rows_affected(),
        )
    } else {
        None
    };
    if seen.recorded != Some((fingerprint, mixed)) {
        sqlx::query(
            "INSERT INTO hub_sweep_settings (deadlines, mixed) VALUES ($1, $2) \
             ON CONFLICT (singleton) DO UPDATE SET deadlines = EXCLUDED.deadlines, mixed = EXCLUDED.mixed",
        )
        .bind(fingerprint)
        .bind(mixed)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok((turn, marked))
}

/// The join condition of `devices d` with a key `k(site, key)` of `kind`,
/// live devices only.
fn key_match(kind: KeyKind) -> String {
    let (matched, site_scoped) = match kind {
        KeyKind::DeviceId => ("d.id = k.key", false),
        // Compared as a number, so that `devices_netbox_id` finds it (as
        // text it read every device: 60 ms for 256 keys at 100,000
        // devices, 3 ms this way); a key that is not a NetBox id in
        // canonical decimal names no device, as before.
        KeyKind::NetboxId => (
            "d.netbox_id = CASE WHEN k.key ~ '^[1-9][0-9]{0,17}$' THEN k.key::bigint END",
            true,
        ),
        KeyKind::Name => ("d.name = k.key", true),
        KeyKind::Serial => ("d.serial = k.key", false),
        KeyKind::InfrastructureRef => ("d.infrastructure_ref = k.key", false),
        KeyKind::BmcAddress => ("d.bmc_address = k.key", false),
    };
    let site_clause = if site_scoped {
        "AND d.site_id = k.site"
    } else {
        ""
    };
    format!("{matched} {site_clause} AND d.deleted_at IS NULL")
}

/// Whether a key of `kind` names at most one live device (a unique index
/// says so: `devices_pkey`, `devices_site_name`, `devices_netbox_id`), so
/// that resolving it
/// and locking its device can be one statement
/// ([`resolve_and_lock_heads`]).
pub fn names_one_device(kind: KeyKind) -> bool {
    matches!(kind, KeyKind::DeviceId | KeyKind::Name | KeyKind::NetboxId)
}

/// The device key kinds resolved in one query each.
pub async fn resolve(
    tx: &mut Tx<'_>,
    kind: KeyKind,
    keys: &[(String, String)],
) -> Result<Vec<((String, String), String)>, sqlx::Error> {
    if keys.is_empty() {
        return Ok(vec![]);
    }
    let sites: Vec<&str> = keys.iter().map(|(s, _)| s.as_str()).collect();
    let values: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
    let sql = format!(
        "SELECT k.site, k.key, d.id FROM UNNEST($1::text[], $2::text[]) AS k(site, key) \
         JOIN devices d ON {}",
        key_match(kind)
    );
    let rows: Vec<(String, String, String)> = sqlx::query_as(&sql)
        .bind(&sites)
        .bind(&values)
        .fetch_all(&mut **tx)
        .await?;
    Ok(rows.into_iter().map(|(s, k, id)| ((s, k), id)).collect())
}

/// An observation whose external key resolved to no device.
#[derive(Debug, Clone)]
pub struct Unresolved<'a> {
    pub source: &'a str,
    pub site: &'a str,
    pub key_kind: &'a str,
    pub key: &'a str,
    pub observed_at: DateTime<Utc>,
    pub payload: &'a [u8],
}

/// Keeps the latest observation per external key that resolved to nothing,
/// and how often each was seen: one statement for a whole batch (a fleet
/// whose connectors read before its NetBox import finished sends hundreds
/// of thousands). Entries for the same key are merged first, the latest
/// `observed_at` winning, since one statement cannot update a row twice.
pub async fn record_unresolved(
    tx: &mut Tx<'_>,
    list: &[Unresolved<'_>],
) -> Result<(), sqlx::Error> {
    if list.is_empty() {
        return Ok(());
    }
    let mut merged: HashMap<(&str, &str, &str, &str), (&Unresolved<'_>, i64)> = HashMap::new();
    for u in list {
        merged
            .entry((u.source, u.site, u.key_kind, u.key))
            .and_modify(|(best, n)| {
                *n += 1;
                if u.observed_at >= best.observed_at {
                    *best = u;
                }
            })
            .or_insert((u, 1));
    }
    let mut rows: Vec<(&Unresolved<'_>, i64)> = merged.into_values().collect();
    // A fixed order, so two batches never wait on each other's rows in turn.
    rows.sort_by_key(|(u, _)| (u.source, u.site, u.key_kind, u.key));
    let (mut sources, mut sites, mut kinds, mut keys) = (vec![], vec![], vec![], vec![]);
    for (u, _) in &rows {
        sources.push(u.source);
        sites.push(u.site);
        kinds.push(u.key_kind);
        keys.push(u.key);
    }
    sqlx::query(
        "INSERT INTO unresolved_observations (source, site, key_kind, key, observed_at, received_at, seen_count, payload, payload_bytes) \
         SELECT s, t, k, y, o, now(), n, p, b \
           FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::bigint[], $7::bytea[], $8::bigint[]) \
             AS u(s, t, k, y, o, n, p, b) \
         ON CONFLICT (source, site, key_kind, key) DO UPDATE SET \
         seen_count = unresolved_observations.seen_count + EXCLUDED.seen_count, \
         received_at = now(), \
         observed_at = GREATEST(unresolved_observations.observed_at, EXCLUDED.observed_at), \
         payload = CASE WHEN EXCLUDED.observed_at >= unresolved_observations.observed_at \
                   THEN EXCLUDED.payload ELSE unresolved_observations.payload END, \
         payload_bytes = CASE WHEN EXCLUDED.observed_at >= unresolved_observations.observed_at \
                   THEN EXCLUDED.payload_bytes ELSE unresolved_observations.payload_bytes END",
    )
    .bind(sources)
    .bind(sites)
    .bind(kinds)
    .bind(keys)
    .bind(rows.iter().map(|(u, _)| u.observed_at).collect::<Vec<_>>())
    .bind(rows.iter().map(|(_, n)| *n).collect::<Vec<_>>())
    .bind(
        rows.iter()
            .map(|(u, _)| &u.payload[..u.payload.len().min(MAX_UNRESOLVED_PAYLOAD)])
            .collect::<Vec<_>>(),
    )
    .bind(rows.iter().map(|(u, _)| u.payload.len() as i64).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The most of an unresolved observation's payload that is kept.
pub const MAX_UNRESOLVED_PAYLOAD: usize = 16 * 1024;

/// Removes unresolved keys not seen since `before`, then the oldest past
/// `max_rows`; returns how many went.
pub async fn expire_unresolved(
    pool: &sqlx::PgPool,
    before: DateTime<Utc>,
    max_rows: i64,
) -> Result<u64, sqlx::Error> {
    let old = sqlx::query("DELETE FROM unresolved_observations WHERE received_at < $1")
        .bind(before)
        .execute(pool)
        .await?
        .rows_affected();
    let over = sqlx::query(
        "DELETE FROM unresolved_observations WHERE ctid IN ( \
           SELECT ctid FROM unresolved_observations ORDER BY received_at DESC OFFSET $1)",
    )
    .bind(max_rows.max(0))
    .execute(pool)
    .await?
    .rows_affected();
    Ok(old + over)
}

/// What a create-device command inserts.
#[derive(Debug, Clone)]
pub struct NewDevice {
    pub id: String,
    pub site_id: String,
    pub name: String,
    pub serial: Option<String>,
    pub netbox_id: Option<i64>,
    pub bmc_address: Option<String>,
    pub infrastructure_ref: Option<String>,
    pub pool_id: Option<String>,
    pub owner_tenant_id: Option<String>,
    pub rack: Option<String>,
    pub device_class: DeviceClass,
    pub role: Role,
    pub trust: Trust,
    pub inventory_status: InventoryStatus,
    pub provision_state: ProvisionState,
    pub labels: Value,
    /// What a node agent's join brings (`join`); `None` for other creates.
    pub agent: Option<AgentFacts>,
}

/// The machine facts a node agent's join records with the device.
#[derive(Debug, Clone)]
pub struct AgentFacts {
    pub hardware_key: String,
    pub hardware_key_trusted: bool,
    pub gpu_count: i32,
}

/// Inserts the device with `inventory_only` inherited from its site (seed
/// 002: "forces inventory_only=True when the site carries the flag").
/// `None` when the site does not exist.
pub async fn insert_device(tx: &mut Tx<'_>, d: &NewDevice) -> Result<Option<()>, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO devices (id, name, site_id, pool_id, owner_tenant_id, rack, serial, netbox_id, bmc_address, \
         infrastructure_ref, device_class, role, trust, inventory_status, provision_state, labels, inventory_only, \
         hardware_key, hardware_key_trusted, gpu_count) \
         SELECT $1, $2, s.id, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, s.inventory_only, \
         $17, COALESCE($18, false), $19 \
         FROM sites s WHERE s.id = $3",
    )
    .bind(&d.id)
    .bind(&d.name)
    .bind(&d.site_id)
    .bind(&d.pool_id)
    .bind(&d.owner_tenant_id)
    .bind(&d.rack)
    .bind(&d.serial)
    .bind(d.netbox_id)
    .bind(&d.bmc_address)
    .bind(&d.infrastructure_ref)
    .bind(d.device_class.as_str())
    .bind(d.role.as_str())
    .bind(d.trust.as_str())
    .bind(d.inventory_status.as_str())
    .bind(d.provision_state.as_str())
    .bind(&d.labels)
    .bind(d.agent.as_ref().map(|a| &a.hardware_key))
    .bind(d.agent.as_ref().map(|a| a.hardware_key_trusted))
    .bind(d.agent.as_ref().map(|a| a.gpu_count))
    .execute(&mut **tx)
    .await?;
    Ok((done.rows_affected() == 1).then_some(()))
}

/// The live devices holding these trusted hardware keys: key -> (id, site).
pub async fn trusted_by_key(
    tx: &mut Tx<'_>,
    keys: &[&str],
) -> Result<HashMap<String, (String, String)>, sqlx::Error> {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT hardware_key, id, site_id FROM devices \
         WHERE hardware_key = ANY($1) AND hardware_key_trusted AND deleted_at IS NULL",
    )
    .bind(keys)
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(k, id, site)| (k, (id, site)))
        .collect())
}

/// The live devices without a hardware key (imported, never joined) of
/// these sites and names: (site, name) -> (id, serial).
pub async fn imported_by_name(
    tx: &mut Tx<'_>,
    names: &[(&str, &str)],
) -> Result<HashMap<(String, String), (String, Option<String>)>, sqlx::Error> {
    if names.is_empty() {
        return Ok(HashMap::new());
    }
    let (sites, names): (Vec<&str>, Vec<&str>) = names.iter().copied().unzip();
    let rows: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT d.site_id, d.name, d.id, d.serial FROM devices d \
         JOIN unnest($1::text[], $2::text[]) AS n(site_id, name) \
           ON d.site_id = n.site_id AND d.name = n.name \
         WHERE d.deleted_at IS NULL AND d.hardware_key IS NULL",
    )
    .bind(&sites)
    .bind(&names)
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(site, name, id, serial)| ((site, name), (id, serial)))
        .collect())
}

/// Records each agent's key and GPUs on its device, when the device still
/// has no key; the ids it did.
pub async fn claim_many(
    tx: &mut Tx<'_>,
    claims: &[(&str, &AgentFacts)],
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    if claims.is_empty() {
        return Ok(Default::default());
    }
    let ids: Vec<&str> = claims.iter().map(|(id, _)| *id).collect();
    let keys: Vec<&str> = claims
        .iter()
        .map(|(_, a)| a.hardware_key.as_str())
        .collect();
    let trusted: Vec<bool> = claims.iter().map(|(_, a)| a.hardware_key_trusted).collect();
    let gpus: Vec<i32> = claims.iter().map(|(_, a)| a.gpu_count).collect();
    let done: Vec<(String,)> = sqlx::query_as(
        "UPDATE devices d SET hardware_key = c.key, hardware_key_trusted = c.trusted, \
                gpu_count = c.gpus \
         FROM unnest($1::text[], $2::text[], $3::bool[], $4::int4[]) AS c(id, key, trusted, gpus) \
         WHERE d.id = c.id AND d.hardware_key IS NULL AND d.deleted_at IS NULL \
         RETURNING d.id",
    )
    .bind(&ids)
    .bind(&keys)
    .bind(&trusted)
    .bind(&gpus)
    .fetch_all(&mut **tx)
    .await?;
    Ok(done.into_iter().map(|(id,)| id).collect())
}

/// Trusted re-joins: the GPUs each agent reports now.
pub async fn set_gpu_counts(tx: &mut Tx<'_>, counts: &[(&str, i32)]) -> Result<(), sqlx::Error> {
    if counts.is_empty() {
        return Ok(());
    }
    let (ids, gpus): (Vec<&str>, Vec<i32>) = counts.iter().copied().unzip();
    sqlx::query(
        "UPDATE devices d SET gpu_count = c.gpus \
         FROM unnest($1::text[], $2::int4[]) AS c(id, gpus) WHERE d.id = c.id",
    )
    .bind(&ids)
    .bind(&gpus)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// What each device of a batch refers to and does not exist (site, pool,
/// tenant), by device id: those would fail the whole insert.
pub async fn missing_references<'a>(
    tx: &mut Tx<'_>,
    devices: impl Iterator<Item = &'a NewDevice>,
) -> Result<std::collections::HashMap<String, String>, sqlx::Error> {
    let devices: Vec<&NewDevice> = devices.collect();
    let mut out = std::collections::HashMap::new();
    if devices.is_empty() {
        return Ok(out);
    }
    let sites = existing_ids(
        tx,
        "sites",
        devices.iter().map(|d| d.site_id.as_str()).collect(),
    )
    .await?;
    let pools = existing_ids(
        tx,
        "pools",
        devices
            .iter()
            .filter_map(|d| d.pool_id.as_deref())
            .collect(),
    )
    .await?;
    let tenants = existing_ids(
        tx,
        "tenants",
        devices
            .iter()
            .filter_map(|d| d.owner_tenant_id.as_deref())
            .collect(),
    )
    .await?;
    for d in devices {
        let missing = if !sites.contains(&d.site_id) {
            Some(format!("site {}", d.site_id))
        } else if let Some(p) = d.pool_id.as_ref().filter(|p| !pools.contains(*p)) {
            Some(format!("pool {p}"))
        } else {
            d.owner_tenant_id
                .as_ref()
                .filter(|t| !tenants.contains(*t))
                .map(|t| format!("tenant {t}"))
        };
        if let Some(m) = missing {
            out.insert(d.id.clone(), m);
        }
    }
    Ok(out)
}

async fn existing_ids(
    tx: &mut Tx<'_>,
    table: &'static str,
    ids: Vec<&str>,
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Default::default());
    }
    let found: Vec<String> =
        sqlx::query_scalar(&format!("SELECT id FROM {table} WHERE id = ANY($1)"))
            .bind(&ids)
            .fetch_all(&mut **tx)
            .await?;
    Ok(found.into_iter().collect())
}

/// Inserts many devices with one statement; a device whose name or NetBox
/// id exists in its site is skipped. Returns the ids inserted. References
/// must exist (see [`missing_references`]).
pub async fn insert_devices(
    tx: &mut Tx<'_>,
    devices: &[NewDevice],
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    if devices.is_empty() {
        return Ok(Default::default());
    }
    let col = |f: fn(&NewDevice) -> Option<&str>| -> Vec<Option<&str>> {
        devices.iter().map(f).collect()
    };
    let ids = col(|d| Some(&d.id));
    let names = col(|d| Some(&d.name));
    let sites = col(|d| Some(&d.site_id));
    let pools = col(|d| d.pool_id.as_deref());
    let tenants = col(|d| d.owner_tenant_id.as_deref());
    let racks = col(|d| d.rack.as_deref());
    let serials = col(|d| d.serial.as_deref());
    let bmcs = col(|d| d.bmc_address.as_deref());
    let refs = col(|d| d.infrastructure_ref.as_deref());
    let classes = col(|d| Some(d.device_class.as_str()));
    let roles = col(|d| Some(d.role.as_str()));
    let trusts = col(|d| Some(d.trust.as_str()));
    let inventory = col(|d| Some(d.inventory_status.as_str()));
    let provision = col(|d| Some(d.provision_state.as_str()));
    let netbox: Vec<Option<i64>> = devices.iter().map(|d| d.netbox_id).collect();
    let labels: Vec<Value> = devices.iter().map(|d| d.labels.clone()).collect();
    let inserted: Vec<String> = sqlx::query_scalar(
        "INSERT INTO devices (id, name, site_id, pool_id, owner_tenant_id, rack, serial, netbox_id, bmc_address, \
         infrastructure_ref, device_class, role, trust, inventory_status, provision_state, labels, inventory_only) \
         SELECT u.id, u.name, s.id, u.pool, u.tenant, u.rack, u.serial, u.netbox, u.bmc, u.ref, u.class, u.role, \
         u.trust, u.inv, u.prov, u.labels, s.inventory_only \
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], \
         $8::bigint[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], \
         $16::jsonb[]) WITH ORDINALITY AS u(id, name, site, pool, tenant, rack, serial, netbox, bmc, ref, class, role, \
         trust, inv, prov, labels, n) \
         JOIN sites s ON s.id = u.site ORDER BY u.n \
         ON CONFLICT DO NOTHING RETURNING id",
    )
    .bind(&ids)
    .bind(&names)
    .bind(&sites)
    .bind(&pools)
    .bind(&tenants)
    .bind(&racks)
    .bind(&serials)
    .bind(&netbox)
    .bind(&bmcs)
    .bind(&refs)
    .bind(&classes)
    .bind(&roles)
    .bind(&trusts)
    .bind(&inventory)
    .bind(&provision)
    .bind(&labels)
    .fetch_all(&mut **tx)
    .await?;
    Ok(inserted.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_array_literal_quotes_and_escapes_every_element() {
        let s =
            |v: &[&str]| text_array_literal(&v.iter().map(|x| x.to_string()).collect::<Vec<_>>());
        assert_eq!(s(&[]), "{}");
        assert_eq!(s(&["unreachable"]), r#"{"unreachable"}"#);
        assert_eq!(s(&["", "NULL", "a,b"]), r#"{"","NULL","a,b"}"#);
        assert_eq!(
            s(&[r#"say "hi""#, r"back\slash", "{x}"]),
            r#"{"say \"hi\"","back\\slash","{x}"}"#
        );
    }

    #[test]
    fn only_the_columns_that_changed_are_bound() {
        let a = DeviceRecord::new("d1".into(), "s1".into(), "n1".into());
        let b = DeviceRecord::new("d2".into(), "s1".into(), "n2".into());
        let mut a2 = a.clone();
        a2.version += 1;
        a2.cordoned = true;
        let mut b2 = b.clone();
        b2.version += 1;
        b2.taints = vec!["maintenance".into()];
        let columns = changed_columns(&[(&a, &a2), (&b, &b2)]);
        let names: Vec<&str> = columns.iter().map(|c| c.0).collect();
        assert_eq!(names, ["id", "version", "cordoned", "taints"]);
        // Each bound column carries every row's new value, also where that
        // row's value did not change.
        assert_eq!(columns[2].1, Values::Bool(vec![Some(true), Some(false)]));
        let sql = update_devices(&columns);
        assert!(
            sql.contains("cordoned = x.cordoned, taints = x.taints::text[], updated_at = now()")
        );
        assert!(
            !sql.contains("power"),
            "an unchanged column is not written: {sql}"
        );
        // Nothing changed in the columns the UPDATE writes: only the
        // timestamps.
        let sql = update_devices(&changed_columns(&[(&a, &a)]));
        assert!(sql.starts_with("UPDATE devices d SET updated_at = now(), derived_at = now() FROM UNNEST($1::text[]) AS x(id)"), "{sql}");
    }

    #[test]
    fn the_update_names_each_column_once_with_its_parameter() {
        let r = DeviceRecord::new("d1".into(), "s1".into(), "n1".into());
        let columns: Vec<_> = DEVICE_COLUMNS_WRITTEN
            .iter()
            .map(|(name, column)| (*name, column.values(&[&r])))
            .collect();
        let sql = update_devices(&columns);
        let mut names: Vec<&str> = columns.iter().map(|(n, _)| *n).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "a column named twice");
        assert!(sql.contains(&format!("${n}::bigint[]")));
        assert!(!sql.contains(&format!("${}::", n + 1)));
        assert!(sql.contains("taints = x.taints::text[]"));
        assert!(sql.contains("deleted_at = CASE WHEN x.deleted"));
        assert!(!sql.contains(" id = x.id,"), "the key is not set");
    }
}
