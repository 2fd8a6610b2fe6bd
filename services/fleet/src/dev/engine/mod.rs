//! The scenario engine: one fleet of simulated machines, the state of each
//! external system about them (NetBox and its cables, Ironic, Placement,
//! SLURM, Prometheus, Borneo custody, the front-end and back-end switches,
//! NMX-M), the evolution of that state, and the ground truth derived from
//! it by the rules of `spec/conditions.md`, written here again on purpose
//! (never `fleet_domain::derivation`) so the hub's derivation has an
//! independent check.

use std::collections::{BTreeMap, HashMap};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod device;
mod steps;
mod truth;

pub use device::*;
use steps::*;
pub use truth::*;

pub struct Scenario {
    pub sites: Vec<String>,
    pub devices: Vec<SimDevice>,
    /// Device indices per rack (racks never change).
    pub racks: BTreeMap<String, Vec<usize>>,
    pub outages: Outages,
    /// Device index by Ironic node (and Placement resource provider) uuid.
    by_uuid: HashMap<String, usize>,
    /// Device index by name (NetBox's device name).
    by_name: HashMap<String, usize>,
    /// The switches' NVUE revisions: id -> (switch, staged port VRFs,
    /// state).
    pub revisions: BTreeMap<String, (String, Vec<(String, String)>, &'static str)>,
    /// NMX-M operations (each completed when it is created).
    pub nmx_operations: u64,
    /// The batch jobs the simulated slurmrestd holds (burn-in tests).
    pub slurm_jobs: crate::dev::burn_in::Jobs,
    outage_ticks_left: u32,
    pub activity: Activity,
    rng: StdRng,
}

fn uuid_of(i: usize, salt: u64) -> String {
    let x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt;
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        (x >> 32) as u32,
        (x >> 16) as u16,
        (i >> 12) & 0xfff,
        i & 0xfff,
        x & 0xffff_ffff_ffff
    )
}

impl Scenario {
    /// `n` devices spread over `sites`, 32 to a rack, in a mix of every
    /// operational status the rules can produce.
    pub fn new(n: usize, sites: &[String], seed: u64) -> Scenario {
        let mut rng = StdRng::seed_from_u64(seed);
        let per_site = n.div_ceil(sites.len().max(1)).max(1);
        let devices = (0..n)
            .map(|i| {
                let site = sites[(i / per_site).min(sites.len() - 1)].clone();
                let in_site = i % per_site;
                let mut d = SimDevice {
                    index: i,
                    name: format!("gpu-{site}-{in_site:06}"),
                    rack: format!("{site}-r{:04}", in_site / 32),
                    serial: format!("SIM{i:08}"),
                    netbox_id: i as i64 + 1,
                    uuid: uuid_of(i, seed),
                    site,
                    provision_state: "active",
                    maintenance: None,
                    instance_uuid: None,
                    lessee: CUSTOMER_PROJECT,
                    customer_ready: true,
                    slurm: None,
                    health: match rng.gen_range(0..100) {
                        0..=91 => 0,
                        92..=97 => 1,
                        _ => 2,
                    },
                    frontend_vrf: ISOLATE_VRF.into(),
                    backend_vrf: TENANT_BACKEND_VRF,
                    gpus_in_repair: 0,
                    gpus_released: false,
                    custody: None,
                    frontend_latch: None,
                    delegated: false,
                    drained: false,
                    custody_served: false,
                    pending: None,
                    credential_rotation: 0,
                    has_agent: false,
                    placement_generation: 1,
                    agent_wanted: true,
                    agent_session: None,
                    instance_info: None,
                    inspection_finished_at: None,
                    operated: false,
                };
                match rng.gen_range(0..100) {
                    0..=54 => {
                        d.instance_uuid = Some(uuid_of(i, seed ^ 0xabc));
                    }
                    55..=74 => d.provision_state = "available",
                    75..=84 => enter_maintenance_pool(&mut d),
                    85..=88 => {
                        enter_maintenance_pool(&mut d);
                        d.slurm = Some(SlurmState::Drain);
                    }
                    89..=91 => d.provision_state = FAILURE_STATES[i % 2],
                    92..=94 => {
                        d.instance_uuid = Some(uuid_of(i, seed ^ 0xabc));
                        d.maintenance = Some("sim: fan replacement".into());
                    }
                    95..=97 => {
                        d.provision_state = "manageable";
                        d.customer_ready = false;
                    }
                    _ => d.provision_state = "deploying",
                }
                // The repair fabric: a device in the maintenance pool has its
                // back-end in the maintenance VRF and its GPUs in the repair
                // partition, mostly.
                if d.lessee == MAINTENANCE_PROJECT {
                    if rng.gen_bool(0.8) {
                        d.backend_vrf = MAINTENANCE_VRF;
                    }
                    d.gpus_in_repair = match rng.gen_range(0..10) {
                        0..=6 => GPUS_PER_DEVICE,
                        7 => GPUS_PER_DEVICE / 2,
                        _ => 0,
                    };
                }
                d
            })
            .collect::<Vec<_>>();
        // Some handovers under way from the start: most waiting for their
        // verified flip to be recorded, a few breaches on purpose.
        let mut activity = Activity::default();
        let devices = devices
            .into_iter()
            .map(|mut d| {
                if handover_eligible(&d) {
                    match rng.gen_range(0..100) {
                        0..=14 => start_handover(&mut d, false, &mut activity),
                        15..=19 => start_handover(&mut d, true, &mut activity),
                        _ => {}
                    }
                }
                d
            })
            .collect::<Vec<SimDevice>>();
        let mut racks: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for d in &devices {
            racks.entry(d.rack.clone()).or_default().push(d.index);
        }
        let by_uuid = devices.iter().map(|d| (d.uuid.clone(), d.index)).collect();
        let by_name = devices.iter().map(|d| (d.name.clone(), d.index)).collect();
        Scenario {
            sites: sites.to_vec(),
            devices,
            by_uuid,
            by_name,
            revisions: BTreeMap::new(),
            nmx_operations: 0,
            slurm_jobs: Default::default(),
            racks,
            outages: Outages::default(),
            outage_ticks_left: 0,
            activity,
            rng,
        }
    }

    /// The device whose node (and resource provider) is `uuid`.
    pub fn by_uuid_mut(&mut self, uuid: &str) -> Option<&mut SimDevice> {
        let i = *self.by_uuid.get(uuid)?;
        self.devices.get_mut(i)
    }

    /// The node Ironic at `site` knows as `ident` (its uuid or its name).
    pub fn node_mut(&mut self, site: &str, ident: &str) -> Option<&mut SimDevice> {
        let i = match self.by_uuid.get(ident) {
            Some(i) => *i,
            None => *self.by_name.get(ident)?,
        };
        self.devices.get_mut(i).filter(|d| d.site == site)
    }

    /// The device NetBox names `name`.
    pub fn by_name(&self, name: &str) -> Option<&SimDevice> {
        self.devices.get(*self.by_name.get(name)?)
    }

    /// A leaf applies staged port VRFs (`(port, vrf)`): the ports of its
    /// rack's devices move; a back-end VRF the scenario does not know is
    /// refused.
    pub fn apply_vrfs(&mut self, switch: &str, changes: &[(String, String)]) -> Result<(), String> {
        let (rack, frontend) = if let Some(r) = switch.strip_prefix("fe-") {
            (r, true)
        } else if let Some(r) = switch.strip_prefix("be-") {
            (r, false)
        } else {
            return Err(format!("no switch {switch}"));
        };
        let members = self.racks.get(rack).cloned().unwrap_or_default();
        for (port, vrf) in changes {
            let Some(&i) = members
                .iter()
                .find(|&&i| switch_port(&self.devices[i]) == *port)
            else {
                return Err(format!("{switch} has no device port {port}"));
            };
            let d = &mut self.devices[i];
            if frontend {
                d.frontend_vrf = vrf.clone();
            } else {
                d.backend_vrf = match vrf.as_str() {
                    MAINTENANCE_VRF => MAINTENANCE_VRF,
                    TENANT_BACKEND_VRF => TENANT_BACKEND_VRF,
                    other => return Err(format!("no back-end VRF {other}")),
                };
                self.activity.vrf_flips += 1;
            }
        }
        Ok(())
    }

    /// NMX-M replaces partition `id`'s members at `site` (GPU ids
    /// `GPU-<uuid>-<k>`): a device's GPUs in the repair partition are
    /// counted; GPUs left out of the default partition are released.
    pub fn set_partition(
        &mut self,
        site: &str,
        id: u32,
        members: &std::collections::BTreeSet<String>,
    ) {
        for d in self.devices.iter_mut().filter(|d| d.site == site) {
            let listed = (0..GPUS_PER_DEVICE)
                .filter(|k| members.contains(&format!("GPU-{}-{k}", d.uuid)))
                .count() as u8;
            if id == REPAIR_PARTITION_ID {
                if listed != d.gpus_in_repair {
                    self.activity.nvlink_moves += 1;
                }
                d.gpus_in_repair = listed;
            } else if id == DEFAULT_PARTITION_ID {
                d.gpus_released = listed == 0 && d.gpus_in_repair < GPUS_PER_DEVICE;
            }
        }
        self.nmx_operations += 1;
    }

    /// One step of evolution: about `rate` of the fleet changes, and now
    /// and then one source goes out for a few ticks.
    pub fn tick(&mut self, rate: f64, allow_outages: bool) {
        self.activity.ticks += 1;
        if self.outage_ticks_left > 0 {
            self.outage_ticks_left -= 1;
            if self.outage_ticks_left == 0 {
                self.outages = Outages::default();
            }
        } else if allow_outages && self.rng.gen_bool(0.03) {
            self.activity.outages += 1;
            self.outage_ticks_left = self.rng.gen_range(2..5);
            match self.rng.gen_range(0..6) {
                0 | 1 => self.outages.ironic = true,
                2 | 3 => self.outages.slurm = true,
                4 if !self.devices.is_empty() => {
                    let i = self.rng.gen_range(0..self.devices.len());
                    self.outages.switch = Some((i, self.rng.gen_bool(0.5)));
                }
                _ => self.outages.nmx = Some(self.rng.gen_range(0..self.sites.len().max(1))),
            }
        }
        let n = self.devices.len();
        if n == 0 {
            return;
        }
        // Custody moves on its own clock: each device with the partner may
        // come back or be drained every tick.
        for i in 0..n {
            if self.devices[i].custody.is_some() {
                let roll = self.rng.gen_range(0..100);
                custody_step(&mut self.devices[i], roll, &mut self.activity);
            }
        }
        // Agents restart now and then: the session closes, and opens again
        // a few ticks later.
        for i in 0..n {
            if !self.devices[i].has_agent {
                continue;
            }
            let d = &mut self.devices[i];
            if d.agent_wanted && d.agent_session == Some(true) && self.rng.gen_bool(rate / 4.0) {
                d.agent_wanted = false;
                self.activity.agent_closes += 1;
            } else if !d.agent_wanted && d.agent_session == Some(false) && self.rng.gen_bool(0.3) {
                d.agent_wanted = true;
                self.activity.agent_reopens += 1;
            }
        }
        let changes = ((n as f64 * rate).ceil() as usize).max(1);
        for _ in 0..changes {
            let i = self.rng.gen_range(0..n);
            let roll = self.rng.gen_range(0..100);
            let a = &mut self.activity;
            let d = &mut self.devices[i];
            if d.custody.is_some() || d.pending.is_some() || d.operated {
                // With the partner, or mid-handover: only custody moves; a
                // device a workflow has written to moves only by its jobs.
                continue;
            }
            if roll < 3 && handover_eligible(d) && self.rng.gen_bool(0.5) {
                start_handover(d, roll < 1 && self.rng.gen_bool(0.5), a);
                continue;
            }
            step(d, roll, a);
            fabric_step(d, self.rng.gen_range(0..100), a);
            // Health degrades and recovers apart from the lifecycle.
            let h = self.rng.gen_range(0..100);
            if h < 10 {
                d.health = match (d.health, h) {
                    (0, 0..=6) => 1,
                    (0, _) => 2,
                    _ => 0,
                };
                a.health_changes += 1;
            }
        }
    }

    /// The front-end flips waiting for the workflow service.
    pub fn flip_jobs(&self) -> Vec<FlipJob> {
        self.devices
            .iter()
            .filter_map(|d| d.pending.clone())
            .collect()
    }

    /// The workflow service's flip job succeeded (the port moved on the
    /// switch, was read back and its latch recorded): custody moves (a
    /// handover enters `GOOGLE_OWNED`, a return is done).
    pub fn flip_recorded(&mut self, job: &FlipJob) {
        self.activity.latch_writes += 1;
        let Some(d) = self.devices.get_mut(job.index) else {
            return;
        };
        if d.pending.as_ref() != Some(job) {
            return;
        }
        d.pending = None;
        d.frontend_latch = Some(job.latch);
        if job.latch == FrontendLatch::CustomerVrfFlipVerified {
            enter_custody(d);
            self.activity.handovers += 1;
        }
    }

    /// The workflow could not verify or record the flip: it tries again.
    pub fn flip_failed(&mut self) {
        self.activity.latch_failures += 1;
    }

    /// Borneo answered a read listing these serials `GOOGLE_OWNED`.
    pub fn custody_served(&mut self, indices: &[usize]) {
        for &i in indices {
            if let Some(d) = self.devices.get_mut(i) {
                d.custody_served = true;
            }
        }
    }

    /// Expected `(condition, status)` counts of the three live-fabric
    /// observations, from the switches' and NMX-M's own state.
    pub fn fabric_truth(&self) -> BTreeMap<(&'static str, Tri), usize> {
        let mut out = BTreeMap::new();
        for d in &self.devices {
            let (f, b, n) = expected_fabric(d, self.fabric_outage(d));
            *out.entry(("FrontendPortsObservedInCustomerVrf", f))
                .or_default() += 1;
            *out.entry(("BackendPortsObservedInMaintenanceVrf", b))
                .or_default() += 1;
            *out.entry(("NvLinkGpusObservedInRepairPartition", n))
                .or_default() += 1;
        }
        out
    }

    /// Gives `count` devices, spread over the fleet, a simulated agent.
    pub fn enable_agents(&mut self, count: usize) {
        let n = self.devices.len();
        let count = count.min(n);
        for k in 0..count {
            self.devices[k * n / count].has_agent = true;
        }
    }

    /// What an agent did: opened (`true`) or closed (`false`) its session.
    pub fn agent_session(&mut self, index: usize, open: bool) {
        if let Some(d) = self.devices.get_mut(index) {
            d.agent_session = Some(open);
        }
    }

    /// Devices per expected `connectivity`: `connected` while its agent's
    /// session is open, `disconnected` otherwise (a closed session, or no
    /// session ever: the column's default). Agents never go silent here,
    /// so `unreachable` and `lost` are not expected.
    pub fn connectivity_truth(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for d in &self.devices {
            *out.entry(expected_connectivity(d)).or_default() += 1;
        }
        out
    }

    /// Which of the device's fabric reads is out: `(front-end leaf,
    /// back-end leaf, NMX-M)`.
    pub fn fabric_outage(&self, d: &SimDevice) -> (bool, bool, bool) {
        let (mut fe, mut be) = (false, false);
        if let Some((i, frontend)) = self.outages.switch {
            if self.devices.get(i).is_some_and(|o| o.rack == d.rack) {
                fe = frontend;
                be = !frontend;
            }
        }
        let nmx = self
            .outages
            .nmx
            .is_some_and(|k| self.sites.get(k) == Some(&d.site));
        (fe, be, nmx)
    }

    /// Whether a leaf's NVUE is out (answers 503) now.
    pub fn switch_out(&self, rack: &str, frontend: bool) -> bool {
        self.outages.switch.is_some_and(|(i, f)| {
            f == frontend && self.devices.get(i).is_some_and(|d| d.rack == rack)
        })
    }

    /// Whether a site's NMX-M is out now.
    pub fn nmx_out(&self, site: &str) -> bool {
        self.outages
            .nmx
            .is_some_and(|k| self.sites.get(k).map(String::as_str) == Some(site))
    }

    /// Expected `FrontendPortsInCustomerVrf` latches by reason.
    pub fn latch_truth(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for d in &self.devices {
            if let Some(l) = d.frontend_latch {
                *out.entry(l.reason()).or_default() += 1;
            }
        }
        out
    }

    /// Devices per custody state Borneo reports (the hub's `custody`).
    pub fn custody_truth(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for d in &self.devices {
            if let Some(c) = d.custody {
                *out.entry(c.wire()).or_default() += 1;
            }
        }
        out
    }

    /// Ends every outage now (a quiescent point for a check).
    pub fn heal(&mut self) {
        self.outages = Outages::default();
        self.outage_ticks_left = 0;
    }

    /// The operational status every device should have, by device name.
    pub fn ground_truth(&self) -> BTreeMap<(String, String), &'static str> {
        self.devices
            .iter()
            .map(|d| {
                (
                    (d.site.clone(), d.name.clone()),
                    expected_status(d, self.outages),
                )
            })
            .collect()
    }

    /// What the hub should hold for every device, by `(site, name)`:
    /// operational status, health and connectivity.
    pub fn device_truth(&self) -> HashMap<(String, String), Expected> {
        self.devices
            .iter()
            .map(|d| {
                (
                    (d.site.clone(), d.name.clone()),
                    Expected {
                        operational: expected_status(d, self.outages),
                        health: expected_health(d),
                        connectivity: expected_connectivity(d),
                    },
                )
            })
            .collect()
    }

    /// Simulated agents whose session is not open although they want it
    /// (not joined yet, or restarting).
    pub fn agents_not_open(&self) -> usize {
        self.devices
            .iter()
            .filter(|d| d.has_agent && d.agent_wanted && d.agent_session != Some(true))
            .count()
    }

    /// Devices per expected health status (`chassis_health` alone:
    /// Ok healthy, Warning degraded, Critical critical).
    pub fn health_distribution(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for d in &self.devices {
            *out.entry(expected_health(d)).or_default() += 1;
        }
        out
    }

    /// Devices per expected operational status.
    pub fn distribution(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for d in &self.devices {
            *out.entry(expected_status(d, self.outages)).or_default() += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: (bool, bool, bool) = (false, false, false);

    fn dev() -> SimDevice {
        Scenario::new(1, &["s1".into()], 1).devices[0].clone()
    }

    #[test]
    fn the_rules_in_order() {
        let none = Outages::default();
        let mut d = dev();
        d.provision_state = "active";
        d.instance_uuid = Some("i".into());
        d.customer_ready = true;
        d.maintenance = None;
        d.lessee = CUSTOMER_PROJECT;
        d.slurm = None;
        assert_eq!(expected_status(&d, none), "in_use");
        d.maintenance = Some("x".into());
        assert_eq!(expected_status(&d, none), "quarantine");
        d.provision_state = "deploy failed";
        assert_eq!(expected_status(&d, none), "failed");
        d.maintenance = None;
        d.provision_state = "available";
        d.instance_uuid = None;
        assert_eq!(expected_status(&d, none), "available");
        d.provision_state = "cleaning";
        // CustomerReady True, not allocated, not available: no rule but 9.
        assert_eq!(expected_status(&d, none), "unknown");
        d.customer_ready = false;
        assert_eq!(expected_status(&d, none), "quarantine");
        enter_maintenance_pool(&mut d);
        assert_eq!(expected_status(&d, none), "validation");
        d.slurm = Some(SlurmState::Drain);
        assert_eq!(expected_status(&d, none), "quarantine");
        // A scheduler outage keeps a validating node in validation.
        d.slurm = Some(SlurmState::Idle);
        let slurm_out = Outages {
            slurm: true,
            ..Outages::default()
        };
        assert_eq!(expected_status(&d, slurm_out), "validation");
        // Never failed or quarantine because Ironic is out.
        d.provision_state = "deploy failed";
        let ironic_out = Outages {
            ironic: true,
            ..Outages::default()
        };
        assert_eq!(expected_status(&d, ironic_out), "unknown");
        // In the maintenance pool, SLURM never listing the node: rule 7.
        let mut d = dev();
        enter_maintenance_pool(&mut d);
        d.slurm = None;
        assert_eq!(expected_status(&d, none), "quarantine");
    }

    #[test]
    fn custody_freezes_the_status_and_a_handover_waits_for_its_latch() {
        let none = Outages::default();
        let mut a = Activity::default();
        let mut d = dev();
        d.provision_state = "available";
        d.instance_uuid = None;
        d.customer_ready = true;
        d.maintenance = None;
        d.lessee = CUSTOMER_PROJECT;
        assert!(handover_eligible(&d));
        assert_eq!(expected_fabric(&d, OK).0, Tri::False);
        // A proper handover: a flip is asked for, custody waits.
        start_handover(&mut d, false, &mut a);
        let job = d.pending.clone().expect("a flip to verify");
        assert!(job.vrf.starts_with(CUSTOMER_VRF_PREFIX));
        assert_eq!(
            d.frontend_vrf, ISOLATE_VRF,
            "the switch moves it, not the engine"
        );
        assert_eq!(d.custody, None);
        assert_eq!(expected_status(&d, none), "available");
        let mut s = Scenario::new(1, &["s1".into()], 1);
        s.devices[0] = d;
        assert_eq!(s.flip_jobs(), vec![job.clone()]);
        // The workflow's revision applies on the leaf.
        s.apply_vrfs(&job.switch, &[(job.port.clone(), job.vrf.clone())])
            .unwrap();
        assert_eq!(expected_fabric(&s.devices[0], OK).0, Tri::True);
        s.flip_recorded(&job);
        let d = &s.devices[0];
        assert_eq!(d.custody, Some(Custody::GoogleOwned));
        assert_eq!(
            d.frontend_latch,
            Some(FrontendLatch::CustomerVrfFlipVerified)
        );
        assert_eq!(expected_status(d, none), "delegated");
        assert!(s.flip_jobs().is_empty());
        // No return before Borneo has reported the entry.
        let mut d = s.devices[0].clone();
        for roll in 0..100 {
            custody_step(&mut d, roll, &mut a);
        }
        assert_eq!(d.custody, Some(Custody::GoogleOwned));
        // Served: a return asks for the isolate; still delegated (frozen).
        d.custody_served = true;
        custody_step(&mut d, 0, &mut a);
        assert_eq!(d.custody, Some(Custody::PartnerOwned));
        assert!(d.frontend_vrf.starts_with(CUSTOMER_VRF_PREFIX));
        assert_eq!(
            d.pending.as_ref().map(|j| j.latch),
            Some(FrontendLatch::IsolateFlipVerified)
        );
        assert_eq!(expected_status(&d, none), "delegated");
        // A breach: custody at once, the hub's HandoverBreach expected.
        let mut b = dev();
        b.provision_state = "available";
        b.customer_ready = true;
        b.maintenance = None;
        b.lessee = CUSTOMER_PROJECT;
        b.instance_uuid = None;
        start_handover(&mut b, true, &mut a);
        assert_eq!(b.frontend_latch, Some(FrontendLatch::HandoverBreach));
        assert_eq!(b.frontend_vrf, ISOLATE_VRF);
        assert!(b.pending.is_none());
        assert_eq!(expected_status(&b, none), "delegated");
        // Drained overrides delegated.
        b.custody_served = true;
        custody_step(&mut b, 9, &mut a);
        assert_eq!(b.custody, Some(Custody::Drained));
        assert_eq!(expected_status(&b, none), "drained");
    }

    #[test]
    fn the_simulated_switches_and_nmx_m_take_writes() {
        let mut s = Scenario::new(40, &["s1".into()], 5);
        let d = s.devices[3].clone();
        let (fe, be) = (frontend_switch(&d.rack), backend_switch(&d.rack));
        s.apply_vrfs(&fe, &[(switch_port(&d), "cust-0003".into())])
            .unwrap();
        s.apply_vrfs(&be, &[(switch_port(&d), MAINTENANCE_VRF.into())])
            .unwrap();
        assert_eq!(s.devices[3].frontend_vrf, "cust-0003");
        assert_eq!(s.devices[3].backend_vrf, MAINTENANCE_VRF);
        assert!(s
            .apply_vrfs(&be, &[(switch_port(&d), "nope".into())])
            .is_err());
        assert!(s.apply_vrfs(&fe, &[("swp99".into(), "x".into())]).is_err());
        assert_eq!(s.by_name(&d.name).map(|x| x.index), Some(3));
        // A move: out of default, then into repair.
        let gpus = |d: &SimDevice| -> std::collections::BTreeSet<String> {
            (0..GPUS_PER_DEVICE)
                .map(|k| format!("GPU-{}-{k}", d.uuid))
                .collect()
        };
        s.devices[3].gpus_in_repair = 0;
        s.set_partition("s1", DEFAULT_PARTITION_ID, &Default::default());
        assert!(s.devices[3].gpus_released);
        s.set_partition("s1", REPAIR_PARTITION_ID, &gpus(&s.devices[3].clone()));
        assert_eq!(s.devices[3].gpus_in_repair, GPUS_PER_DEVICE);
        assert_eq!(expected_fabric(&s.devices[3], OK).2, Tri::True);
    }

    #[test]
    fn nvlink_and_backend_observations() {
        let mut d = dev();
        d.backend_vrf = MAINTENANCE_VRF;
        d.gpus_in_repair = GPUS_PER_DEVICE;
        assert_eq!(expected_fabric(&d, OK).1, Tri::True);
        assert_eq!(expected_fabric(&d, OK).2, Tri::True);
        d.gpus_in_repair = 3;
        assert_eq!(expected_fabric(&d, OK).2, Tri::Unknown);
        d.gpus_in_repair = 0;
        d.backend_vrf = TENANT_BACKEND_VRF;
        assert_eq!(expected_fabric(&d, OK).1, Tri::False);
        assert_eq!(expected_fabric(&d, OK).2, Tri::False);
        // Outages: only the plane (or NVLink) that cannot be read.
        assert_eq!(
            expected_fabric(&d, (false, true, false)),
            (Tri::False, Tri::Unknown, Tri::False)
        );
        assert_eq!(expected_fabric(&d, (false, false, true)).2, Tri::Unknown);
        let mut s = Scenario::new(100, &["s1".into(), "s2".into()], 3);
        s.outages.switch = Some((0, true));
        s.outages.nmx = Some(1);
        let (a, far) = (s.devices[1].clone(), s.devices[99].clone());
        assert_eq!(a.rack, s.devices[0].rack);
        assert_eq!(s.fabric_outage(&a), (true, false, false));
        assert_eq!(s.fabric_outage(&far), (false, false, true));
        assert!(s.switch_out(&a.rack, true) && !s.switch_out(&a.rack, false));
        assert!(s.nmx_out("s2") && !s.nmx_out("s1"));
        let truth = s.fabric_truth();
        let unknown_fe = truth
            .get(&("FrontendPortsObservedInCustomerVrf", Tri::Unknown))
            .copied()
            .unwrap_or(0);
        assert_eq!(unknown_fe, s.racks[&a.rack].len());
    }

    #[test]
    fn evolution_keeps_every_device_and_moves_the_distribution() {
        let mut s = Scenario::new(500, &["s1".into(), "s2".into()], 7);
        let before = s.distribution();
        assert_eq!(before.values().sum::<usize>(), 500);
        for _ in 0..50 {
            s.tick(0.02, true);
        }
        s.heal();
        let after = s.distribution();
        assert_eq!(after.values().sum::<usize>(), 500);
        assert_ne!(before, after);
        assert!(s.activity.deploys > 0 && s.activity.releases > 0);
        let names: std::collections::BTreeSet<_> = s.devices.iter().map(|d| &d.name).collect();
        assert_eq!(names.len(), 500);
        // Handovers under way and a breach or two from the start.
        assert!(s.activity.breaches > 0, "{:?}", s.activity);
        assert!(!s.flip_jobs().is_empty());
        let ports: std::collections::BTreeSet<_> = s
            .devices
            .iter()
            .map(|d| (frontend_switch(&d.rack), switch_port(d)))
            .collect();
        assert_eq!(ports.len(), 500, "one switch port per device");
    }
}
