-- The workflow service (spec/consumers.md, "workflow"; seed 002, "Job
-- status", "Job device status", "Failure codes"): jobs and each device's
-- run, owned by the workflow service's role. Work is dispatched through the
-- JOBS stream from workflow_outbox, written in the same transaction as the
-- job (a crash between commit and publish re-publishes; the stream's
-- duplicate window drops the copy).

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'fleet_workflow') THEN
        BEGIN
            CREATE ROLE fleet_workflow NOLOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
END $$;

CREATE TABLE jobs (
    id               text PRIMARY KEY,
    workflow         text NOT NULL,
    status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'succeeded',
        'partially_failed', 'failed', 'cancelled')),
    created_by       text NOT NULL,
    cordon_only      boolean NOT NULL DEFAULT false,
    cancel_requested boolean NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz
);
CREATE INDEX jobs_created ON jobs (id DESC);
CREATE INDEX jobs_status ON jobs (status, id DESC);

-- One row per device, created at submit; status stays NULL until the device
-- starts (seed 002: "there is no pending value").
CREATE TABLE job_devices (
    job_id          text NOT NULL REFERENCES jobs(id),
    device_id       text NOT NULL REFERENCES devices(id),
    status          text CHECK (status IN ('running', 'succeeded', 'failed', 'cancelled', 'terminated',
        'superseded')),
    -- The last step completed; a worker that dies resumes after it.
    step            text NOT NULL DEFAULT '',
    -- Attempts of the current step after transient failures.
    attempts        integer NOT NULL DEFAULT 0,
    -- What the run pinned on the way (the instance_uuid it minted), so a
    -- resumed run binds the same identity instead of a new one.
    pinned          jsonb NOT NULL DEFAULT '{}'::jsonb,
    failure_code    text,
    failure_message text,
    started_at      timestamptz,
    finished_at     timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, device_id)
);
CREATE INDEX job_devices_device ON job_devices (device_id);
CREATE INDEX job_devices_open ON job_devices (job_id) WHERE status IS NULL OR status = 'running';

CREATE TABLE workflow_outbox (
    id          bigserial PRIMARY KEY,
    subject     text NOT NULL,
    schema      text NOT NULL,
    payload     bytea NOT NULL,
    traceparent text,
    created_at  timestamptz NOT NULL DEFAULT now()
);

GRANT SELECT ON ALL TABLES IN SCHEMA public TO fleet_workflow;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO fleet_workflow;
REVOKE SELECT ON api_tokens, join_tokens, agent_credentials FROM fleet_workflow;
GRANT SELECT ON jobs, job_devices, workflow_outbox
    TO fleet_hub, fleet_api, fleet_placer, fleet_gateway, fleet_radar;
-- Only the workflow service writes its jobs.
GRANT INSERT, UPDATE ON jobs, job_devices TO fleet_workflow;
GRANT INSERT, UPDATE, DELETE ON workflow_outbox TO fleet_workflow;
GRANT USAGE ON SEQUENCE workflow_outbox_id_seq TO fleet_workflow;
