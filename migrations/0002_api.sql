-- The operator API's own records: impairment events and their per-device
-- status (seed 002, "Impairment events"). Device status itself stays the
-- hub's: the API sets and removes holds through hub commands and records
-- here what it asked for and what the hub answered.

CREATE TABLE impairment_events (
    id          text PRIMARY KEY,
    status      text NOT NULL CHECK (status IN ('accepted', 'cordoned', 'cleared', 'partially_failed',
        'failed', 'release_pending', 'release_retrying', 'release_failed')),
    reason      text NOT NULL,
    ticket_url  text,
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    cleared_at  timestamptz
);
CREATE INDEX impairment_events_created ON impairment_events (created_at DESC, id DESC);

CREATE TABLE impairment_event_devices (
    event_id    text NOT NULL REFERENCES impairment_events(id),
    device_id   text NOT NULL REFERENCES devices(id),
    status      text NOT NULL CHECK (status IN ('pending', 'cordoned', 'cleared', 'failed', 'retrying',
        'release_pending', 'release_retrying', 'release_failed')),
    -- operational_status when the hold was asked for: a pre-hold available
    -- or in_use host gets the customer-ready trait restored on release.
    pre_hold_operational_status text NOT NULL,
    -- Placement trait removal (cordon) and restore (release) belong to the
    -- workflow service, which does not exist yet: recorded as pending work.
    placement_action text CHECK (placement_action IN ('remove_customer_ready_trait',
        'restore_customer_ready_trait')),
    placement_status text CHECK (placement_status IN ('pending', 'done', 'failed')),
    error_code    text,
    error_message text,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, device_id)
);
CREATE INDEX impairment_event_devices_device ON impairment_event_devices (device_id);
CREATE INDEX impairment_event_devices_placement ON impairment_event_devices (placement_status)
    WHERE placement_status = 'pending';

-- Device list pages are keyset-paged by id under equality filters; these
-- let the common filters (site, site + operational status, health) reach
-- the first page without walking the whole table, and the extended
-- statistics tell the planner which status combinations a site really has
-- (so a filter matching nothing is not planned as an early-exit id scan).
CREATE INDEX devices_api_site ON devices (site_id, id) WHERE deleted_at IS NULL;
CREATE INDEX devices_api_site_operational ON devices (site_id, operational_status, id)
    WHERE deleted_at IS NULL;
CREATE INDEX devices_api_health ON devices (health_status, id) WHERE deleted_at IS NULL;
CREATE STATISTICS devices_api_status_mcv (mcv) ON site_id, operational_status, health_status,
    inventory_status FROM devices;
