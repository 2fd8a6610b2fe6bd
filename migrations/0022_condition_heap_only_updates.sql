-- Condition changes as heap-only updates (issue 20). A device's status
-- change rewrites a few of its condition rows: the one whose status
-- changed, and the ones whose `decisive` mark moved with it.
--
-- device_conditions_decisive (device_id) WHERE decisive made `decisive` an
-- indexed column, so every such row was a new version with a new entry in
-- both indexes. Nothing needs it: the API's two reads of decisive rows
-- (a device's decisive rows; the condition list filtered on `decisive`,
-- in (device_id, type) order) are both answered by the primary key
-- (device_id, type), whose scan finds every device's few decisive rows
-- among its own.
DROP INDEX device_conditions_decisive;

-- Room on each page for a changed row's new version: at the default
-- fillfactor of 100 the pages a fleet's first snapshots fill have none,
-- and a change could not stay on its page. Applies to pages written from
-- now on (and to every page after a VACUUM FULL or CLUSTER), as devices'
-- fillfactor did in 0020.
ALTER TABLE device_conditions SET (fillfactor = 80);
