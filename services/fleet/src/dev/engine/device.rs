//! The simulated machines: what each external system holds about one
//! device, the fleet-wide outages, and the activity counters.

/// The customer project and the maintenance (SLURM) project of every site.
pub const CUSTOMER_PROJECT: &str = "c0ffee00-customer-project";
pub const MAINTENANCE_PROJECT: &str = "5eed0000-slurm-project";
/// Where an enrolled node that is not imaged is leased at a site with Nova
/// (the Nova arm of Image and Unimage moves the lease from and back to it).
pub const ENROL_PROJECT: &str = "e1201000-enrol-project";
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
pub(super) const FAILURE_STATES: [&str; 2] = ["deploy failed", "clean failed"];

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
    pub(super) fn healthy(self) -> bool {
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
    /// Its other GPUs were taken out of the default partition (a repair
    /// move's first partition update): NMX-M lists them in no partition.
    pub gpus_released: bool,
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
    /// A handover or return whose front-end flip waits for the workflow
    /// service's job to apply, verify and record it.
    pub pending: Option<FlipJob>,
    /// Times the partner rotated the returned credential.
    pub credential_rotation: u32,
    /// A simulated node agent runs on the device.
    pub has_agent: bool,
    /// The resource provider's generation: every trait write bumps it.
    pub placement_generation: i64,
    /// The scenario wants its session open (false: the agent closed it,
    /// a reboot or an agent upgrade).
    pub agent_wanted: bool,
    /// What the agent did last: `Some(true)` opened a session the gateway
    /// accepted, `Some(false)` closed it; `None` never opened one.
    pub agent_session: Option<bool>,
    /// What Ironic keeps of the deploy a workflow bound (`instance_info`).
    pub instance_info: Option<serde_json::Value>,
    /// When the last inspection Ironic ran on the node finished.
    pub inspection_finished_at: Option<chrono::DateTime<chrono::Utc>>,
    /// A workflow has written to the node through the simulated Ironic:
    /// from then on the device is the operator's, and the scenario's own
    /// lifecycle leaves it alone (the ground truth still follows it).
    pub operated: bool,
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

/// A front-end flip the handover waits for: a `frontend_vrf_return` (into
/// the customer VRF) or `frontend_vrf_isolate` job of the workflow service
/// moves the port on the simulated switch, reads it back and records the
/// latch; custody moves only then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlipJob {
    pub index: usize,
    pub site: String,
    pub name: String,
    pub switch: String,
    pub port: String,
    /// The VRF the flip moves the port into.
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
