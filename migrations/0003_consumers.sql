-- The status consumers' own tables (spec/consumers.md): GPU inventory and
-- pool hardware profiles, the placer's allocations and its event outbox,
-- and the gateway's join tokens, agent credentials and sessions. Device
-- status stays the hub's: these services never write a status column.

-- GPUs the node agent last reported (written by the hub's join command);
-- NULL when no agent reported: the placer then uses the pool's profile.
ALTER TABLE devices ADD COLUMN gpu_count integer
    CHECK (gpu_count IS NULL OR gpu_count BETWEEN 0 AND 256);

-- What an accepted machine of a pool has: acceptance compares the agent's
-- inventory with it; a GPU count below it sets GpuCountMismatch.
CREATE TABLE pool_hardware_profiles (
    pool_id    text PRIMARY KEY REFERENCES pools(id),
    gpu_count  integer NOT NULL CHECK (gpu_count BETWEEN 0 AND 256),
    gpu_model  text NOT NULL DEFAULT '',
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One allocation request the placer booked; its atoms (one GPU index on one
-- device each) are in allocation_atoms.
CREATE TABLE allocations (
    id             text PRIMARY KEY,
    tenant_id      text NOT NULL REFERENCES tenants(id),
    pool_id        text NOT NULL REFERENCES pools(id),
    gpus           integer NOT NULL CHECK (gpus >= 1),
    same_device    boolean NOT NULL DEFAULT false,
    nvlink_domain  text,
    status         text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'impaired', 'released')),
    impaired_reason text,
    impaired_at    timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    released_at    timestamptz,
    -- The caller's idempotency key: a retried request gets the first answer.
    request_id     text
);
CREATE UNIQUE INDEX allocations_request ON allocations (tenant_id, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX allocations_pool ON allocations (pool_id) WHERE status <> 'released';
CREATE INDEX allocations_tenant ON allocations (tenant_id, created_at);

CREATE TABLE allocation_atoms (
    allocation_id  text NOT NULL REFERENCES allocations(id),
    device_id      text NOT NULL REFERENCES devices(id),
    atom           integer NOT NULL CHECK (atom >= 0),
    -- The device version the placer read under its row lock: the state
    -- the schedulable predicate was checked against.
    device_version bigint NOT NULL,
    released_at    timestamptz,
    PRIMARY KEY (allocation_id, device_id, atom)
);
-- Double booking is impossible even if a bug got past the row lock.
CREATE UNIQUE INDEX allocation_atoms_booked ON allocation_atoms (device_id, atom) WHERE released_at IS NULL;

-- The placer's transactional outbox (allocation events), published by its
-- relay with Nats-Msg-Id = placer-<id> and deleted after the PubAck.
CREATE TABLE placer_outbox (
    id         bigserial PRIMARY KEY,
    subject    text NOT NULL,
    schema     text NOT NULL,
    payload    bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Join tokens a node agent presents at join; stored hashed. The token
-- decides the site, the pool (and so the role) and the trust of a new
-- device.
CREATE TABLE join_tokens (
    id              text PRIMARY KEY,
    token_sha256    text NOT NULL UNIQUE,
    site_id         text NOT NULL REFERENCES sites(id),
    pool_id         text REFERENCES pools(id),
    trust           text NOT NULL DEFAULT 'platform' CHECK (trust IN ('platform', 'tenant-owned', 'tenant-controlled')),
    owner_tenant_id text REFERENCES tenants(id),
    description     text NOT NULL DEFAULT '',
    expires_at      timestamptz,
    revoked_at      timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- The credential a join issues, bound to the identity generation it was
-- issued for: once the device's identity_generation moves on, it never
-- works again.
CREATE TABLE agent_credentials (
    id                  text PRIMARY KEY,
    device_id           text NOT NULL REFERENCES devices(id),
    identity_generation bigint NOT NULL,
    secret_sha256       text NOT NULL UNIQUE,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX agent_credentials_device ON agent_credentials (device_id, identity_generation);

-- The current session per device. Each open takes the next epoch, above
-- the hub's session_epoch, so a newer session always wins at the hub.
CREATE TABLE agent_sessions (
    device_id           text PRIMARY KEY REFERENCES devices(id),
    epoch               bigint NOT NULL,
    identity_generation bigint NOT NULL,
    token_sha256        text NOT NULL,
    gateway_id          text NOT NULL,
    site_id             text NOT NULL,
    trust               text NOT NULL,
    -- The inventory the agent last reported (GPU count and model).
    inventory           jsonb NOT NULL DEFAULT '{}'::jsonb,
    opened_at           timestamptz NOT NULL DEFAULT now(),
    closed_at           timestamptz,
    close_reason        text
);
