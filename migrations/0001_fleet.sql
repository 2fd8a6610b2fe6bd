-- The fleet schema: devices with every axis of spec/device.md, conditions,
-- per-source freshness, the lifecycle log, the outbox and unresolved
-- observations. Vocabulary columns are text checked against the spec's
-- closed sets, so a bad value can never be stored.

CREATE TABLE sites (
    id               text PRIMARY KEY,
    name             text NOT NULL,
    inventory_only   boolean NOT NULL DEFAULT false,
    placement_enabled boolean NOT NULL DEFAULT true,
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE tenants (
    id          text PRIMARY KEY,
    name        text NOT NULL,
    annotations jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE pools (
    id              text PRIMARY KEY,
    site_id         text NOT NULL REFERENCES sites(id),
    kind            text NOT NULL CHECK (kind IN ('metal-host', 'vps-host', 'provider', 'metal-dedicated', 'custom')),
    owner_tenant_id text REFERENCES tenants(id),
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE devices (
    id                  text PRIMARY KEY,
    name                text NOT NULL,
    site_id             text NOT NULL REFERENCES sites(id),
    pool_id             text REFERENCES pools(id),
    owner_tenant_id     text REFERENCES tenants(id),
    rack                text,
    serial              text,
    netbox_id           bigint,
    bmc_address         text,
    infrastructure_ref  text,
    device_class        text NOT NULL DEFAULT 'gpu_compute'
        CHECK (device_class IN ('gpu_compute', 'cpu_baremetal', 'cpu_hypervisor', 'switch')),
    role                text NOT NULL DEFAULT 'unassigned' CHECK (role IN ('host', 'dedicated', 'site', 'unassigned')),
    trust               text NOT NULL DEFAULT 'platform' CHECK (trust IN ('platform', 'tenant-owned', 'tenant-controlled')),
    adapter             text NOT NULL DEFAULT 'bcd/v1' CHECK (adapter IN ('bcd/v1', 'provider-api/v1')),
    drivers             jsonb NOT NULL DEFAULT '{}'::jsonb,
    hardware_key        text,
    hardware_key_trusted boolean NOT NULL DEFAULT false,
    generation          bigint NOT NULL DEFAULT 0,
    observed_generation bigint NOT NULL DEFAULT 0,
    identity_generation bigint NOT NULL DEFAULT 1,
    version             bigint NOT NULL DEFAULT 1,
    labels              jsonb NOT NULL DEFAULT '{}'::jsonb,
    annotations         jsonb NOT NULL DEFAULT '{}'::jsonb,

    provision_state     text NOT NULL DEFAULT 'adopting' CHECK (provision_state IN ('adopting', 'adopted',
        'enrolling', 'inspecting', 'commissioning', 'ready', 'deploying', 'deployed', 'releasing', 'rescue',
        'failed', 'retiring', 'retired')),
    failed_from         text,
    maintenance         boolean NOT NULL DEFAULT false,
    maintenance_reason  text,
    cordoned            boolean NOT NULL DEFAULT false,
    cordon_reason       text,
    draining            boolean NOT NULL DEFAULT false,
    power               text NOT NULL DEFAULT 'unknown' CHECK (power IN ('on', 'off', 'unknown')),
    connectivity        text NOT NULL DEFAULT 'disconnected'
        CHECK (connectivity IN ('connected', 'disconnected', 'unreachable', 'lost')),
    inventory_status    text NOT NULL DEFAULT 'unknown' CHECK (inventory_status IN ('planned', 'staged', 'active',
        'offline', 'failed', 'inventory', 'decommissioning', 'rma', 'unknown')),
    operational_status  text NOT NULL DEFAULT 'unknown' CHECK (operational_status IN ('unknown', 'available',
        'in_use', 'validation', 'quarantine', 'failed', 'delegated', 'pending_handover', 'drained')),
    health_status       text NOT NULL DEFAULT 'unknown' CHECK (health_status IN ('unknown', 'healthy', 'degraded', 'critical')),
    capacity_bucket     text NOT NULL DEFAULT 'excluded' CHECK (capacity_bucket IN ('schedulable', 'excluded',
        'maintenance', 'provisioning', 'unreachable', 'unhealthy')),
    in_triage           boolean NOT NULL DEFAULT false,
    triage_ticket_url   text,
    parent_ticket_url   text,
    entered_triage_at   timestamptz,
    inventory_only      boolean NOT NULL DEFAULT false,
    custody             text,
    custody_credential_ref text,
    impairment_hold     text,
    taints              text[] NOT NULL DEFAULT '{}',
    no_schedule_reasons text[] NOT NULL DEFAULT '{}',
    enrollment_validated_ref text,
    enrollment_proof_source  text,
    enrollment_proof_at      timestamptz,
    entered_service_at  timestamptz,
    failure_state       text,
    failed_at           timestamptz,

    -- raw mirrors, stored as reported
    ironic_provision_state    text,
    ironic_maintenance        boolean,
    ironic_maintenance_reason text,
    ironic_instance_uuid      text,
    ironic_lessee             text,
    slurm_states              text[] NOT NULL DEFAULT '{}',
    netbox_tags               text[] NOT NULL DEFAULT '{}',
    chassis_health            text CHECK (chassis_health IN ('Ok', 'Warning', 'Critical')),

    -- the current node agent session
    session_epoch           bigint NOT NULL DEFAULT 0,
    session_gateway_id      text,
    session_connected_at    timestamptz,
    session_disconnected_at timestamptz,
    session_last_seen       timestamptz,

    -- when derivation last ran: the sweeper re-derives devices whose
    -- freshness deadline passed since
    derived_at  timestamptz NOT NULL DEFAULT now(),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz
);

CREATE UNIQUE INDEX devices_site_name ON devices (site_id, name) WHERE deleted_at IS NULL;
CREATE UNIQUE INDEX devices_netbox_id ON devices (site_id, netbox_id) WHERE netbox_id IS NOT NULL AND deleted_at IS NULL;
CREATE INDEX devices_serial ON devices (serial) WHERE serial IS NOT NULL;
CREATE INDEX devices_infrastructure_ref ON devices (infrastructure_ref) WHERE infrastructure_ref IS NOT NULL;
CREATE INDEX devices_bmc_address ON devices (bmc_address) WHERE bmc_address IS NOT NULL;
CREATE UNIQUE INDEX devices_hardware_key ON devices (hardware_key) WHERE hardware_key_trusted AND deleted_at IS NULL;
CREATE INDEX devices_pool ON devices (pool_id);
CREATE INDEX devices_operational ON devices (site_id, operational_status);
CREATE INDEX devices_session_last_seen ON devices (session_last_seen) WHERE connectivity IN ('connected', 'unreachable');

CREATE TABLE device_conditions (
    device_id          text NOT NULL REFERENCES devices(id),
    type               text NOT NULL,
    status             text NOT NULL CHECK (status IN ('True', 'False', 'Unknown')),
    reason             text NOT NULL DEFAULT '',
    message            text NOT NULL DEFAULT '',
    source             text NOT NULL,
    condition_of       text NOT NULL CHECK (condition_of IN ('operational', 'health', 'none')),
    durable            boolean NOT NULL,
    observed_at        timestamptz NOT NULL,
    received_at        timestamptz NOT NULL,
    decisive           boolean NOT NULL DEFAULT false,
    last_transition_at timestamptz NOT NULL,
    PRIMARY KEY (device_id, type)
);
CREATE INDEX device_conditions_decisive ON device_conditions (device_id) WHERE decisive;

-- The last snapshot applied per (device, source): a freshness-only resync
-- writes this one row.
CREATE TABLE device_source_freshness (
    device_id   text NOT NULL REFERENCES devices(id),
    source      text NOT NULL,
    observed_at timestamptz NOT NULL,
    digest      bytea NOT NULL,
    received_at timestamptz NOT NULL,
    PRIMARY KEY (device_id, source)
);
CREATE INDEX device_source_freshness_observed ON device_source_freshness (source, observed_at);

-- Append-only: never updated or deleted by application code.
CREATE TABLE device_lifecycle_events (
    id         bigserial PRIMARY KEY,
    device_id  text NOT NULL REFERENCES devices(id),
    kind       text NOT NULL,
    value      text NOT NULL,
    cause      text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX device_lifecycle_events_device ON device_lifecycle_events (device_id, kind, created_at, id);

-- Transactional outbox: written with the change, published by the relay
-- with Nats-Msg-Id = outbox-<id>, deleted after the PubAck.
CREATE TABLE outbox (
    id         bigserial PRIMARY KEY,
    subject    text NOT NULL,
    schema     text NOT NULL,
    payload    bytea NOT NULL,
    traceparent text,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE unresolved_observations (
    source      text NOT NULL,
    site        text NOT NULL,
    key_kind    text NOT NULL,
    key         text NOT NULL,
    observed_at timestamptz NOT NULL,
    received_at timestamptz NOT NULL,
    seen_count  bigint NOT NULL DEFAULT 1,
    payload     bytea NOT NULL,
    PRIMARY KEY (source, site, key_kind, key)
);

-- Operator API tokens (stored hashed) live with the API; the hub does not
-- read them.
CREATE TABLE api_tokens (
    id          text PRIMARY KEY,
    token_sha256 text NOT NULL UNIQUE,
    scopes      text[] NOT NULL,
    description text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
