-- Sites, tenants, pools and pool hardware profiles are set up through the
-- hub's inventory commands (`create_site`, `create_pool`, ...: the API's
-- /api/v1/sites/, /tenants/ and /pools/ and `fleet sites|tenants|pools`),
-- so the hub's role writes them. Radar keeps its one tenant column.
GRANT INSERT, UPDATE, DELETE ON sites, tenants, pools, pool_hardware_profiles TO fleet_hub;
