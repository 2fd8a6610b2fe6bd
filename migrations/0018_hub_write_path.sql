-- The hub's write path (issue 20, docs/benchmarks.md "Where the initial
-- load's time went"): the foreign keys from the three tables the hub writes
-- on every snapshot to devices go. Each key check was a lookup and a
-- FOR KEY SHARE lock of the device row per written row: about half of the
-- cost of every condition, freshness and lifecycle insert.
--
-- What they guarded still holds without them:
-- - only the hub writes these tables (0007_roles.sql), and it writes rows
--   only for devices it read in the same transaction under FOR UPDATE;
-- - no role may DELETE from devices (0007_roles.sql grants INSERT and
--   UPDATE only); a deleted device is a soft delete (deleted_at), its rows
--   stay and still name it.
ALTER TABLE device_conditions DROP CONSTRAINT device_conditions_device_id_fkey;
ALTER TABLE device_source_freshness DROP CONSTRAINT device_source_freshness_device_id_fkey;
ALTER TABLE device_lifecycle_events DROP CONSTRAINT device_lifecycle_events_device_id_fkey;

-- A partition lease lives as long as its replica's heartbeat
-- (hub_replicas.expires_at). Renewing every lease row each round made the
-- renewal wait for the batches that hold those rows FOR SHARE (the fence),
-- and the next batches wait for the renewal: a stall of up to 200 ms every
-- round (services/hub/src/lease.rs).
ALTER TABLE hub_partition_leases DROP COLUMN expires_at;
