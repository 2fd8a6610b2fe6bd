-- Every seed-002 workflow on one run loop (issue 16): a job's options
-- (Move to Test Cluster's force_reclaim, Release's release_to_customer_pool,
-- a simulated fabric run, ...), each device's parameters (the customer VRF
-- a front-end return puts its ports in) and each device's results (what a
-- fabric flip read back on every switch).
ALTER TABLE jobs ADD COLUMN options jsonb NOT NULL DEFAULT '{}'::jsonb;
UPDATE jobs SET options = jsonb_build_object('cordon_only', cordon_only) WHERE cordon_only;
ALTER TABLE job_devices
    ADD COLUMN params  jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN results jsonb NOT NULL DEFAULT '[]'::jsonb;
