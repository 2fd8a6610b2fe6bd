-- One PostgreSQL role per service, so that ownership is enforced by the
-- database and not assumed by convention (docs/security.md, "Database
-- roles"). Only the hub writes devices, their conditions, freshness and
-- lifecycle; the API writes its tokens and impairment events; the placer its
-- allocations and outbox; the gateway its join tokens, credentials and
-- sessions; Radar one tenant annotation. Every role reads the rest, except
-- the credential tables, which only their owner reads.
--
-- The roles are NOLOGIN: a service connects as any user that is a member of
-- its role (or a superuser) and works as the role (`database.set_role`,
-- on by default: the connection starts with `role=fleet_<service>`). Roles
-- are cluster-wide, so this migration creates them only when missing: the
-- user running `fleet migrate` needs CREATEROLE the first time, or the roles
-- created beforehand.
DO $$
DECLARE r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['fleet_hub', 'fleet_api', 'fleet_placer', 'fleet_gateway', 'fleet_radar'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                -- Another database's migration created it at the same moment.
                WHEN duplicate_object OR unique_violation THEN NULL;
            END;
        END IF;
    END LOOP;
END $$;

-- Reading: every table, now and in later migrations.
GRANT SELECT ON ALL TABLES IN SCHEMA public
    TO fleet_hub, fleet_api, fleet_placer, fleet_gateway, fleet_radar;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES
    TO fleet_hub, fleet_api, fleet_placer, fleet_gateway, fleet_radar;
-- Credentials are read by their owner only.
REVOKE SELECT ON api_tokens FROM fleet_hub, fleet_placer, fleet_gateway, fleet_radar;
REVOKE SELECT ON join_tokens, agent_credentials FROM fleet_hub, fleet_api, fleet_placer, fleet_radar;

-- The hub: the device record and everything derived with it. Lifecycle
-- events are append-only, so the hub may insert them and nothing else.
GRANT INSERT, UPDATE ON devices, device_conditions, device_source_freshness TO fleet_hub;
GRANT INSERT ON device_lifecycle_events TO fleet_hub;
-- The relays lock their outbox rows (FOR UPDATE SKIP LOCKED), which needs UPDATE.
GRANT INSERT, UPDATE, DELETE ON outbox TO fleet_hub;
GRANT INSERT, UPDATE, DELETE ON unresolved_observations TO fleet_hub;
GRANT USAGE ON SEQUENCE device_lifecycle_events_id_seq, outbox_id_seq TO fleet_hub;

-- The API: its tokens and the impairment events operators declare.
GRANT INSERT, UPDATE ON api_tokens, impairment_events, impairment_event_devices TO fleet_api;

-- The placer: allocations, their atoms and its outbox.
GRANT INSERT, UPDATE ON allocations, allocation_atoms TO fleet_placer;
GRANT INSERT, UPDATE, DELETE ON placer_outbox TO fleet_placer;
GRANT USAGE ON SEQUENCE placer_outbox_id_seq TO fleet_placer;

-- The gateway: join tokens, agent credentials and sessions.
GRANT INSERT, UPDATE, DELETE ON join_tokens, agent_credentials, agent_sessions TO fleet_gateway;

-- Radar: the tenant's radar_ignore annotation, and no other column.
GRANT UPDATE (annotations) ON tenants TO fleet_radar;

-- The placer books against device rows it may not write: it locks them
-- through this function, which runs as the hub's role, so a booking and the
-- hub's status write still serialise on the row lock (SELECT ... FOR UPDATE
-- needs UPDATE privilege; the placer has none on devices). Returns the ids
-- locked, in id order; with skip_locked a row another transaction holds is
-- left out instead of waited for.
CREATE FUNCTION lock_devices(device_ids text[], skip_locked boolean)
    RETURNS SETOF text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
BEGIN
    IF skip_locked THEN
        RETURN QUERY SELECT id FROM devices WHERE id = ANY(device_ids) ORDER BY id FOR UPDATE SKIP LOCKED;
    ELSE
        RETURN QUERY SELECT id FROM devices WHERE id = ANY(device_ids) ORDER BY id FOR UPDATE;
    END IF;
END
$$;
ALTER FUNCTION lock_devices(text[], boolean) OWNER TO fleet_hub;
REVOKE ALL ON FUNCTION lock_devices(text[], boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_devices(text[], boolean) TO fleet_placer;
