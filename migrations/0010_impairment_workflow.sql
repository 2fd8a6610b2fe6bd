-- Impairment events move to the workflow service (seed 002, "Impairment
-- events"): the API asks, the workflow service records the event, sets
-- and removes each device's hold through the hub, and removes and restores
-- the customer-ready trait in Placement. Only the workflow service writes
-- the events from now on; the API reads them.

REVOKE INSERT, UPDATE ON impairment_events, impairment_event_devices FROM fleet_api;
GRANT INSERT, UPDATE ON impairment_events, impairment_event_devices TO fleet_workflow;

-- Tries of the device's current step after transient failures.
ALTER TABLE impairment_event_devices ADD COLUMN attempts integer NOT NULL DEFAULT 0;

-- The devices still to be worked on: an event's settle asks whether any is
-- left without walking the rest.
CREATE INDEX impairment_event_devices_open ON impairment_event_devices (event_id, status)
    WHERE status IN ('pending', 'retrying', 'release_pending', 'release_retrying');

-- Pending Placement work is now carried out; the old index served a
-- reader that never came.
DROP INDEX IF EXISTS impairment_event_devices_placement;

COMMENT ON COLUMN impairment_event_devices.placement_action IS
    'The Placement trait work of the device''s current phase: remove_customer_ready_trait (cordon), restore_customer_ready_trait (release of a pre-hold available or in_use host), or NULL (a standalone-Ironic site, or nothing to restore).';
COMMENT ON COLUMN impairment_event_devices.placement_status IS
    'pending until the workflow service has carried out placement_action, then done (or failed, with error_code).';
