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

/// Unimage Node's refusal of a node in a failure state, either arm: "A
/// bound DEPLOYFAIL is admitted"; `clean failed` with the node's
/// `last_error`; any other failure state by name.
pub fn teardown_failure(
    uuid: &str,
    state: &str,
    last_error: Option<&str>,
) -> Option<(crate::failure::FailureCode, String)> {
    use crate::failure::FailureCode as F;
    match state {
        "deploy failed" => None,
        "clean failed" => Some((
            F::IronicCleaningFailed,
            format!(
                "node {uuid} failed cleaning: {}",
                last_error.unwrap_or("no last_error")
            ),
        )),
        s if is_failure(s) => Some((
            F::IronicFailureState,
            format!("node {uuid} is in the failure state {s}"),
        )),
        _ => None,
    }
}

/// Image Node's refusal of a node in a failure state, either arm (seed 002:
/// "Image admission ... rejects every Ironic failure state"; "DEPLOYFAIL
/// fails closed"): `deploy failed` with the node's `last_error`, any other
/// failure state by name.
pub fn image_failure(
    uuid: &str,
    state: &str,
    last_error: Option<&str>,
) -> Option<(crate::failure::FailureCode, String)> {
    use crate::failure::FailureCode as F;
    if state == "deploy failed" {
        return Some((
            F::IronicDeployFailed,
            format!(
                "node {uuid} reached deploy failed: {}",
                last_error.unwrap_or("no last_error")
            ),
        ));
    }
    is_failure(state).then(|| {
        (
            F::IronicFailureState,
            format!("node {uuid} is in the failure state {state}"),
        )
    })
}

/// Whether a node already shows the provision action `target` (the verb
/// of `PUT /v1/nodes/{ident}/states/provision`): moving towards what the
/// action leads to, or in a state the action passes through or ends in.
/// A workflow asks this when Ironic refuses its request: a request whose
/// outcome it never learnt (a timeout, a worker killed after sending) may
/// have been carried out already, and a node that shows it is not a
/// refusal of this run but its own write ("never repeats a write the
/// system already shows"). The next read decides what follows.
pub fn shows_action(target: &str, provision_state: &str, target_provision_state: &str) -> bool {
    let (leads_to, passes): (&str, &[&str]) = match target {
        "active" => (
            "active",
            &["deploying", "wait call-back", "deploy hold", "active"],
        ),
        "deleted" => (
            "available",
            &[
                "deleting",
                "deleted",
                "cleaning",
                "clean wait",
                "clean hold",
                "available",
            ],
        ),
        "provide" => (
            "available",
            &["cleaning", "clean wait", "clean hold", "available"],
        ),
        "manage" => ("manageable", &["verifying", "manageable"]),
        "inspect" => ("manageable", &["inspecting", "inspect wait"]),
        _ => return false,
    };
    target_provision_state == leads_to
        || (target_provision_state.is_empty() && passes.contains(&provision_state))
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

    #[test]
    fn a_refused_request_the_node_already_shows() {
        // (target, provision_state, target_provision_state, shows)
        let table = [
            // A deploy that went through before the run learnt it did.
            ("active", "deploying", "active", true),
            ("active", "wait call-back", "active", true),
            ("active", "active", "", true),
            // Still available and at rest: the refusal is real.
            ("active", "available", "", false),
            ("active", "manageable", "", false),
            // Being torn down is not a deploy.
            ("active", "deleting", "available", false),
            ("deleted", "deleting", "available", true),
            ("deleted", "cleaning", "available", true),
            ("deleted", "available", "", true),
            ("deleted", "active", "", false),
            ("deleted", "deploy failed", "", false),
            ("provide", "cleaning", "available", true),
            ("provide", "available", "", true),
            ("provide", "manageable", "", false),
            ("manage", "verifying", "manageable", true),
            ("manage", "manageable", "", true),
            ("manage", "enroll", "", false),
            ("inspect", "inspecting", "manageable", true),
            ("inspect", "inspect wait", "manageable", true),
            // An inspection that already ended is not shown: manageable
            // at rest is also where it starts.
            ("inspect", "manageable", "", false),
            ("rebuild", "active", "", false),
        ];
        for (target, state, moving, shows) in table {
            assert_eq!(
                shows_action(target, state, moving),
                shows,
                "{target} on {state} -> {moving:?}"
            );
        }
    }
}
