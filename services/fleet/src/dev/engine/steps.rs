//! How one device's state evolves each tick: hand-over and custody, the
//! fabric latches, maintenance, and the rest of its life.

use super::*;

/// Handed over: a customer-ready device nothing runs on, not in custody.
pub(super) fn handover_eligible(d: &SimDevice) -> bool {
    d.provision_state == "available"
        && d.customer_ready
        && d.maintenance.is_none()
        && d.lessee == CUSTOMER_PROJECT
        && d.custody.is_none()
        && d.pending.is_none()
        && !d.delegated
}

/// A handover to the partner. A proper one asks for the front-end port in
/// the device's customer VRF and waits for the workflow service's flip to
/// apply, verify and record it; `breach` hands the device over with no
/// flip.
pub(super) fn start_handover(d: &mut SimDevice, breach: bool, a: &mut Activity) {
    if d.delegated || d.drained {
        return;
    }
    if breach {
        // `conditions.md`: custody entry with no verified flip on record.
        d.frontend_latch = Some(FrontendLatch::HandoverBreach);
        enter_custody(d);
        a.breaches += 1;
        return;
    }
    d.pending = Some(frontend_flip(
        d,
        format!("{CUSTOMER_VRF_PREFIX}{:04}", d.index % 10_000),
        FrontendLatch::CustomerVrfFlipVerified,
    ));
}

/// A flip of the device's front-end port into `vrf`, `latch` recorded once
/// verified.
fn frontend_flip(d: &SimDevice, vrf: String, latch: FrontendLatch) -> FlipJob {
    FlipJob {
        index: d.index,
        site: d.site.clone(),
        name: d.name.clone(),
        switch: frontend_switch(&d.rack),
        port: switch_port(d),
        vrf,
        latch,
    }
}

pub(super) fn enter_custody(d: &mut SimDevice) {
    d.custody = Some(Custody::GoogleOwned);
    d.delegated = true;
    d.custody_served = false;
}

/// A device with the partner: it comes back (`PARTNER_OWNED`, the
/// front-end isolate asked for) or is drained, but only after Borneo has
/// reported the custody entry to the hub.
pub(super) fn custody_step(d: &mut SimDevice, roll: u32, a: &mut Activity) {
    if d.pending.is_some() {
        return;
    }
    match d.custody {
        Some(Custody::GoogleOwned) if d.custody_served && roll < 8 => {
            d.custody = Some(Custody::PartnerOwned);
            a.returns += 1;
            if d.frontend_latch == Some(FrontendLatch::CustomerVrfFlipVerified) {
                d.pending = Some(frontend_flip(
                    d,
                    ISOLATE_VRF.into(),
                    FrontendLatch::IsolateFlipVerified,
                ));
            }
        }
        Some(Custody::GoogleOwned) if d.custody_served && roll < 10 => {
            d.custody = Some(Custody::Drained);
            d.drained = true;
            a.drains += 1;
        }
        Some(Custody::PartnerOwned) if roll < 5 => {
            // The partner rotates the credential it returned.
            d.credential_rotation += 1;
        }
        _ => {}
    }
}

/// Fabric moves apart from custody: back-end VRF flips and NVLink
/// repair-partition moves, now and then one caught half-way.
pub(super) fn fabric_step(d: &mut SimDevice, roll: u32, a: &mut Activity) {
    match roll {
        0..=4 => {
            d.backend_vrf = if d.backend_vrf == MAINTENANCE_VRF {
                TENANT_BACKEND_VRF
            } else {
                MAINTENANCE_VRF
            };
            a.vrf_flips += 1;
        }
        5..=8 => {
            d.gpus_in_repair = if d.gpus_in_repair == 0 {
                GPUS_PER_DEVICE
            } else {
                0
            };
            a.nvlink_moves += 1;
        }
        9 => {
            d.gpus_in_repair = GPUS_PER_DEVICE / 2;
            a.nvlink_moves += 1;
        }
        _ => {}
    }
}

/// The three live-fabric observations connector-fabric should publish for
/// the device (`connectors.md`): front-end in a customer VRF, back-end in
/// the maintenance VRF, every GPU in the repair partition (some but not
/// all: `Unknown` `PartiallyInRepairPartition`). A leaf that cannot be read
/// makes only its plane `Unknown` (`SwitchUnreachable`), an NMX-M outage the
/// NVLink one (`NmxUnreachable`): `out` is `(front-end, back-end, NMX-M)`.
pub fn expected_fabric(d: &SimDevice, out: (bool, bool, bool)) -> (Tri, Tri, Tri) {
    let (f, b, n) = expected_fabric_live(d);
    let unknown_if = |o: bool, t: Tri| if o { Tri::Unknown } else { t };
    (
        unknown_if(out.0, f),
        unknown_if(out.1, b),
        unknown_if(out.2, n),
    )
}

pub(super) fn expected_fabric_live(d: &SimDevice) -> (Tri, Tri, Tri) {
    let b = |v: bool| if v { Tri::True } else { Tri::False };
    let nvlink = match d.gpus_in_repair {
        0 => Tri::False,
        n if n == GPUS_PER_DEVICE => Tri::True,
        _ => Tri::Unknown,
    };
    (
        b(d.frontend_vrf.starts_with(CUSTOMER_VRF_PREFIX)),
        b(d.backend_vrf == MAINTENANCE_VRF),
        nvlink,
    )
}

pub(super) fn enter_maintenance_pool(d: &mut SimDevice) {
    d.lessee = MAINTENANCE_PROJECT;
    d.provision_state = "manageable";
    d.instance_uuid = None;
    d.customer_ready = false;
    d.slurm = Some(SlurmState::Idle);
}

/// One change to one device, chosen by `roll` (0..100) among those its
/// current state allows.
pub(super) fn step(d: &mut SimDevice, roll: u32, a: &mut Activity) {
    if let Some(reason) = &d.maintenance {
        let _ = reason;
        if roll < 50 {
            d.maintenance = None;
        }
        return;
    }
    if d.lessee == MAINTENANCE_PROJECT {
        match (d.slurm, roll) {
            (Some(SlurmState::Idle), 0..=39) => {
                // Validation passed: back to the customer pool.
                d.lessee = CUSTOMER_PROJECT;
                d.slurm = None;
                d.provision_state = "available";
                d.customer_ready = true;
                a.validated += 1;
            }
            (Some(SlurmState::Idle), 40..=64) => {
                d.slurm = Some(SlurmState::Drain);
                a.slurm_drains += 1;
            }
            (Some(SlurmState::Idle), 65..=79) => {
                d.slurm = Some(SlurmState::Down);
                a.slurm_downs += 1;
            }
            (Some(SlurmState::Drain | SlurmState::Down), 0..=59) => {
                d.slurm = Some(SlurmState::Idle)
            }
            _ => {}
        }
        return;
    }
    match d.provision_state {
        "available" if roll < 60 => {
            d.provision_state = "deploying";
            a.deploys += 1;
        }
        "deploying" if roll < 85 => {
            d.provision_state = "active";
            d.instance_uuid = Some(uuid_of(d.index, roll as u64 + 17));
        }
        "deploying" => {
            d.provision_state = "deploy failed";
            a.ironic_failures += 1;
        }
        "active" if roll < 40 => {
            d.provision_state = "cleaning";
            d.instance_uuid = None;
            a.releases += 1;
        }
        "active" if roll < 50 => {
            d.maintenance = Some("sim: gpu reseat".into());
            a.maintenance += 1;
        }
        "cleaning" if roll < 85 => d.provision_state = "available",
        "cleaning" => {
            d.provision_state = "clean failed";
            a.ironic_failures += 1;
        }
        "deploy failed" | "clean failed" | "manageable" if roll < 50 => {
            enter_maintenance_pool(d);
            a.repairs += 1;
        }
        _ => {}
    }
}
