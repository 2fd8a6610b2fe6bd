-- The API's allocation list and latch-drift list.

-- GET /api/v1/latch-drift/ starts from the live fabric observation rows of
-- every device (device_conditions by type); without this it reads the
-- whole table. type and device_id never change on a row, so updates stay
-- HOT-eligible.
CREATE INDEX device_conditions_type ON device_conditions (type, device_id);

-- GET /api/v1/allocations/?tenant= / ?pool=: newest first, keyset on id.
CREATE INDEX allocations_api_tenant ON allocations (tenant_id, id);
CREATE INDEX allocations_api_pool ON allocations (pool_id, id);
