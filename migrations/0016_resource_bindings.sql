-- UNI resource attribution (seed 002, "Device composite model"):
-- `DeviceResourceBinding`, one row per device and typed resource. Its
-- `resolution_status` (resolved / stale) is never stored: "readers derive
-- stale state from the persisted timestamps at read time" (the row's
-- observed_at or its source's snapshot freshness, the later, against the
-- source's TTL; failed_at set means stale). A failed resource keeps its
-- last-known resource_id. Written by the hub only, from snapshots.
CREATE TABLE device_resource_bindings (
    device_id   text NOT NULL REFERENCES devices (id) ON DELETE CASCADE,
    resource    text NOT NULL CHECK (resource IN ('uni', 'placement', 'kubernetes')),
    source      text NOT NULL,
    resource_id text,
    resolved_at timestamptz,
    failed_at   timestamptz,
    reason      text NOT NULL DEFAULT '',
    message     text NOT NULL DEFAULT '',
    observed_at timestamptz NOT NULL,
    PRIMARY KEY (device_id, resource)
);
CREATE INDEX device_resource_bindings_resource ON device_resource_bindings (resource, device_id);

GRANT SELECT ON device_resource_bindings
    TO fleet_hub, fleet_api, fleet_placer, fleet_gateway, fleet_radar, fleet_workflow;
GRANT INSERT, UPDATE ON device_resource_bindings TO fleet_hub;
