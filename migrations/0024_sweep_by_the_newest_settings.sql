-- Whose sweep it is during a rolling change of the freshness TTLs or the
-- liveness timeouts (docs/operations.md, "The hub"). Until now a hub that
-- started with other settings marked every live device due once, but a
-- replica still running the old settings went on setting `sweep_at` by
-- them until it stopped: a device it looked at last waited for the old,
-- possibly later, deadline. A Deployment's rolling update does exactly
-- that.
--
-- Each replica's heartbeat now carries its settings (`deadlines`, the
-- fingerprint hub_sweep_settings records) and when it came with them
-- (`started_at`, PostgreSQL's clock). Only the replicas with the settings
-- of the live replica that started last sweep; the others leave it to
-- them. `mixed` records that a live replica with other settings was seen
-- while these swept: once none is live, every device is made due once
-- more, since such a replica's lanes may have set a source's first
-- deadline by its own TTL.
ALTER TABLE hub_replicas
    ADD COLUMN deadlines text,
    ADD COLUMN started_at timestamptz NOT NULL DEFAULT now();

ALTER TABLE hub_sweep_settings
    ADD COLUMN mixed boolean NOT NULL DEFAULT false;
