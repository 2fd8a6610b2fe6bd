//! Ironic provision states (seed 002, "Ironic provision state"). The mirror
//! is stored as a plain string; this is the closed set the API enforces.

/// Every Ironic provision state value as the API reports it.
pub const STATES: &[&str] = &[
    "enroll",
    "verifying",
    "manageable",
    "inspecting",
    "inspect wait",
    "inspect failed",
    "cleaning",
    "clean wait",
    "clean failed",
    "available",
    "deploying",
    "wait call-back",
    "deploy failed",
    "active",
    "deleting",
    "deleted",
    "error",
    "rebuild",
    "rescuing",
    "rescue wait",
    "rescue failed",
    "rescue",
    "unrescuing",
    "unrescue failed",
    "adopting",
    "adopt failed",
    "servicing",
    "service wait",
    "service failed",
    "unservicing",
];

/// "Failure states (map to operational_status=failed)".
pub const FAILURE_STATES: &[&str] = &[
    "deploy failed",
    "clean failed",
    "inspect failed",
    "rescue failed",
    "unrescue failed",
    "adopt failed",
    "service failed",
    "error",
];

pub fn is_known(state: &str) -> bool {
    STATES.contains(&state)
}

pub fn is_failure(state: &str) -> bool {
    FAILURE_STATES.contains(&state)
}

/// The `IronicProvisionHealthy` False reason: the state in CamelCase
/// (`deploy failed` -> `DeployFailed`).
pub fn reason(state: &str) -> String {
    state
        .split([' ', '-', '_'])
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_subset() {
        for s in FAILURE_STATES {
            assert!(is_known(s), "{s}");
        }
        assert!(is_failure("deploy failed"));
        assert!(!is_failure("active"));
        assert_eq!(reason("deploy failed"), "DeployFailed");
        assert_eq!(reason("error"), "Error");
    }
}
