-- Heartbeats as heap-only updates (issue 20). The hub's heartbeat fast path
-- writes one column, devices.session_last_seen, about once a heartbeat
-- interval per connected device (1,000 rows a second at 100,000 agents).
-- That column was the key of devices_session_last_seen, so every such
-- update was a new row version with a new entry in each of the table's
-- indexes. Without an index on it, and with room left on each page, the
-- update stays on its page and touches no index (a HOT update).
--
-- Nothing read through the index: the sweeper's one query on the column
-- compares session_last_seen + interval with now(), which a btree on
-- session_last_seen cannot answer, and it reads every live device's
-- freshness rows in the same statement anyway.
DROP INDEX devices_session_last_seen;

-- Room for the new row version on the same page. Applies to pages written
-- from now on (and to every page after a VACUUM FULL or CLUSTER).
ALTER TABLE devices SET (fillfactor = 80);
