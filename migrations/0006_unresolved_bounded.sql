-- Unresolved observations are bounded: the payload kept is cut to
-- 16 KiB (payload_bytes records the original size) and the hub expires keys
-- not seen for hub.unresolved_retention_secs, and the oldest past
-- hub.unresolved_max_rows.
ALTER TABLE unresolved_observations ADD COLUMN payload_bytes bigint NOT NULL DEFAULT 0;
UPDATE unresolved_observations SET payload_bytes = length(payload);
UPDATE unresolved_observations SET payload = substring(payload FROM 1 FOR 16384)
 WHERE length(payload) > 16384;
CREATE INDEX unresolved_observations_received ON unresolved_observations (received_at);
