-- Hub replicas share the OBSERVATIONS partitions without static assignment
-- (docs/scaling.md, "Partition leases"). A replica heartbeats its row in
-- hub_replicas; each partition is leased to at most one replica at a time.
-- Every time/expiry is PostgreSQL's own clock (now()), so replicas' clocks
-- never decide who owns what.
--
-- `epoch` fences: it grows on every change of owner (and on a replica's
-- re-claim after a restart), and every batch a replica applies first reads
-- its lease rows FOR SHARE and checks their epochs in the same
-- transaction. A replica that lost a lease (expired and taken over) can
-- therefore never commit another write for that partition, and a takeover
-- waits for the batch in flight to commit.
CREATE TABLE hub_replicas (
    replica    text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

CREATE TABLE hub_partition_leases (
    partition  integer PRIMARY KEY CHECK (partition >= 0),
    replica    text NOT NULL,
    epoch      bigint NOT NULL CHECK (epoch > 0),
    expires_at timestamptz NOT NULL
);
CREATE INDEX hub_partition_leases_replica ON hub_partition_leases (replica);

GRANT SELECT ON hub_replicas, hub_partition_leases
    TO fleet_hub, fleet_api, fleet_placer, fleet_gateway, fleet_radar, fleet_workflow;
GRANT INSERT, UPDATE, DELETE ON hub_replicas, hub_partition_leases TO fleet_hub;
