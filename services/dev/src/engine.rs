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

/// The customer project and the maintenance (SLURM) project of every site.
pub const CUSTOMER_PROJECT: &str = "c0ffee00-customer-project";
pub const MAINTENANCE_PROJECT: &str = "5eed0000-slurm-project";
pub const CUSTOMER_READY_TRAIT: &str = "CUSTOM_CUSTOMER_READY";

/// The VRF an idle front-end port sits in, and the prefix of customer VRFs
/// (`connectors.fabric.sites.<s>.customer_vrfs = ["cust-*"]`).
pub const ISOLATE_VRF: &str = "isolate";
pub const CUSTOMER_VRF_PREFIX: &str = "cust-";
/// The back-end VRFs: the tenant's and the maintenance VRF.
pub const TENANT_BACKEND_VRF: &str = "tenant-be";
pub const MAINTENANCE_VRF: &str = "maint";
/// NMX-M: the repair partition, and the partition GPUs are in otherwise.
pub const REPAIR_PARTITION: &str = "repair";
pub const REPAIR_PARTITION_ID: u32 = 7;
pub const DEFAULT_PARTITION_ID: u32 = 1;
pub const GPUS_PER_DEVICE: u8 = 8;
/// Devices per rack; each rack has one front-end and one back-end leaf.
pub const RACK_SIZE: usize = 32;

/// Ironic provision states that are failures (what `IronicProvisionHealthy
/// = False` means); the engine produces only these two.
const FAILURE_STATES: [&str; 2] = ["deploy failed", "clean failed"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SlurmState {
    Idle,
    Drain,
    Down,
}

impl SlurmState {
    /// The v0.0.38 `state` and `state_flags` of a node.
    pub fn wire(self) -> (&'static str, &'static [&'static str]) {
        match self {
            SlurmState::Idle => ("idle", &[]),
            SlurmState::Drain => ("idle", &["DRAIN"]),
            SlurmState::Down => ("down", &[]),
        }
    }
    fn healthy(self) -> bool {
        self == SlurmState::Idle
    }
}

/// One machine as the external systems see it.
#[derive(Debug, Clone)]
pub struct SimDevice {
    pub index: usize,
    pub name: String,
    pub site: String,
    pub rack: String,
    pub serial: String,
    pub netbox_id: i64,
    pub uuid: String,
    pub provision_state: &'static str,
    pub maintenance: Option<String>,
    pub instance_uuid: Option<String>,
    pub lessee: &'static str,
    /// The Placement resource provider carries the customer-ready trait.
    pub customer_ready: bool,
    /// `None`: slurmrestd does not list the node.
    pub slurm: Option<SlurmState>,
    /// The `chassis_health` reading: 0 Ok, 1 Warning, 2 Critical.
    pub health: u8,
    /// The VRF the device's front-end port (`eth0` on its rack's front-end
    /// leaf) is in on the switch.
    pub frontend_vrf: String,
    /// The VRF of its back-end port (`ens1f0` on the back-end leaf).
    pub backend_vrf: &'static str,
    /// How many of its GPUs NMX-M has in the repair partition.
    pub gpus_in_repair: u8,
    /// What Borneo lists for it (`None`: not listed).
    pub custody: Option<Custody>,
    /// The latch `FrontendPortsInCustomerVrf` as it should be on record.
    pub frontend_latch: Option<FrontendLatch>,
    /// The hub has put (or will put, at Borneo's next read) the device in
    /// custody: `delegated` from then on, frozen (`conditions.md`, holds).
    pub delegated: bool,
    /// Borneo reported it `DRAINED`: `drained` from then on, frozen.
    pub drained: bool,
    /// Borneo has answered a read with the device `GOOGLE_OWNED`, so the
    /// hub has seen the custody entry; only then may it come back.
    pub custody_served: bool,
    /// A handover or return whose front-end flip waits for the simulated
    /// workflow to verify it and write the latch.
    pub pending: Option<FlipJob>,
    /// Times the partner rotated the returned credential.
    pub credential_rotation: u32,
    /// A simulated node agent runs on the device.
    pub has_agent: bool,
    /// The scenario wants its session open (false: the agent closed it,
    /// a reboot or an agent upgrade).
    pub agent_wanted: bool,
    /// What the agent did last: `Some(true)` opened a session the gateway
    /// accepted, `Some(false)` closed it; `None` never opened one.
    pub agent_session: Option<bool>,
}

/// The Borneo custody states the simulated partner reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Custody {
    GoogleOwned,
    PartnerOwned,
    Drained,
}

impl Custody {
    pub fn wire(self) -> &'static str {
        match self {
            Custody::GoogleOwned => "GOOGLE_OWNED",
            Custody::PartnerOwned => "PARTNER_OWNED",
            Custody::Drained => "DRAINED",
        }
    }
}

/// `FrontendPortsInCustomerVrf` as the scenario expects it on record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FrontendLatch {
    /// True `CustomerVrfFlipVerified`.
    CustomerVrfFlipVerified,
    /// False `IsolateFlipVerified`.
    IsolateFlipVerified,
    /// Unknown `HandoverBreach`: custody entry with no verified flip.
    HandoverBreach,
}

impl FrontendLatch {
    pub fn reason(self) -> &'static str {
        match self {
            FrontendLatch::CustomerVrfFlipVerified => "CustomerVrfFlipVerified",
            FrontendLatch::IsolateFlipVerified => "IsolateFlipVerified",
            FrontendLatch::HandoverBreach => "HandoverBreach",
        }
    }
}

/// A front-end flip the switch has applied and the simulated handover
/// workflow must read back and record as a latch before custody moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlipJob {
    pub index: usize,
    pub site: String,
    pub name: String,
    pub switch: String,
    pub port: String,
    /// The VRF the port must read back in.
    pub vrf: String,
    /// The latch to write once verified.
    pub latch: FrontendLatch,
}

/// The tri-state of an observation condition, as the ground truth has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tri {
    True,
    False,
    Unknown,
}

impl Tri {
    pub fn as_str(self) -> &'static str {
        match self {
            Tri::True => "True",
            Tri::False => "False",
            Tri::Unknown => "Unknown",
        }
    }
}

/// Which source is out (answers 503) right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outages {
    pub ironic: bool,
    pub slurm: bool,
    /// One leaf switch's NVUE: the rack of this device index, front-end
    /// (`true`) or back-end.
    pub switch: Option<(usize, bool)>,
    /// One site's NMX-M, by its position in `sites`.
    pub nmx: Option<usize>,
}

/// The front-end and back-end leaf names of a rack, and a device's port
/// on each (`swp1` ... `swp32`; `swp31`/`swp32` of a full rack are
/// devices too: uplinks are `swp49`/`swp50`).
pub fn frontend_switch(rack: &str) -> String {
    format!("fe-{rack}")
}
pub fn backend_switch(rack: &str) -> String {
    format!("be-{rack}")
}
pub fn switch_port(d: &SimDevice) -> String {
    format!("swp{}", d.index % RACK_SIZE + 1)
}

/// Counters of what the engine did, for the summary.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    pub ticks: u64,
    pub deploys: u64,
    pub releases: u64,
    pub ironic_failures: u64,
    pub repairs: u64,
    pub maintenance: u64,
    pub slurm_drains: u64,
    pub slurm_downs: u64,
    pub validated: u64,
    pub outages: u64,
    pub health_changes: u64,
    /// Handovers to the partner with a verified front-end flip.
    pub handovers: u64,
    /// Custody entries without a flip, on purpose (`HandoverBreach`).
    pub breaches: u64,
    pub returns: u64,
    pub drains: u64,
    pub vrf_flips: u64,
    pub nvlink_moves: u64,
    /// Latch writes by the simulated handover workflow, and failures.
    pub latch_writes: u64,
    pub latch_failures: u64,
    /// Agent sessions the scenario closed and reopened.
    pub agent_closes: u64,
    pub agent_reopens: u64,
}

pub struct Scenario {
    pub sites: Vec<String>,
    pub devices: Vec<SimDevice>,
    /// Device indices per rack (racks never change).
    pub racks: BTreeMap<String, Vec<usize>>,
    pub outages: Outages,
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
                    custody: None,
                    frontend_latch: None,
                    delegated: false,
                    drained: false,
                    custody_served: false,
                    pending: None,
                    credential_rotation: 0,
                    has_agent: false,
                    agent_wanted: true,
                    agent_session: None,
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
        Scenario {
            sites: sites.to_vec(),
            devices,
            racks,
            outages: Outages::default(),
            outage_ticks_left: 0,
            activity,
            rng,
        }
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
            if d.custody.is_some() || d.pending.is_some() {
                // With the partner, or mid-handover: only custody moves.
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

    /// The front-end flips waiting for the simulated workflow.
    pub fn flip_jobs(&self) -> Vec<FlipJob> {
        self.devices
            .iter()
            .filter_map(|d| d.pending.clone())
            .collect()
    }

    /// The workflow read the flip back and the hub recorded its latch:
    /// custody moves (a handover enters `GOOGLE_OWNED`, a return is done).
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

/// Handed over: a customer-ready device nothing runs on, not in custody.
fn handover_eligible(d: &SimDevice) -> bool {
    d.provision_state == "available"
        && d.customer_ready
        && d.maintenance.is_none()
        && d.lessee == CUSTOMER_PROJECT
        && d.custody.is_none()
        && d.pending.is_none()
        && !d.delegated
}

/// A handover to the partner. A proper one flips the front-end port into
/// the device's customer VRF on the switch and waits for the workflow to
/// verify and record it; `breach` hands the device over with no flip.
fn start_handover(d: &mut SimDevice, breach: bool, a: &mut Activity) {
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
    d.frontend_vrf = format!("{CUSTOMER_VRF_PREFIX}{:04}", d.index % 10_000);
    d.pending = Some(FlipJob {
        index: d.index,
        site: d.site.clone(),
        name: d.name.clone(),
        switch: frontend_switch(&d.rack),
        port: switch_port(d),
        vrf: d.frontend_vrf.clone(),
        latch: FrontendLatch::CustomerVrfFlipVerified,
    });
}

fn enter_custody(d: &mut SimDevice) {
    d.custody = Some(Custody::GoogleOwned);
    d.delegated = true;
    d.custody_served = false;
}

/// A device with the partner: it comes back (`PARTNER_OWNED`, the
/// front-end flipped back to isolate and recorded) or is drained, but only
/// after Borneo has reported the custody entry to the hub.
fn custody_step(d: &mut SimDevice, roll: u32, a: &mut Activity) {
    if d.pending.is_some() {
        return;
    }
    match d.custody {
        Some(Custody::GoogleOwned) if d.custody_served && roll < 8 => {
            d.custody = Some(Custody::PartnerOwned);
            a.returns += 1;
            if d.frontend_latch == Some(FrontendLatch::CustomerVrfFlipVerified) {
                d.frontend_vrf = ISOLATE_VRF.into();
                d.pending = Some(FlipJob {
                    index: d.index,
                    site: d.site.clone(),
                    name: d.name.clone(),
                    switch: frontend_switch(&d.rack),
                    port: switch_port(d),
                    vrf: ISOLATE_VRF.into(),
                    latch: FrontendLatch::IsolateFlipVerified,
                });
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
fn fabric_step(d: &mut SimDevice, roll: u32, a: &mut Activity) {
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

fn expected_fabric_live(d: &SimDevice) -> (Tri, Tri, Tri) {
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

fn enter_maintenance_pool(d: &mut SimDevice) {
    d.lessee = MAINTENANCE_PROJECT;
    d.provision_state = "manageable";
    d.instance_uuid = None;
    d.customer_ready = false;
    d.slurm = Some(SlurmState::Idle);
}

/// One change to one device, chosen by `roll` (0..100) among those its
/// current state allows.
fn step(d: &mut SimDevice, roll: u32, a: &mut Activity) {
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

/// One device's expected derived axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub operational: &'static str,
    pub health: &'static str,
    pub connectivity: &'static str,
}

/// `connected` while the device's agent has its session open,
/// `disconnected` otherwise (closed, or never opened: the default).
pub fn expected_connectivity(d: &SimDevice) -> &'static str {
    if d.agent_session == Some(true) {
        "connected"
    } else {
        "disconnected"
    }
}

/// The health status `spec/conditions.md` derives from the
/// `chassis_health` series the simulated Prometheus serves.
pub fn expected_health(d: &SimDevice) -> &'static str {
    match d.health {
        0 => "healthy",
        1 => "degraded",
        _ => "critical",
    }
}

/// The operational status `spec/conditions.md` derives from what the
/// connectors read of this device: the conditions each source reports,
/// then the ordered rules. Written from the spec, not from the hub.
pub fn expected_status(d: &SimDevice, outages: Outages) -> &'static str {
    // Custody holds freeze the status whatever the conditions say:
    // `DRAINED` drained, `GOOGLE_OWNED` delegated; `PARTNER_OWNED` changes
    // nothing, so a returned device stays as it was.
    if d.drained {
        return "drained";
    }
    if d.delegated {
        return "delegated";
    }
    #[derive(Clone, Copy, PartialEq)]
    enum C {
        True,
        False,
        Unknown,
        /// Unknown because the source could not be read after having
        /// reported the device (SchedulerUnreachable): "lost from sight".
        Lost,
    }
    let b = |v: bool| if v { C::True } else { C::False };
    let (provision_healthy, maintenance, available, allocated, ready, maint_pool) =
        if outages.ironic {
            // The outage rule: every openstack condition Unknown.
            (
                C::Unknown,
                C::Unknown,
                C::Unknown,
                C::Unknown,
                C::Unknown,
                C::Unknown,
            )
        } else {
            (
                b(!FAILURE_STATES.contains(&d.provision_state)),
                b(d.maintenance.is_some()),
                b(d.provision_state == "available"),
                b(d.instance_uuid.is_some()),
                b(d.customer_ready),
                b(d.lessee == MAINTENANCE_PROJECT),
            )
        };
    // A node SLURM does not list (and, in this scenario, never listed while
    // in the maintenance pool) has no SLURM rows that matter.
    let (registered, node_healthy) = match (d.slurm, outages.slurm) {
        (Some(_), true) => (C::Lost, C::Lost),
        (Some(s), false) => (C::True, b(s.healthy())),
        (None, _) => (C::Unknown, C::Unknown),
    };
    if provision_healthy == C::False {
        return "failed";
    }
    if maintenance == C::True {
        return "quarantine";
    }
    if ready == C::True && allocated == C::True {
        return "in_use";
    }
    if ready == C::True && allocated == C::False && available == C::True {
        return "available";
    }
    if maint_pool == C::True {
        if node_healthy == C::False || registered == C::False {
            return "quarantine";
        }
        let ok = |c: C| c == C::True || c == C::Lost;
        if ok(registered) && ok(node_healthy) {
            return "validation";
        }
        return "quarantine";
    }
    if ready == C::False {
        return "quarantine";
    }
    "unknown"
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
        // A proper handover: the port is flipped, custody waits.
        start_handover(&mut d, false, &mut a);
        let job = d.pending.clone().expect("a flip to verify");
        assert_eq!(job.vrf, d.frontend_vrf);
        assert!(job.vrf.starts_with(CUSTOMER_VRF_PREFIX));
        assert_eq!(d.custody, None);
        assert_eq!(expected_status(&d, none), "available");
        assert_eq!(expected_fabric(&d, OK).0, Tri::True);
        let mut s = Scenario::new(1, &["s1".into()], 1);
        s.devices[0] = d;
        assert_eq!(s.flip_jobs(), vec![job.clone()]);
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
        // Served: a return flips back to isolate; still delegated (frozen).
        d.custody_served = true;
        custody_step(&mut d, 0, &mut a);
        assert_eq!(d.custody, Some(Custody::PartnerOwned));
        assert_eq!(d.frontend_vrf, ISOLATE_VRF);
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
