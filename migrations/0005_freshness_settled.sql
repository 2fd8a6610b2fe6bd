-- The hub's fast path for a freshness-only resync: a snapshot whose digest
-- equals the stored one, settled at the device's current version, moves
-- only this row's observed_at (fleet_domain::state::confirm). 0 = unsettled.
ALTER TABLE device_source_freshness ADD COLUMN settled_version bigint NOT NULL DEFAULT 0;

-- observed_at moves on every resync: an index on it made every one of those
-- updates write every index of the table. Nothing reads through it (the
-- sweeper compares observed_at with each device's derived_at), so it goes,
-- and free space in each page lets the resync update stay on the page (HOT).
DROP INDEX device_source_freshness_observed;
ALTER TABLE device_source_freshness SET (fillfactor = 70);
