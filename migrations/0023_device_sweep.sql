-- The sweeper reads only the devices that may be due (issue 20,
-- docs/scaling.md "The sweeper"). Until now each sweep read every live
-- device and every freshness row to find a source whose TTL ran out since
-- the device was last derived, or a late heartbeat: 150 - 550 ms at
-- 100,000 devices, ten times that at 1 million, and a sweep waits ten
-- times its duration, so silence was noticed ever later as the fleet grew.
--
-- device_sweep.sweep_at is no later than any deadline of the device still
-- to come since its last derivation (a source's observed_at + TTL, a
-- session's liveness timeouts); NULL or no row: none. Deadlines only move
-- later as snapshots and heartbeats arrive, so the freshness-only fast
-- path and heartbeats leave it alone (they stay heap-only updates of their
-- own rows); a write that brings a deadline the device did not have (a
-- source's first snapshot, a session that opens) brings sweep_at forward,
-- and the sweeper sets it again for every device it looks at. Only the
-- hub writes it; a table of its own, so that setting it is not a new
-- version of the devices row in every index of devices.
--
-- A device nothing is due for is looked at without locking it: the sweeper
-- sets its sweep_at again only if `lowered` is what it read, and every
-- write that brings sweep_at forward also counts up `lowered`, so a
-- deadline a lane brought while the sweeper read the device's rows is
-- never overwritten by a later one computed without it.
--
-- Room on each page (fillfactor 80) for a row's next version: a write
-- that counts `lowered` up without moving sweep_at stays a heap-only
-- update.
CREATE TABLE device_sweep (
    device_id text PRIMARY KEY,
    sweep_at  timestamptz,
    lowered   bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 80);
CREATE INDEX device_sweep_at ON device_sweep (sweep_at) WHERE sweep_at IS NOT NULL;

-- The TTLs and liveness timeouts the sweep_at values were computed with.
-- A hub that starts with other settings marks every live device due once,
-- so the sweeper computes them again (a shorter TTL would otherwise be
-- noticed only at the old, later deadline); the first hub to start
-- records its settings.
CREATE TABLE hub_sweep_settings (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    deadlines text NOT NULL
);

-- The devices of a database migrated from before: each is looked at once
-- by the first sweep, which sets its sweep_at.
INSERT INTO device_sweep (device_id, sweep_at)
SELECT id, now() FROM devices WHERE deleted_at IS NULL;

GRANT SELECT, INSERT, UPDATE, DELETE ON device_sweep, hub_sweep_settings TO fleet_hub;
