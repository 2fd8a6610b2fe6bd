-- The storm guard (issue 16): a job, or an impairment cordon, that would
-- take more than a configured share of a site's or pool's in-service
-- devices out of service within a window waits, before its first external
-- write, for an operator's confirmation. Owned by the workflow service.

-- A job or event that tripped the guard waits (no JOBS work is queued for
-- it until it is confirmed); its confirmation is recorded here.
ALTER TABLE jobs
    ADD COLUMN awaiting_confirmation boolean NOT NULL DEFAULT false,
    ADD COLUMN confirmed_by   text,
    ADD COLUMN confirmed_at   timestamptz,
    ADD COLUMN confirm_reason text;
ALTER TABLE impairment_events
    ADD COLUMN awaiting_confirmation boolean NOT NULL DEFAULT false,
    ADD COLUMN confirmed_by   text,
    ADD COLUMN confirmed_at   timestamptz,
    ADD COLUMN confirm_reason text;

-- Why a job or an event waits: one row per scope it tripped, with the
-- counts the guard saw.
CREATE TABLE storm_trips (
    kind         text NOT NULL CHECK (kind IN ('job', 'impairment')),
    id           text NOT NULL,
    scope_kind   text NOT NULL CHECK (scope_kind IN ('site', 'pool')),
    scope_id     text NOT NULL,
    in_service   integer NOT NULL,
    taking       integer NOT NULL,
    in_window    integer NOT NULL,
    device_limit integer NOT NULL,
    tripped_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, id, scope_kind, scope_id)
);

-- The devices admitted work took out of service, by scope: the guard's
-- window counts these, and only these (no status change, outage or STATUS
-- event adds to it).
CREATE TABLE storm_ledger (
    scope_kind text NOT NULL CHECK (scope_kind IN ('site', 'pool')),
    scope_id   text NOT NULL,
    device_id  text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('job', 'impairment')),
    id         text NOT NULL,
    taken_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, id, device_id, scope_kind)
);
CREATE INDEX storm_ledger_window ON storm_ledger (scope_kind, scope_id, taken_at);

GRANT SELECT ON storm_trips, storm_ledger TO fleet_hub, fleet_api, fleet_placer, fleet_gateway, fleet_radar;
GRANT INSERT, UPDATE, DELETE ON storm_trips, storm_ledger TO fleet_workflow;
