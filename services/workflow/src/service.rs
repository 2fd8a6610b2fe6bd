//! The workflow service as a service: requests over core NATS
//! request/reply (`<root>.workflow.cmd.<verb>`: create_job, get_job,
//! list_jobs, cancel_job, create_impairment, clear_impairment) through the mesh's one responder, the JOBS
//! worker, the outbox relay, and `/healthz` `/readyz` `/metrics`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fleet_bus::{Limits, Refusal, Responder};
use fleet_domain::eligibility::{self, DeviceFacts, Options, Workflow as Kind};
use fleet_domain::release::{self, EngagementMode};
use fleet_domain::{ConditionStatus, ConditionType, OperationalStatus};
use fleet_proto::{v1, ErrorCode, Message};
use fleet_runtime::{Common, Shutdown};
use fleet_store::Shell;

use crate::Config;

use crate::storm::{self, Held};
use crate::{store, Workflow, OUTBOX};

/// The workflows this build runs. Every other workflow of seed 002 is
/// refused at creation, by name, instead of being accepted and never run.
pub(crate) const RUNS: &[Kind] = &[
    Kind::ImageNode,
    Kind::UnimageNode,
    Kind::Enrollment,
    Kind::Release,
    Kind::MoveToTestCluster,
    Kind::FrontendVrfIsolate,
    Kind::FrontendVrfReturn,
    Kind::BackendVrfIsolate,
    Kind::BackendVrfReturn,
    Kind::NvlinkRepairMove,
    Kind::NvlinkRepairReturn,
    Kind::SingleNodeTest,
    Kind::MultiNodeTest,
];

pub(crate) fn db(e: sqlx::Error) -> Refusal {
    Refusal::unavailable("the workflow service's database is unavailable", e)
}

pub(crate) fn decode<M: Message + Default>(payload: &[u8], what: &str) -> Result<M, Refusal> {
    M::decode(payload).map_err(|e| Refusal::invalid(format!("undecodable {what}: {e}")))
}

/// A confirmation's job or event id, who confirms, and why (all required).
pub(crate) fn confirmation(r: &v1::ConfirmRequest) -> Result<(&str, &str, &str), Refusal> {
    let (id, by, reason) = (r.id.trim(), r.confirmed_by.trim(), r.reason.trim());
    if id.is_empty() || by.is_empty() {
        return Err(Refusal::invalid("id and confirmed_by are required"));
    }
    if reason.is_empty() {
        return Err(Refusal::invalid(
            "a confirmation needs a reason: why taking these devices out of service is right",
        ));
    }
    if reason.chars().count() > 1024 {
        return Err(Refusal::invalid("reason is longer than 1024 characters"));
    }
    Ok((id, by, reason))
}

/// Refuses (`NOT_FOUND`, naming them) the ids of `ids` not `found`.
pub(crate) fn all_found(ids: &[String], found: impl Fn(&str) -> bool) -> Result<(), Refusal> {
    let missing: Vec<&str> = ids
        .iter()
        .map(String::as_str)
        .filter(|i| !found(i))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Refusal::new(
        ErrorCode::NotFound,
        format!(
            "{} device(s) not found: {}",
            missing.len(),
            missing.join(", ")
        ),
    ))
}

/// The request's options.
fn options_of(r: &v1::CreateJobRequest) -> Result<Options, Refusal> {
    let mode = r.engagement_mode.trim();
    let engagement_mode = (!mode.is_empty())
        .then(|| EngagementMode::parse(mode))
        .transpose()
        .map_err(|e| Refusal::invalid(e.to_string()))?;
    Ok(Options {
        cordon_only: r.cordon_only,
        force_reclaim: r.force_reclaim,
        release_to_customer_pool: r.release_to_customer_pool,
        simulate: r.simulate,
        run_inspection: r.run_inspection,
        engagement_mode,
    })
}

/// Each device with its parameters. A parameter for a device the job does
/// not name, or one the workflow does not take, is refused; the front-end
/// VRF return needs the customer VRF of every device.
fn params_of(
    kind: Kind,
    ids: &[String],
    given: &HashMap<String, v1::DeviceParams>,
) -> Result<Vec<(String, store::Params)>, Refusal> {
    if let Some(stray) = given.keys().find(|d| !ids.iter().any(|i| i == d.trim())) {
        return Err(Refusal::invalid(format!(
            "params names device {stray}, which the job does not"
        )));
    }
    let return_flip = kind == Kind::FrontendVrfReturn;
    ids.iter()
        .map(|id| {
            let p = given
                .iter()
                .find(|(d, _)| d.trim() == id)
                .map(|(_, p)| p.clone())
                .unwrap_or_default();
            let customer_vrf = p.customer_vrf.trim().to_string();
            if !return_flip && !customer_vrf.is_empty() {
                return Err(Refusal::invalid(format!(
                    "{kind} does not take a customer_vrf (device {id})"
                )));
            }
            if return_flip {
                fleet_domain::inventory::check_id(
                    &format!("params.{id}.customer_vrf"),
                    &customer_vrf,
                )
                .map_err(|e| {
                    Refusal::invalid(format!("{kind} needs each device's customer VRF: {e}"))
                })?;
            }
            Ok((id.clone(), store::Params { customer_vrf }))
        })
        .collect()
}

/// A refused job: the reply carries every refusal, device by device.
struct Ineligible(Vec<v1::DeviceRefusal>);

impl Workflow {
    async fn request(
        &self,
        verb: &str,
        payload: &[u8],
    ) -> Result<Result<v1::workflow_reply::Result, Ineligible>, Refusal> {
        use v1::workflow_reply::Result as R;
        Ok(Ok(match verb {
            "create_job" => {
                let r = decode::<v1::CreateJobRequest>(payload, "CreateJobRequest")?;
                match self.create_job(r).await? {
                    Ok(job) => R::Job(job),
                    Err(refused) => return Ok(Err(refused)),
                }
            }
            "get_job" => {
                let r = decode::<v1::GetJobRequest>(payload, "GetJobRequest")?;
                R::Job(self.job(&r.job_id).await?)
            }
            "cancel_job" => {
                let r = decode::<v1::CancelJobRequest>(payload, "CancelJobRequest")?;
                if !store::cancel(&self.deps.pool, &r.job_id)
                    .await
                    .map_err(db)?
                {
                    return Err(Refusal::new(
                        ErrorCode::NotFound,
                        format!("job {} not found", r.job_id),
                    ));
                }
                tracing::info!(job_id = %r.job_id, requested_by = %r.requested_by, "job cancel requested");
                R::Job(self.job(&r.job_id).await?)
            }
            "confirm_job" => {
                let r = decode::<v1::ConfirmRequest>(payload, "ConfirmRequest")?;
                R::Job(self.confirm_job(r).await?)
            }
            "list_jobs" => {
                let r = decode::<v1::ListJobsRequest>(payload, "ListJobsRequest")?;
                R::Page(self.list(r).await?)
            }
            "create_impairment" | "clear_impairment" | "confirm_impairment" => {
                R::Impairment(self.impairment_request(verb, payload).await?)
            }
            other => return Err(Refusal::invalid(format!("unknown workflow verb {other:?}"))),
        }))
    }

    async fn job(&self, id: &str) -> Result<v1::Job, Refusal> {
        let mut c = self.deps.pool.acquire().await.map_err(db)?;
        job_on(&mut c, id).await
    }

    async fn list(&self, r: v1::ListJobsRequest) -> Result<v1::JobPage, Refusal> {
        let status = (!r.status.is_empty()).then_some(r.status.as_str());
        if let Some(s) = status {
            fleet_domain::jobs::JobStatus::parse(s).map_err(|e| Refusal::invalid(e.to_string()))?;
        }
        let workflow = (!r.workflow.is_empty()).then_some(r.workflow.as_str());
        if let Some(w) = workflow {
            Kind::parse(w).map_err(|e| Refusal::invalid(e.to_string()))?;
        }
        let limit = r.limit.clamp(1, 1000) as i64;
        let after = (!r.after.is_empty()).then_some(r.after.as_str());
        let device = (!r.device_id.is_empty()).then_some(r.device_id.as_str());
        let mut rows = store::list(&self.deps.pool, status, workflow, after, device, limit + 1)
            .await
            .map_err(db)?;
        let next_after = if rows.len() as i64 > limit {
            rows.truncate(limit as usize);
            rows.last().map(|j| j.id.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(v1::JobPage {
            jobs: rows.iter().map(|j| j.to_proto(&[])).collect(),
            next_after,
        })
    }

    /// One eligibility pass over every device; any refusal refuses the job
    /// and writes nothing. Otherwise the job, its devices and one JOBS
    /// message per device are written in one transaction.
    async fn create_job(
        &self,
        r: v1::CreateJobRequest,
    ) -> Result<Result<v1::Job, Ineligible>, Refusal> {
        let kind = Kind::parse(r.workflow.trim()).map_err(|e| Refusal::invalid(e.to_string()))?;
        if !RUNS.contains(&kind) {
            return Err(Refusal::invalid(format!(
                "workflow {kind} is not run by this build of the workflow service (it runs {})",
                RUNS.iter()
                    .map(|k| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let ids = self.device_ids(&r.device_ids)?;
        if r.created_by.trim().is_empty() {
            return Err(Refusal::invalid("created_by is required"));
        }
        let options = options_of(&r)?;
        options.check(kind).map_err(Refusal::invalid)?;
        if kind == Kind::Release {
            release::path(options.release_to_customer_pool, options.engagement_mode)
                .map_err(Refusal::invalid)?;
        }
        let params = params_of(kind, &ids, &r.params)?;
        let devices = store::devices(&self.deps.pool, &ids).await.map_err(db)?;
        all_found(&ids, |i| devices.iter().any(|d| d.id == i))?;
        let refusals = self.eligibility(kind, &r, &devices).await?;
        if !refusals.is_empty() {
            return Ok(Err(Ineligible(refusals)));
        }

        let job_id = format!("job_{}", ulid::Ulid::new());
        let mut tx = self.deps.pool.begin().await.map_err(db)?;
        let busy = store::busy(&mut tx, &ids).await.map_err(db)?;
        if !busy.is_empty() {
            return Ok(Err(Ineligible(
                busy.into_iter()
                    .map(|(device_id, job)| v1::DeviceRefusal {
                        device_id,
                        refusal: "concurrent_workflow_running".into(),
                        detail: job,
                    })
                    .collect(),
            )));
        }
        store::insert_job(
            &mut tx,
            &job_id,
            kind.as_str(),
            r.created_by.trim(),
            &options,
            &params,
        )
        .await
        .map_err(db)?;
        let held = match self.config.storm_guard.policy() {
            Some(policy) if kind.takes_out_of_service() => {
                let trips = storm::guard(&mut tx, &policy, Held::Job, &job_id, &ids)
                    .await
                    .map_err(db)?;
                !trips.is_empty()
            }
            _ => false,
        };
        if !held {
            self.queue(&mut tx, kind.as_str(), &job_id, &ids).await?;
        }
        // The job as created: read before the commit, so no worker has
        // started a device of it yet (seed 002: "the status is empty until
        // Temporal starts that device").
        let job = job_on(&mut tx, &job_id).await?;
        self.commit(tx).await?;
        if held {
            tracing::warn!(job_id = %job_id, workflow = %kind, devices = ids.len(), created_by = %r.created_by, "job held by the storm guard: waiting for an operator's confirmation");
        } else {
            tracing::info!(job_id = %job_id, workflow = %kind, devices = ids.len(), created_by = %r.created_by, "job created");
        }
        Ok(Ok(job))
    }

    /// One JOBS message per device of job (or impairment event) `job_id`,
    /// whose `workflow` token is given, in the caller's transaction.
    pub(crate) async fn queue(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        workflow: &str,
        job_id: &str,
        ids: &[String],
    ) -> Result<(), Refusal> {
        let rows = ids
            .iter()
            .map(|d| fleet_outbox::Row {
                subject: self.deps.subjects.job(workflow, job_id, d),
                schema: fleet_proto::schema::<v1::JobDeviceWork>(),
                payload: v1::JobDeviceWork {
                    job_id: job_id.to_string(),
                    device_id: d.clone(),
                    workflow: workflow.into(),
                }
                .encode_to_vec(),
                traceparent: None,
            })
            .collect();
        OUTBOX.insert(tx, rows).await.map(|_| ()).map_err(db)
    }

    /// Commits `tx` and wakes the relay for the work it queued.
    pub(crate) async fn commit(
        &self,
        tx: sqlx::Transaction<'_, sqlx::Postgres>,
    ) -> Result<(), Refusal> {
        tx.commit().await.map_err(db)?;
        self.wake_relay();
        Ok(())
    }

    /// An operator confirms a job the storm guard holds: its devices go in
    /// the ledger and its work is queued. Confirming twice answers the same
    /// job; a cancelled job, or one the guard never held, is refused.
    async fn confirm_job(&self, r: v1::ConfirmRequest) -> Result<v1::Job, Refusal> {
        let (id, by, reason) = confirmation(&r)?;
        let (mut tx, (cancelled, awaiting, confirmed)) = self
            .lock_for_confirm::<bool>(Held::Job, "cancel_requested", id)
            .await?;
        if confirmed {
            drop(tx);
            return self.job(id).await;
        }
        if cancelled {
            return Err(Refusal::new(
                ErrorCode::InvalidState,
                format!("job {id} was cancelled; there is nothing to confirm"),
            ));
        }
        if !awaiting {
            return Err(Refusal::new(
                ErrorCode::InvalidState,
                format!("job {id} is not held by the storm guard"),
            ));
        }
        let job = store::job(&self.deps.pool, id)
            .await
            .map_err(db)?
            .ok_or_else(|| Refusal::new(ErrorCode::NotFound, format!("job {id} not found")))?;
        let kind = Kind::parse(&job.workflow)
            .map_err(|e| Refusal::unavailable("a job has an unknown workflow", e))?;
        let ids = storm::admit_confirmed(&mut tx, Held::Job, id, by, reason)
            .await
            .map_err(db)?;
        self.queue(&mut tx, kind.as_str(), id, &ids).await?;
        self.commit(tx).await?;
        tracing::warn!(job_id = %id, confirmed_by = %by, reason = %reason, devices = ids.len(), "storm guard: job confirmed by an operator");
        self.job(id).await
    }

    /// The held work `id` locked for a confirmation in a new transaction
    /// (`storm::lock_for_confirm`); `NOT_FOUND` when there is none.
    pub(crate) async fn lock_for_confirm<T>(
        &self,
        held: Held,
        column: &'static str,
        id: &str,
    ) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, (T, bool, bool)), Refusal>
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
    {
        let mut tx = self.deps.pool.begin().await.map_err(db)?;
        let locked = storm::lock_for_confirm(&mut tx, held, column, id)
            .await
            .map_err(db)?
            .ok_or_else(|| {
                Refusal::new(
                    ErrorCode::NotFound,
                    format!("{} {id} not found", held.noun()),
                )
            })?;
        Ok((tx, locked))
    }

    /// The request's device ids, trimmed, de-duplicated and sorted: 1 to
    /// `workflow.max_devices_per_job` of them, none empty.
    pub(crate) fn device_ids(&self, raw: &[String]) -> Result<Vec<String>, Refusal> {
        let ids: BTreeSet<String> = raw.iter().map(|d| d.trim().to_string()).collect();
        let max = self.config.max_devices_per_job.max(1);
        if ids.is_empty() || ids.len() > max || ids.contains("") {
            return Err(Refusal::invalid(format!(
                "device_ids must name 1 to {max} devices, none empty"
            )));
        }
        Ok(ids.into_iter().collect())
    }

    async fn eligibility(
        &self,
        kind: Kind,
        r: &v1::CreateJobRequest,
        devices: &[store::DeviceRow],
    ) -> Result<Vec<v1::DeviceRefusal>, Refusal> {
        let options = options_of(r)?;
        let policy = kind.policy_with(options);
        let types: Vec<String> = policy
            .disqualifying_condition_types
            .iter()
            .chain(policy.required_condition_types.iter())
            .map(|t| t.as_str().to_string())
            .collect();
        let ids: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
        let mut conditions: HashMap<(String, String), ConditionStatus> = HashMap::new();
        for (d, t, s) in store::conditions(&self.deps.pool, &ids, &types)
            .await
            .map_err(db)?
        {
            if let Ok(s) = ConditionStatus::parse(&s) {
                conditions.insert((d, t), s);
            }
        }
        let mut out = vec![];
        for d in devices {
            let facts = DeviceFacts {
                inventory_only: d.inventory_only,
                operational_status: OperationalStatus::parse(&d.operational_status)
                    .unwrap_or(OperationalStatus::Unknown),
                infrastructure_ref: d.infrastructure_ref.as_deref(),
                enrollment_validated_ref: d.enrollment_validated_ref.as_deref(),
                ironic_maintenance: d.ironic_maintenance,
                ironic_provision_state: d.ironic_provision_state.as_deref(),
            };
            let refused = eligibility::check(kind, options, &facts, |t: ConditionType| {
                conditions
                    .get(&(d.id.clone(), t.as_str().to_string()))
                    .copied()
            });
            out.extend(refused.into_iter().map(|x| v1::DeviceRefusal {
                device_id: d.id.clone(),
                refusal: x.refusal.as_str().into(),
                detail: x.detail,
            }));
            if d.inventory_only {
                continue;
            }
            // The fabric workflows need the site's switches (or NMX-M) in
            // this service's configuration.
            if let Some(missing) = self.fabric_missing(kind, &d.site_id) {
                out.push(v1::DeviceRefusal {
                    device_id: d.id.clone(),
                    refusal: eligibility::Refusal::BackendNotRun.as_str().into(),
                    detail: format!("workflow.sites.{}.fabric has no {missing}", d.site_id),
                });
            }
            // "The backend is chosen from the site's current capability": a
            // site with Nova and Placement runs the Nova arm, which needs
            // its SLURM credential.
            if d.placement_enabled && kind.has_nova_arm() {
                let nova = self.sites.get(&d.site_id).is_some_and(|s| s.has_nova());
                let detail = match kind {
                    // `cordon_only` images nothing.
                    Kind::MoveToTestCluster if options.cordon_only => None,
                    _ if !nova => Some(format!(
                        "site {} has Nova and Placement (placement_enabled) and workflow.sites.{}.nova is not configured: {kind} runs its Nova arm there",
                        d.site_id, d.site_id
                    )),
                    _ => None,
                };
                if let Some(detail) = detail {
                    out.push(v1::DeviceRefusal {
                        device_id: d.id.clone(),
                        refusal: eligibility::Refusal::BackendNotRun.as_str().into(),
                        detail,
                    });
                }
            }
        }
        Ok(out)
    }

    /// What a fabric workflow needs of the site's configuration and it
    /// lacks (`None`: nothing, or not a fabric workflow).
    fn fabric_missing(&self, kind: Kind, site: &str) -> Option<&'static str> {
        use fleet_domain::fabric_flip::Plane;
        let need = match kind {
            Kind::NvlinkRepairMove | Kind::NvlinkRepairReturn => None,
            k => Some(crate::flows::vrf_flip::flip_of(k)?.0),
        };
        let fabric = self.sites.get(site).and_then(|s| {
            s.fabric.as_ref().map(|f| match need {
                None => f.nmx.is_some(),
                Some(plane) => f.netbox.is_some() && !f.switches(plane).is_empty(),
            })
        });
        match (fabric, need) {
            (Some(true), _) => None,
            (_, None) => Some("nmx_url"),
            (_, Some(Plane::Frontend)) => Some("frontend_switches"),
            (_, Some(Plane::Backend)) => Some("backend_switches"),
        }
    }

    /// Publishes device work to JOBS until shutdown (`fleet_outbox`'s loop).
    async fn relay_loop(self: Arc<Self>, shutdown: Shutdown) {
        OUTBOX
            .relay_loop(
                &self.deps.pool,
                &self.deps.js,
                &self.relay_wake,
                shutdown,
                |_| {},
            )
            .await
    }
}

impl Responder for Workflow {
    const SERVICE: &'static str = "workflow";

    async fn respond(
        self: Arc<Self>,
        _route: &'static str,
        subject: String,
        payload: Bytes,
    ) -> Result<Bytes, Refusal> {
        let verb = fleet_bus::subjects::command_verb(&subject);
        let reply = match self.request(verb, &payload).await? {
            Ok(r) => v1::WorkflowReply {
                error: None,
                result: Some(r),
            },
            Err(Ineligible(refusals)) => v1::WorkflowReply {
                error: Some(v1::WorkflowError {
                    code: ErrorCode::Ineligible as i32,
                    message: format!(
                        "{} eligibility refusal(s); nothing was created",
                        refusals.len()
                    ),
                    refusals,
                }),
                result: None,
            },
        };
        Ok(reply.encode_to_vec().into())
    }

    fn refused(&self, _route: &'static str, code: ErrorCode, message: &str) -> Bytes {
        v1::WorkflowReply {
            error: Some(v1::WorkflowError {
                code: code as i32,
                message: message.to_string(),
                refusals: vec![],
            }),
            result: None,
        }
        .encode_to_vec()
        .into()
    }
}

/// Runs the workflow service until shutdown.
pub async fn run(common: Common, config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let w = Workflow::connect(common, config).await?;
    run_with(w, shutdown).await
}

pub async fn run_with(w: Arc<Workflow>, shutdown: Shutdown) -> anyhow::Result<()> {
    let (mut shell, addr) = Shell::start(
        "workflow",
        &w.config.listen,
        w.metrics.registry.clone(),
        &w.deps,
        &shutdown,
    )
    .await?;
    tracing::info!(%addr, "workflow service running");
    shell.respond_commands(
        w.clone(),
        w.deps.subjects.workflow_cmd_all(),
        Limits {
            concurrency: w.config.concurrency.max(1),
            deadline: Duration::from_secs(30),
        },
    );
    shell.spawn(w.clone().work_loop(shutdown.clone()));
    shell.spawn(w.clone().status_loop(shutdown.clone()));
    let wake = w.clone();
    shell.relay(w.clone().relay_loop(shutdown.clone()), move || {
        wake.wake_relay()
    });
    shell.run(w.common.shutdown.grace).await
}

/// Job `id` with its devices' runs (and its storm-guard trips, when held),
/// as `c` sees them.
async fn job_on(c: &mut sqlx::PgConnection, id: &str) -> Result<v1::Job, Refusal> {
    let job = store::job(&mut *c, id)
        .await
        .map_err(db)?
        .ok_or_else(|| Refusal::new(ErrorCode::NotFound, format!("job {id} not found")))?;
    let runs = store::runs(&mut *c, id).await.map_err(db)?;
    let mut out = job.to_proto(&runs);
    if out.storm_guard.is_some() {
        let trips = storm::trips(&mut *c, Held::Job, id).await.map_err(db)?;
        out.storm_guard = job.storm_guard(trips.iter().map(storm::TripRow::to_proto).collect());
    }
    Ok(out)
}
