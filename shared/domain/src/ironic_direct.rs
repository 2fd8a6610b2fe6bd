//! The Ironic-direct arm of Image Node and Unimage Node (seed 002, ADR-0042:
//! a standalone-Ironic site, `placement_enabled = false`, no Nova, no
//! Placement). Pure: the workflow service reads the node from Ironic, asks
//! [`image_next`] or [`unimage_next`] what to do, does it, reads the node
//! again. Every decision is taken on a fresh read of the node, so a worker
//! killed between two writes resumes by reading, never by repeating a write
//! the node already shows.

use crate::failure::FailureCode;
use crate::ironic::{image_failure, is_failure, teardown_failure};

/// What a workflow reads of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeView<'a> {
    pub uuid: &'a str,
    pub provision_state: &'a str,
    /// Empty when no transition is in flight.
    pub target_provision_state: &'a str,
    pub maintenance: bool,
    pub instance_uuid: Option<&'a str>,
    pub last_error: Option<&'a str>,
}

/// The next move of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Mint a new `instance_uuid` and pin it in the run before any write
    /// ("Fleet Manager mints the instance_uuid itself").
    Mint,
    /// Write the pinned `instance_uuid` and the site's image into the node.
    Bind,
    /// Ask Ironic for `target`; the node then moves on its own.
    Provision {
        target: &'static str,
    },
    /// Clear the binding (`instance_uuid`, `instance_info`), guarded on the
    /// observed uuid.
    ClearBinding {
        observed: String,
    },
    /// Ironic is moving the node: read it again later.
    Wait,
    /// The run adopts the node's in-flight binding as its own (a node found
    /// mid-deploy), then reads again.
    Adopt {
        instance_uuid: String,
    },
    Done,
    Fail(FailureCode, String),
}

fn fail(code: FailureCode, message: String) -> Next {
    Next::Fail(code, message)
}

/// States Ironic is in while it deploys.
const DEPLOYING: &[&str] = &["deploying", "wait call-back", "deploy hold"];
/// "A node already tearing down (DELETING/CLEANING/CLEANWAIT/DELETED) is
/// not re-fired"; a cleaning hold is part of the same teardown.
const TEARING_DOWN: &[&str] = &[
    "deleting",
    "deleted",
    "cleaning",
    "clean wait",
    "clean hold",
];

fn in_flight(n: &NodeView<'_>) -> bool {
    !n.target_provision_state.is_empty()
}

/// Image Node, Ironic-direct. `pinned`: the `instance_uuid` this run
/// minted (or adopted) so far.
///
/// - "Image admission requires authoritative maintenance=false and rejects
///   every Ironic failure state";
/// - "A fresh execution mints a new instance_uuid; a node found mid-deploy
///   recovers its in-flight binding, but an idle AVAILABLE node still
///   carrying a prior instance_uuid is rejected for cleanup rather than
///   adopted";
/// - "DEPLOYFAIL fails closed".
pub fn image_next(node: &NodeView<'_>, pinned: Option<&str>) -> Next {
    let state = node.provision_state;
    if let Some((code, message)) = image_failure(node.uuid, state, node.last_error) {
        return fail(code, message);
    }
    let ours = |u: &str| pinned == Some(u);
    match state {
        "active" if !in_flight(node) => match node.instance_uuid {
            Some(u) if ours(u) => Next::Done,
            Some(u) => fail(
                FailureCode::IronicNodeNotAvailable,
                format!("node {} is already deployed with instance {u}", node.uuid),
            ),
            None => fail(
                FailureCode::IronicNodeNotAvailable,
                format!("node {} is active without an instance", node.uuid),
            ),
        },
        s if DEPLOYING.contains(&s) || (s == "active" && in_flight(node)) => {
            match (node.instance_uuid, pinned) {
                (Some(u), Some(_)) if ours(u) => Next::Wait,
                (Some(u), None) => Next::Adopt {
                    instance_uuid: u.to_string(),
                },
                (Some(u), Some(p)) => fail(
                    FailureCode::IronicInstanceMismatch,
                    format!(
                        "node {} is deploying instance {u}, not this run's {p}",
                        node.uuid
                    ),
                ),
                (None, _) => fail(
                    FailureCode::IronicInstanceMismatch,
                    format!("node {} is deploying without an instance_uuid", node.uuid),
                ),
            }
        }
        "available" if !in_flight(node) => {
            if node.maintenance {
                return fail(
                    FailureCode::IronicNodeInMaintenance,
                    format!("node {} is in maintenance", node.uuid),
                );
            }
            match (node.instance_uuid, pinned) {
                (None, None) => Next::Mint,
                (None, Some(_)) => Next::Bind,
                (Some(u), Some(_)) if ours(u) => Next::Provision { target: "active" },
                (Some(u), _) => fail(
                    FailureCode::IronicStaleInstanceUuid,
                    format!(
                        "node {} is available but still carries instance {u}: clean it up (unimage) first",
                        node.uuid
                    ),
                ),
            }
        }
        s => fail(
            FailureCode::IronicNodeNotAvailable,
            format!(
                "node {} is {s}{}, not available",
                node.uuid,
                if in_flight(node) {
                    format!(" (moving to {})", node.target_provision_state)
                } else {
                    String::new()
                }
            ),
        ),
    }
}

/// Unimage Node, Ironic-direct:
///
/// - "it drives Ironic's deleted action (ACTIVE/DEPLOYFAIL -> cleaning ->
///   AVAILABLE), polls to observed AVAILABLE, then atomically clears the
///   node's instance_uuid/instance_info";
/// - "A node already tearing down (DELETING/CLEANING/CLEANWAIT/DELETED) is
///   not re-fired, and the binding clear is guarded on observed AVAILABLE
///   under the node's own uuid";
/// - "An unbound node is already complete only when Ironic is AVAILABLE".
///
/// `fired`: this run already asked for `deleted`, so `active` with a
/// transition in flight is the teardown starting.
pub fn unimage_next(node: &NodeView<'_>) -> Next {
    let state = node.provision_state;
    if TEARING_DOWN.contains(&state)
        || (state == "active" && node.target_provision_state == "available")
    {
        return Next::Wait;
    }
    match state {
        "available" if !in_flight(node) => match node.instance_uuid {
            Some(u) => Next::ClearBinding {
                observed: u.to_string(),
            },
            None => Next::Done,
        },
        "active" if !in_flight(node) => Next::Provision { target: "deleted" },
        // Ironic leaves `target_provision_state = active` on a node that
        // failed its deploy: it is at rest all the same.
        "deploy failed" => Next::Provision { target: "deleted" },
        s if is_failure(s) => match teardown_failure(node.uuid, s, node.last_error) {
            Some((code, message)) => fail(code, message),
            None => Next::Wait,
        },
        s if DEPLOYING.contains(&s) || in_flight(node) => fail(
            FailureCode::IronicNodeNotAvailable,
            format!(
                "node {} is {s} (moving to {}): not something unimage tears down",
                node.uuid, node.target_provision_state
            ),
        ),
        s => fail(
            FailureCode::IronicNodeNotAvailable,
            format!(
                "node {} is {s}: unimage needs active, deploy failed or available",
                node.uuid
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use FailureCode as F;

    fn node(state: &'static str, instance: Option<&'static str>) -> NodeView<'static> {
        NodeView {
            uuid: "node-1",
            provision_state: state,
            target_provision_state: "",
            maintenance: false,
            instance_uuid: instance,
            last_error: None,
        }
    }

    fn code(n: Next) -> Option<FailureCode> {
        match n {
            Next::Fail(code, _) => Some(code),
            _ => None,
        }
    }

    #[test]
    fn image_mints_binds_then_deploys() {
        // "A fresh execution mints a new instance_uuid".
        assert_eq!(image_next(&node("available", None), None), Next::Mint);
        // Minted and pinned, not yet written (or the write was lost).
        assert_eq!(
            image_next(&node("available", None), Some("i-1")),
            Next::Bind
        );
        // Written, not yet deploying (a worker killed between the two).
        assert_eq!(
            image_next(&node("available", Some("i-1")), Some("i-1")),
            Next::Provision { target: "active" }
        );
        assert_eq!(
            image_next(&node("active", Some("i-1")), Some("i-1")),
            Next::Done
        );
    }

    #[test]
    fn image_recovers_a_mid_deploy_binding() {
        // "a node found mid-deploy recovers its in-flight binding".
        for s in ["deploying", "wait call-back"] {
            assert_eq!(
                image_next(&node(s, Some("i-9")), None),
                Next::Adopt {
                    instance_uuid: "i-9".into()
                }
            );
            assert_eq!(image_next(&node(s, Some("i-9")), Some("i-9")), Next::Wait);
            assert_eq!(
                code(image_next(&node(s, Some("i-9")), Some("i-1"))),
                Some(F::IronicInstanceMismatch)
            );
        }
        let mut moving = node("active", Some("i-1"));
        moving.target_provision_state = "active";
        assert_eq!(image_next(&moving, Some("i-1")), Next::Wait);
    }

    #[test]
    fn image_rejects_an_idle_available_node_with_a_prior_instance() {
        // "an idle AVAILABLE node still carrying a prior instance_uuid is
        // rejected for cleanup rather than adopted".
        assert_eq!(
            code(image_next(&node("available", Some("old")), None)),
            Some(F::IronicStaleInstanceUuid)
        );
        assert_eq!(
            code(image_next(&node("available", Some("old")), Some("i-1"))),
            Some(F::IronicStaleInstanceUuid)
        );
    }

    #[test]
    fn image_fails_closed() {
        // "DEPLOYFAIL fails closed".
        let mut failed = node("deploy failed", Some("i-1"));
        failed.last_error = Some("boom");
        match image_next(&failed, Some("i-1")) {
            Next::Fail(code, message) => {
                assert_eq!(code, F::IronicDeployFailed);
                assert!(message.contains("boom"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // "rejects every Ironic failure state".
        for s in crate::ironic::FAILURE_STATES
            .iter()
            .filter(|s| **s != "deploy failed")
        {
            assert_eq!(
                code(image_next(&node(s, None), None)),
                Some(F::IronicFailureState),
                "{s}"
            );
        }
        // "requires authoritative maintenance=false".
        let mut m = node("available", None);
        m.maintenance = true;
        assert_eq!(code(image_next(&m, None)), Some(F::IronicNodeInMaintenance));
        for s in ["manageable", "enroll", "cleaning"] {
            assert_eq!(
                code(image_next(&node(s, None), None)),
                Some(F::IronicNodeNotAvailable),
                "{s}"
            );
        }
        assert_eq!(
            code(image_next(&node("active", Some("other")), None)),
            Some(F::IronicNodeNotAvailable)
        );
    }

    #[test]
    fn unimage_fires_deleted_once_and_waits_for_available() {
        // "ACTIVE/DEPLOYFAIL -> cleaning -> AVAILABLE".
        assert_eq!(
            unimage_next(&node("active", Some("i-1"))),
            Next::Provision { target: "deleted" }
        );
        assert_eq!(
            unimage_next(&node("deploy failed", Some("i-1"))),
            Next::Provision { target: "deleted" }
        );
        // "A bound DEPLOYFAIL is admitted": Ironic keeps its target active.
        let mut failed = node("deploy failed", Some("i-1"));
        failed.target_provision_state = "active";
        assert_eq!(unimage_next(&failed), Next::Provision { target: "deleted" });
        // "A node already tearing down ... is not re-fired".
        for s in [
            "deleting",
            "deleted",
            "cleaning",
            "clean wait",
            "clean hold",
        ] {
            assert_eq!(unimage_next(&node(s, Some("i-1"))), Next::Wait, "{s}");
        }
        let mut starting = node("active", Some("i-1"));
        starting.target_provision_state = "available";
        assert_eq!(unimage_next(&starting), Next::Wait);
    }

    #[test]
    fn unimage_clears_the_binding_only_on_observed_available() {
        // "the binding clear is guarded on observed AVAILABLE under the
        // node's own uuid".
        assert_eq!(
            unimage_next(&node("available", Some("i-1"))),
            Next::ClearBinding {
                observed: "i-1".into()
            }
        );
        // "An unbound node is already complete only when Ironic is AVAILABLE".
        assert_eq!(unimage_next(&node("available", None)), Next::Done);
        assert_eq!(
            code(unimage_next(&node("manageable", None))),
            Some(F::IronicNodeNotAvailable)
        );
        assert_eq!(
            code(unimage_next(&node("clean failed", None))),
            Some(F::IronicCleaningFailed)
        );
        assert_eq!(
            code(unimage_next(&node("error", Some("i-1")))),
            Some(F::IronicFailureState)
        );
    }
}
