//! The gateway's decisions, pure: which commands exist and which a device
//! may receive, who gets platform secrets, and acceptance (inventory
//! against the pool's hardware profile).

use fleet_domain::{ConditionStatus, Trust};

/// The commands relayed to a node agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentCommandKind {
    InventoryRefresh,
    DiagNvml,
    LogsCollect,
    GpuReset,
    NodeReboot,
}

impl AgentCommandKind {
    pub const ALL: [AgentCommandKind; 5] = [
        Self::InventoryRefresh,
        Self::DiagNvml,
        Self::LogsCollect,
        Self::GpuReset,
        Self::NodeReboot,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InventoryRefresh => "inventory.refresh",
            Self::DiagNvml => "diag.nvml",
            Self::LogsCollect => "logs.collect",
            Self::GpuReset => "gpu.reset",
            Self::NodeReboot => "node.reboot",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Destructive platform commands: never sent to a tenant-controlled
    /// device.
    pub fn destructive(self) -> bool {
        matches!(self, Self::GpuReset | Self::NodeReboot)
    }
}

/// Why a command is not relayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

/// Better Compute: "the gateway never sends [a tenant-controlled node]
/// platform secrets or destructive platform commands".
pub fn may_relay(trust: Trust, command: AgentCommandKind) -> Result<(), Refusal> {
    if trust == Trust::TenantControlled && command.destructive() {
        return Err(Refusal(format!(
            "{} is a destructive platform command and the device is tenant-controlled",
            command.as_str()
        )));
    }
    Ok(())
}

/// Whether platform secrets (break-glass keys, ...) go to this device.
pub fn gets_platform_secrets(trust: Trust) -> bool {
    trust != Trust::TenantControlled
}

/// What an accepted machine of a pool has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub gpu_count: u32,
    /// Empty: any model.
    pub gpu_model: String,
}

/// What the agent reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    pub gpu_count: u32,
    pub gpu_model: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acceptance {
    /// Inventory matches the profile: the device may be adopted.
    Accept,
    /// Fewer GPUs than the profile: `GpuCountMismatch` True.
    GpuCountBelow { reported: u32, expected: u32 },
    /// Another difference: not adopted, nothing asserted beyond the GPU count.
    Mismatch(String),
    /// The pool has no hardware profile: acceptance cannot pass.
    NoProfile,
}

fn norm_model(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_ascii_lowercase()
}

pub fn acceptance(inv: &Inventory, profile: Option<&Profile>) -> Acceptance {
    let Some(p) = profile else {
        return Acceptance::NoProfile;
    };
    if inv.gpu_count < p.gpu_count {
        return Acceptance::GpuCountBelow {
            reported: inv.gpu_count,
            expected: p.gpu_count,
        };
    }
    if inv.gpu_count > p.gpu_count {
        return Acceptance::Mismatch(format!(
            "{} GPUs reported, the profile has {}",
            inv.gpu_count, p.gpu_count
        ));
    }
    if !p.gpu_model.trim().is_empty() && norm_model(&inv.gpu_model) != norm_model(&p.gpu_model) {
        return Acceptance::Mismatch(format!(
            "GPU model {:?} reported, the profile has {:?}",
            inv.gpu_model, p.gpu_model
        ));
    }
    Acceptance::Accept
}

/// The `GpuCountMismatch` condition the gateway asserts: True when the
/// inventory reports fewer GPUs than the profile; `None` without a profile.
pub fn gpu_count_mismatch(
    inv: &Inventory,
    profile: Option<&Profile>,
) -> Option<(ConditionStatus, String, String)> {
    let p = profile?;
    Some(if inv.gpu_count < p.gpu_count {
        (
            ConditionStatus::True,
            "GpuCountBelowProfile".into(),
            format!(
                "{} GPUs reported, the hardware profile has {}",
                inv.gpu_count, p.gpu_count
            ),
        )
    } else {
        (
            ConditionStatus::False,
            "GpuCountMatchesProfile".into(),
            format!(
                "{} GPUs reported, the hardware profile has {}",
                inv.gpu_count, p.gpu_count
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_controlled_devices_never_get_destructive_commands_or_secrets() {
        // (trust, command, relayed)
        for trust in Trust::ALL {
            for c in AgentCommandKind::ALL {
                let expect = !(*trust == Trust::TenantControlled && c.destructive());
                assert_eq!(
                    may_relay(*trust, c).is_ok(),
                    expect,
                    "{trust} {}",
                    c.as_str()
                );
            }
        }
        assert!(!gets_platform_secrets(Trust::TenantControlled));
        assert!(gets_platform_secrets(Trust::Platform));
        assert!(gets_platform_secrets(Trust::TenantOwned));
        assert_eq!(
            AgentCommandKind::parse("gpu.reset"),
            Some(AgentCommandKind::GpuReset)
        );
        assert_eq!(AgentCommandKind::parse("rm -rf"), None);
    }

    #[test]
    fn acceptance_compares_inventory_with_the_profile() {
        let p = Profile {
            gpu_count: 8,
            gpu_model: "NVIDIA H100 80GB HBM3".into(),
        };
        let inv = |n: u32, m: &str| Inventory {
            gpu_count: n,
            gpu_model: m.into(),
        };
        // (inventory, acceptance, GpuCountMismatch)
        let cases = [
            (
                inv(8, "NVIDIA H100 80GB HBM3"),
                Acceptance::Accept,
                Some(ConditionStatus::False),
            ),
            (
                inv(8, "nvidia  h100 80gb hbm3"),
                Acceptance::Accept,
                Some(ConditionStatus::False),
            ),
            (
                inv(7, "NVIDIA H100 80GB HBM3"),
                Acceptance::GpuCountBelow {
                    reported: 7,
                    expected: 8,
                },
                Some(ConditionStatus::True),
            ),
            (
                inv(0, ""),
                Acceptance::GpuCountBelow {
                    reported: 0,
                    expected: 8,
                },
                Some(ConditionStatus::True),
            ),
        ];
        for (i, want, cond) in cases {
            assert_eq!(acceptance(&i, Some(&p)), want, "{i:?}");
            assert_eq!(gpu_count_mismatch(&i, Some(&p)).map(|c| c.0), cond, "{i:?}");
        }
        assert!(matches!(
            acceptance(&inv(9, "NVIDIA H100 80GB HBM3"), Some(&p)),
            Acceptance::Mismatch(_)
        ));
        assert!(matches!(
            acceptance(&inv(8, "NVIDIA A100"), Some(&p)),
            Acceptance::Mismatch(_)
        ));
        assert_eq!(acceptance(&inv(8, "x"), None), Acceptance::NoProfile);
        assert_eq!(gpu_count_mismatch(&inv(8, "x"), None), None);
        let any_model = Profile {
            gpu_count: 4,
            gpu_model: String::new(),
        };
        assert_eq!(
            acceptance(&inv(4, "whatever"), Some(&any_model)),
            Acceptance::Accept
        );
    }
}
