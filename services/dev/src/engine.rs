//! The scenario engine: one fleet of simulated machines, the state of each
//! external system about them (NetBox, Ironic, Placement, SLURM), the
//! evolution of that state, and the ground truth derived from it by the
//! rules of `spec/conditions.md`, written here again on purpose (never
//! `fleet_domain::derivation`) so the hub's derivation has an independent
//! check.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The customer project and the maintenance (SLURM) project of every site.
pub const CUSTOMER_PROJECT: &str = "c0ffee00-customer-project";
pub const MAINTENANCE_PROJECT: &str = "5eed0000-slurm-project";
pub const CUSTOMER_READY_TRAIT: &str = "CUSTOM_CUSTOMER_READY";

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
}

/// Which source is out (answers 503) right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outages {
    pub ironic: bool,
    pub slurm: bool,
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
}

pub struct Scenario {
    pub sites: Vec<String>,
    pub devices: Vec<SimDevice>,
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
                d
            })
            .collect();
        Scenario {
            sites: sites.to_vec(),
            devices,
            outages: Outages::default(),
            outage_ticks_left: 0,
            activity: Activity::default(),
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
            if self.rng.gen_bool(0.5) {
                self.outages.ironic = true;
            } else {
                self.outages.slurm = true;
            }
        }
        let n = self.devices.len();
        if n == 0 {
            return;
        }
        let changes = ((n as f64 * rate).ceil() as usize).max(1);
        for _ in 0..changes {
            let i = self.rng.gen_range(0..n);
            let roll = self.rng.gen_range(0..100);
            let a = &mut self.activity;
            let d = &mut self.devices[i];
            step(d, roll, a);
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
            ironic: false,
        };
        assert_eq!(expected_status(&d, slurm_out), "validation");
        // Never failed or quarantine because Ironic is out.
        d.provision_state = "deploy failed";
        let ironic_out = Outages {
            ironic: true,
            slurm: false,
        };
        assert_eq!(expected_status(&d, ironic_out), "unknown");
        // In the maintenance pool, SLURM never listing the node: rule 7.
        let mut d = dev();
        enter_maintenance_pool(&mut d);
        d.slurm = None;
        assert_eq!(expected_status(&d, none), "quarantine");
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
    }
}
