//! The storm guard in the creating transaction (`fleet_domain::storm`
//! decides): before a job's or an impairment cordon's first JOBS message
//! is queued, count per site and pool what it would take out of service
//! against what admitted work took within the window. A trip records why
//! and queues nothing: the work waits for an operator's confirmation
//! (`confirm_job`, `confirm_impairment`), which admits it.

use fleet_domain::storm::{self, Count, Policy, ScopeKind};
use fleet_domain::OperationalStatus;
use sqlx::{Postgres, Transaction};

type Tx<'a> = Transaction<'a, Postgres>;

/// One device as the guard counts it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Candidate {
    pub id: String,
    pub site_id: String,
    pub pool_id: Option<String>,
    pub operational_status: String,
    pub entered_service: bool,
}

impl Candidate {
    /// Whether work on it takes it out of service.
    fn taken(&self) -> bool {
        let status = OperationalStatus::parse(&self.operational_status)
            .unwrap_or(OperationalStatus::Unknown);
        storm::in_service(status, self.entered_service)
    }

    fn scopes(&self) -> Vec<(ScopeKind, String)> {
        let mut out = vec![(ScopeKind::Site, self.site_id.clone())];
        out.extend(self.pool_id.clone().map(|p| (ScopeKind::Pool, p)));
        out
    }
}

async fn candidates(tx: &mut Tx<'_>, ids: &[String]) -> Result<Vec<Candidate>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, site_id, pool_id, operational_status, entered_service_at IS NOT NULL AS entered_service \
         FROM devices WHERE id = ANY($1) ORDER BY id",
    )
    .bind(ids)
    .fetch_all(&mut **tx)
    .await
}

/// What the work would take, per scope it touches (sorted).
fn taking(devices: &[Candidate]) -> Vec<((ScopeKind, String), Vec<&Candidate>)> {
    let mut by: std::collections::BTreeMap<(ScopeKind, String), Vec<&Candidate>> =
        Default::default();
    for d in devices.iter().filter(|d| d.taken()) {
        for scope in d.scopes() {
            by.entry(scope).or_default().push(d);
        }
    }
    by.into_iter().collect()
}

/// Counts every scope the work on `ids` touches and returns those it trips
/// (empty: admitted, and its devices are in the ledger; otherwise the trips
/// are recorded and the work is held). Serialised per scope, so two jobs
/// created at once cannot both squeeze under the limit.
pub(crate) async fn guard(
    tx: &mut Tx<'_>,
    policy: &Policy,
    work: Held,
    id: &str,
    ids: &[String],
) -> Result<Vec<Count>, sqlx::Error> {
    let devices = &candidates(tx, ids).await?;
    let scopes = taking(devices);
    let mut counts = Vec::with_capacity(scopes.len());
    for ((kind, scope), taken) in &scopes {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('fleet-storm:' || $1 || ':' || $2))")
            .bind(kind.as_str())
            .bind(scope)
            .execute(&mut **tx)
            .await?;
        let column = match kind {
            ScopeKind::Site => "site_id",
            ScopeKind::Pool => "pool_id",
        };
        let in_service: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM devices WHERE {column} = $1 AND deleted_at IS NULL \
             AND NOT inventory_only AND entered_service_at IS NOT NULL AND operational_status <> 'failed'"
        ))
        .bind(scope)
        .fetch_one(&mut **tx)
        .await?;
        let in_window: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT device_id) FROM storm_ledger WHERE scope_kind = $1 AND scope_id = $2 \
             AND taken_at > now() - make_interval(secs => $3) AND NOT device_id = ANY($4)",
        )
        .bind(kind.as_str())
        .bind(scope)
        .bind(policy.window.as_secs_f64())
        .bind(taken.iter().map(|d| d.id.clone()).collect::<Vec<_>>())
        .fetch_one(&mut **tx)
        .await?;
        counts.push(Count {
            scope_kind: *kind,
            scope_id: scope.clone(),
            in_service: in_service as usize,
            taking: taken.len(),
            in_window: in_window as usize,
        });
    }
    let trips: Vec<Count> = counts.into_iter().filter(|c| policy.trips(c)).collect();
    if trips.is_empty() {
        admit(tx, work, id, devices).await?;
        return Ok(trips);
    }
    for c in &trips {
        sqlx::query(
            "INSERT INTO storm_trips (kind, id, scope_kind, scope_id, in_service, taking, in_window, device_limit) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(work.kind())
        .bind(id)
        .bind(c.scope_kind.as_str())
        .bind(&c.scope_id)
        .bind(c.in_service as i32)
        .bind(c.taking as i32)
        .bind(c.in_window as i32)
        .bind(policy.limit(c.in_service) as i32)
        .execute(&mut **tx)
        .await?;
    }
    hold(tx, work, id).await?;
    Ok(trips)
}

/// Records what admitted work takes out of service, in every scope.
async fn admit(
    tx: &mut Tx<'_>,
    work: Held,
    id: &str,
    devices: &[Candidate],
) -> Result<(), sqlx::Error> {
    let mut kinds = vec![];
    let mut scopes = vec![];
    let mut ids = vec![];
    for ((kind, scope), taken) in taking(devices) {
        for d in taken {
            kinds.push(kind.as_str());
            scopes.push(scope.clone());
            ids.push(d.id.clone());
        }
    }
    sqlx::query(
        "INSERT INTO storm_ledger (scope_kind, scope_id, device_id, kind, id) \
         SELECT k, s, d, $4, $5 FROM unnest($1::text[], $2::text[], $3::text[]) AS x(k, s, d) \
         ON CONFLICT DO NOTHING",
    )
    .bind(&kinds)
    .bind(&scopes)
    .bind(&ids)
    .bind(work.kind())
    .bind(id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The trips a waiting job or event recorded.
pub(crate) async fn trips<'e>(
    db: impl sqlx::PgExecutor<'e>,
    work: Held,
    id: &str,
) -> Result<Vec<TripRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT scope_kind, scope_id, in_service, taking, in_window, device_limit FROM storm_trips \
         WHERE kind = $1 AND id = $2 ORDER BY scope_kind, scope_id",
    )
    .bind(work.kind())
    .bind(id)
    .fetch_all(db)
    .await
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct TripRow {
    pub scope_kind: String,
    pub scope_id: String,
    pub in_service: i32,
    pub taking: i32,
    pub in_window: i32,
    pub device_limit: i32,
}

impl TripRow {
    pub fn to_proto(&self) -> fleet_proto::v1::StormTrip {
        fleet_proto::v1::StormTrip {
            scope_kind: self.scope_kind.clone(),
            scope_id: self.scope_id.clone(),
            in_service: self.in_service,
            taking: self.taking,
            in_window: self.in_window,
            limit: self.device_limit,
        }
    }
}

/// Work the storm guard counts and may hold: a job, or an impairment
/// event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    Job,
    ImpairmentEvent,
}

impl Held {
    /// What a refusal calls it.
    pub fn noun(self) -> &'static str {
        match self {
            Held::Job => "job",
            Held::ImpairmentEvent => "impairment event",
        }
    }

    /// Its `storm_trips.kind` and `storm_ledger.kind`.
    fn kind(self) -> &'static str {
        match self {
            Held::Job => "job",
            Held::ImpairmentEvent => "impairment",
        }
    }

    fn table(self) -> &'static str {
        match self {
            Held::Job => "jobs",
            Held::ImpairmentEvent => "impairment_events",
        }
    }

    /// The table of its devices and the column there that names it.
    fn devices(self) -> (&'static str, &'static str) {
        match self {
            Held::Job => ("job_devices", "job_id"),
            Held::ImpairmentEvent => ("impairment_event_devices", "event_id"),
        }
    }
}

/// The storm guard holds the work until an operator confirms it.
async fn hold(tx: &mut Tx<'_>, held: Held, id: &str) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE {} SET awaiting_confirmation = true WHERE id = $1",
        held.table()
    ))
    .bind(id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The work `id` locked for a confirmation: `(column, awaiting_confirmation,
/// confirmed)`, `column` being what the caller decides on besides.
pub(crate) async fn lock_for_confirm<T>(
    tx: &mut Tx<'_>,
    held: Held,
    column: &'static str,
    id: &str,
) -> Result<Option<(T, bool, bool)>, sqlx::Error>
where
    T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres> + Send + Unpin,
{
    sqlx::query_as(&format!(
        "SELECT {column}, awaiting_confirmation, confirmed_at IS NOT NULL FROM {} \
         WHERE id = $1 FOR UPDATE",
        held.table()
    ))
    .bind(id)
    .fetch_optional(&mut **tx)
    .await
}

/// An operator's confirmation of held work: what its devices take out of
/// service goes in the ledger, and the confirmation is recorded with who
/// and why. Returns the devices, whose work the caller queues.
pub(crate) async fn admit_confirmed(
    tx: &mut Tx<'_>,
    held: Held,
    id: &str,
    by: &str,
    reason: &str,
) -> Result<Vec<String>, sqlx::Error> {
    let (devices, of) = held.devices();
    let ids: Vec<String> = sqlx::query_scalar(&format!(
        "SELECT device_id FROM {devices} WHERE {of} = $1 ORDER BY device_id"
    ))
    .bind(id)
    .fetch_all(&mut **tx)
    .await?;
    let candidates = candidates(tx, &ids).await?;
    admit(tx, held, id, &candidates).await?;
    sqlx::query(&format!(
        "UPDATE {} SET awaiting_confirmation = false, confirmed_by = $2, confirmed_at = now(), \
         confirm_reason = $3, updated_at = now() WHERE id = $1",
        held.table()
    ))
    .bind(id)
    .bind(by)
    .bind(reason)
    .execute(&mut **tx)
    .await?;
    Ok(ids)
}
