-- Back-end VRF flips (issue 16; seed 002, "Back-end VRF latch contract"):
-- "The back-end VRF flip workflows write it on a real run, at a site that
-- sets backend_vrf_flip_allowed". A site without it has every back-end
-- flip run simulated (planned, read and reported, nothing written, no
-- latch). Hub-owned like the rest of `sites` (create_site, update_site).
ALTER TABLE sites ADD COLUMN backend_vrf_flip_allowed boolean NOT NULL DEFAULT false;
