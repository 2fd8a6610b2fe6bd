-- compose's PostgreSQL: one login user per service, each a member of its
-- service's role only (docs/security.md, "Database roles"), so a service
-- cannot do more than its role even by RESET ROLE. Run once by the postgres
-- image at first start (compose/postgres-init.sh passes the passwords as
-- psql variables), before `fleet migrate`, which finds the roles made.
DO $$
DECLARE r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['fleet_hub', 'fleet_api', 'fleet_placer', 'fleet_gateway', 'fleet_radar', 'fleet_workflow'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
END $$;

CREATE ROLE fleet_hub_login LOGIN PASSWORD :'hub_password' IN ROLE fleet_hub;
CREATE ROLE fleet_api_login LOGIN PASSWORD :'api_password' IN ROLE fleet_api;
CREATE ROLE fleet_placer_login LOGIN PASSWORD :'placer_password' IN ROLE fleet_placer;
CREATE ROLE fleet_gateway_login LOGIN PASSWORD :'gateway_password' IN ROLE fleet_gateway;
CREATE ROLE fleet_radar_login LOGIN PASSWORD :'radar_password' IN ROLE fleet_radar;
CREATE ROLE fleet_workflow_login LOGIN PASSWORD :'workflow_password' IN ROLE fleet_workflow;
