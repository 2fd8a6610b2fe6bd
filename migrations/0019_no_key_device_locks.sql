-- Device row locks that leave foreign-key checks alone (issue 20): the hub
-- now locks the devices it writes FOR NO KEY UPDATE (services/hub/src/store/
-- devices.rs, lock_states), which excludes every other writer but not the
-- FOR KEY SHARE lock a foreign-key check takes. No role deletes devices or
-- changes their id (0007_roles.sql), so nothing needs the stronger lock.
-- The placer's booking lock follows: it still serialises with the hub's
-- status writes (NO KEY UPDATE conflicts with NO KEY UPDATE), while a
-- gateway session or credential insert naming the device no longer waits
-- for either.
CREATE OR REPLACE FUNCTION lock_devices(device_ids text[], skip_locked boolean)
    RETURNS SETOF text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
BEGIN
    IF skip_locked THEN
        RETURN QUERY SELECT id FROM devices WHERE id = ANY(device_ids) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED;
    ELSE
        RETURN QUERY SELECT id FROM devices WHERE id = ANY(device_ids) ORDER BY id FOR NO KEY UPDATE;
    END IF;
END
$$;
