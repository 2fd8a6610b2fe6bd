-- The API's allocation list: GET /api/v1/allocations/?tenant= / ?pool=,
-- newest first, keyset on id.
--
-- No index on device_conditions(type) for the latch-drift list: measured
-- at 30,000 devices x 21 conditions, the drift query (fleet_store::drift,
-- the observed rows joined to an UNNEST of the pairs, ordered by device)
-- walks the primary key with or without it, so it would only cost writes.
CREATE INDEX allocations_api_tenant ON allocations (tenant_id, id);
CREATE INDEX allocations_api_pool ON allocations (pool_id, id);
