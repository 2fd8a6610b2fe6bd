//! The Nova arm of Image Node and Unimage Node (seed 002): a full-OpenStack
//! site (`placement_enabled = true`) images a node by creating a Nova server
//! on it with the site's dedicated SLURM credential, and unimages it by
//! deleting that server. Pure: the workflow service reads the node from
//! Ironic and the server from Nova, asks [`image_next`] or
//! [`unimage_next`] what to do, does it, and reads both again. Every
//! decision is taken on fresh reads, so a worker killed between two writes
//! resumes by reading, never by repeating a write the systems already show.

use crate::failure::FailureCode;
use crate::ironic::image_failure;

/// The two projects a node's Ironic lease moves between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Projects<'a> {
    /// Where an enrolled node not imaged is leased.
    pub enrol: &'a str,
    /// The SLURM (maintenance) project the image runs in.
    pub slurm: &'a str,
}

/// What a workflow reads of a node (Ironic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeView<'a> {
    pub uuid: &'a str,
    pub provision_state: &'a str,
    /// Empty when no transition is in flight.
    pub target_provision_state: &'a str,
    pub maintenance: bool,
    pub instance_uuid: Option<&'a str>,
    pub lessee: Option<&'a str>,
    pub last_error: Option<&'a str>,
}

/// What a workflow reads of a server (Nova).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerView<'a> {
    pub id: &'a str,
    /// `BUILD`, `ACTIVE`, `ERROR`, ...
    pub status: &'a str,
    /// A delete is in flight (`OS-EXT-STS:task_state = deleting`).
    pub deleting: bool,
    pub fault: Option<&'a str>,
}

/// What Image Node reads of Nova on this step ([`image_lookup`] says which).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found<'a> {
    /// The server with the known id (the node's binding, or the run's own):
    /// `None` when Nova has no such server.
    Server(Option<ServerView<'a>>),
    /// The SLURM project's servers named exactly as the node's host.
    Named(Vec<ServerView<'a>>),
}

/// Which read [`image_next`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// `GET /servers/{id}`.
    ById(String),
    /// The exact host-name search.
    ByName,
}

/// The next move of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Set the node's Ironic `lessee` to `to`.
    MoveLease {
        to: String,
    },
    /// Create the server on the node with the SLURM credential, image,
    /// flavour, network and keypair, and pin its id.
    Create,
    /// Pin `server_id` as the run's server (recovered from Ironic's
    /// `instance_uuid` or a sole exact host-name match; Unimage: the
    /// binding it will delete).
    Adopt {
        server_id: String,
    },
    /// Pin that the run is deleting its server, before the delete is sent,
    /// so a resumed run reads a vanished server as its own deletion done.
    IntendDelete,
    /// `DELETE /servers/{id}` (by id, never by name).
    Delete {
        server_id: String,
    },
    /// Nova or Ironic is moving: read again later.
    Wait,
    Done,
    Fail(FailureCode, String),
}

fn fail(code: FailureCode, message: String) -> Next {
    Next::Fail(code, message)
}

/// Nova states a server passes through on its way to `ACTIVE`.
const BUILDING: &[&str] = &["BUILD", "REBUILD", "REBOOT", "HARD_REBOOT"];

fn in_flight(n: &NodeView<'_>) -> bool {
    !n.target_provision_state.is_empty()
}

/// Which Nova read Image Node's next step decides on: the known server (the
/// run's pinned one, else the node's binding), or the host-name search.
pub fn image_lookup(node: &NodeView<'_>, pinned: Option<&str>) -> Lookup {
    match pinned.or(node.instance_uuid) {
        Some(id) => Lookup::ById(id.to_string()),
        None => Lookup::ByName,
    }
}

/// Image Node, Nova arm. `pinned`: the server this run created or adopted.
///
/// - "Image admission requires authoritative maintenance=false and rejects
///   every Ironic failure state";
/// - "Before Nova creation it moves the Ironic lease from the enrol project
///   to the SLURM project, then creates the server through the dedicated
///   SLURM credential";
/// - "A retry recovers the server from Ironic's instance_uuid, or from a
///   sole exact host-name match in the SLURM Nova project before Ironic has
///   recorded that binding. Multiple exact-name matches fail closed.
///   Terminal Nova states also fail without automatically deleting the
///   discovered server."
pub fn image_next(
    node: &NodeView<'_>,
    projects: &Projects<'_>,
    pinned: Option<&str>,
    found: &Found<'_>,
) -> Next {
    let state = node.provision_state;
    if let Some((code, message)) = image_failure(node.uuid, state, node.last_error) {
        return fail(code, message);
    }
    if node.maintenance {
        return fail(
            FailureCode::IronicNodeInMaintenance,
            format!("node {} is in maintenance", node.uuid),
        );
    }
    let bound = node.instance_uuid;
    if let (Some(p), Some(b)) = (pinned, bound) {
        if p != b {
            return fail(
                FailureCode::IronicInstanceMismatch,
                format!(
                    "node {} is bound to instance {b}, not this run's server {p}",
                    node.uuid
                ),
            );
        }
    }
    match (pinned.or(bound), found) {
        (None, Found::Named(named)) => {
            if state != "available" || in_flight(node) {
                return fail(
                    FailureCode::IronicNodeNotAvailable,
                    format!("node {} is {state}, not available", node.uuid),
                );
            }
            match node.lessee.filter(|l| !l.is_empty()) {
                Some(l) if l == projects.slurm => {}
                None => {
                    return Next::MoveLease {
                        to: projects.slurm.to_string(),
                    }
                }
                Some(l) if l == projects.enrol => {
                    return Next::MoveLease {
                        to: projects.slurm.to_string(),
                    }
                }
                Some(l) => {
                    return fail(
                        FailureCode::IronicLesseeUnexpected,
                        format!(
                            "node {} is leased to project {l}, neither the enrol project {} nor the SLURM project {}",
                            node.uuid, projects.enrol, projects.slurm
                        ),
                    )
                }
            }
            match named.as_slice() {
                [] => Next::Create,
                [one] => Next::Adopt {
                    server_id: one.id.to_string(),
                },
                many => fail(
                    FailureCode::NovaServerAmbiguous,
                    format!(
                        "{} servers in the SLURM project are named as node {}'s host ({}): the run cannot tell which is its own",
                        many.len(),
                        node.uuid,
                        many.iter().map(|s| s.id).collect::<Vec<_>>().join(", ")
                    ),
                ),
            }
        }
        (Some(id), Found::Server(None)) => match pinned {
            // Bound by Ironic to an instance the SLURM project does not
            // have: someone else's deployment.
            None => fail(
                FailureCode::IronicNodeNotAvailable,
                format!(
                    "node {} is bound to instance {id}, which is not a server of the SLURM project",
                    node.uuid
                ),
            ),
            Some(_) => fail(
                FailureCode::NovaServerMissing,
                format!(
                    "the run's server {id} for node {} is gone from Nova",
                    node.uuid
                ),
            ),
        },
        (Some(id), Found::Server(Some(s))) => {
            if pinned.is_none() {
                return Next::Adopt {
                    server_id: id.to_string(),
                };
            }
            let terminal = |why: String| {
                fail(
                    FailureCode::NovaServerFailed,
                    format!(
                        "server {} for node {} {why}{}; it is left as it is",
                        s.id,
                        node.uuid,
                        s.fault.map(|f| format!(": {f}")).unwrap_or_default()
                    ),
                )
            };
            if s.deleting {
                return terminal("is being deleted".into());
            }
            match s.status {
                st if BUILDING.contains(&st) => Next::Wait,
                "ACTIVE" => {
                    if bound == Some(id) && state == "active" && !in_flight(node) {
                        Next::Done
                    } else if bound == Some(id) || state != "available" || in_flight(node) {
                        Next::Wait
                    } else {
                        fail(
                            FailureCode::IronicInstanceMismatch,
                            format!(
                                "server {id} is ACTIVE but node {} is available and not bound to it",
                                node.uuid
                            ),
                        )
                    }
                }
                other => terminal(format!("is {other}")),
            }
        }
        _ => fail(
            FailureCode::WorkflowInternalError,
            format!("node {}: the step read Nova the wrong way", node.uuid),
        ),
    }
}

/// The lease return that ends Unimage Node: the SLURM lease goes back to the
/// enrol project; "A retry accepts that already-completed enrol-leased
/// state".
fn lease_back(node: &NodeView<'_>, projects: &Projects<'_>) -> Next {
    match node.lessee.filter(|l| !l.is_empty()) {
        None => Next::Done,
        Some(l) if l == projects.enrol => Next::Done,
        Some(l) if l == projects.slurm => Next::MoveLease {
            to: projects.enrol.to_string(),
        },
        Some(l) => fail(
            FailureCode::IronicLesseeUnexpected,
            format!(
                "node {} is leased to project {l}, not the SLURM project {}: its lease is not this workflow's to return",
                node.uuid, projects.slurm
            ),
        ),
    }
}

fn teardown_failure(node: &NodeView<'_>) -> Option<Next> {
    crate::ironic::teardown_failure(node.uuid, node.provision_state, node.last_error)
        .map(|(code, message)| fail(code, message))
}

/// Unimage Node, Nova arm. `pinned`: the server this run deletes (the
/// node's binding when the run started); `intent`: the run pinned that it
/// is deleting it; `server`: that server as Nova shows it (read only once
/// pinned).
///
/// - "only deletes the Nova server identified by Ironic's instance_uuid; it
///   never searches Nova by host name. An unbound node is already complete
///   only when Ironic is AVAILABLE. Otherwise a missing binding, or a bound
///   UUID whose Nova server is missing, fails for explicit operator repair";
/// - "After requesting Nova deletion, the workflow waits for the server to
///   disappear and Ironic to return to AVAILABLE, then returns the lease to
///   the enrol project. A retry accepts that already-completed enrol-leased
///   state";
/// - "A bound DEPLOYFAIL is admitted for this explicit cleanup, and the
///   workflow tolerates that original state while Nova deletion starts.
///   Other Ironic failure states are rejected before Nova deletion and
///   reported immediately if reached during teardown."
pub fn unimage_next(
    node: &NodeView<'_>,
    projects: &Projects<'_>,
    pinned: Option<&str>,
    intent: bool,
    server: Option<&ServerView<'_>>,
) -> Next {
    let state = node.provision_state;
    let idle_available = state == "available" && !in_flight(node);
    let Some(id) = pinned else {
        return match node.instance_uuid {
            None if idle_available => lease_back(node, projects),
            None => fail(
                FailureCode::NovaBindingMissing,
                format!(
                    "node {} is {state} with no instance_uuid: there is no bound server to delete (Unimage never searches Nova by name); repair the node",
                    node.uuid
                ),
            ),
            Some(u) => {
                if let Some(f) = teardown_failure(node) {
                    return f;
                }
                // The SLURM credential deletes: a server of another project
                // (a customer's) is not this workflow's to tear down.
                match node.lessee.filter(|l| !l.is_empty()) {
                    Some(l) if l != projects.slurm && l != projects.enrol => fail(
                        FailureCode::IronicLesseeUnexpected,
                        format!(
                            "node {} is leased to project {l}: Unimage deletes only servers of the SLURM project {}",
                            node.uuid, projects.slurm
                        ),
                    ),
                    _ => Next::Adopt {
                        server_id: u.to_string(),
                    },
                }
            }
        };
    };
    if let Some(f) = teardown_failure(node) {
        return f;
    }
    if let Some(b) = node.instance_uuid.filter(|b| *b != id) {
        return fail(
            FailureCode::IronicInstanceMismatch,
            format!(
                "node {} is now bound to instance {b}, not the server {id} this run deletes",
                node.uuid
            ),
        );
    }
    match (server, intent) {
        (None, false) => fail(
            FailureCode::NovaServerMissing,
            format!(
                "node {} is bound to instance {id}, which Nova does not have: repair the binding",
                node.uuid
            ),
        ),
        (Some(_), false) => Next::IntendDelete,
        (Some(s), true) if !s.deleting && s.status != "DELETED" => Next::Delete {
            server_id: id.to_string(),
        },
        (Some(_), true) => Next::Wait,
        (None, true) => {
            if idle_available && node.instance_uuid.is_none() {
                lease_back(node, projects)
            } else {
                Next::Wait
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use FailureCode as F;

    const P: Projects<'static> = Projects {
        enrol: "enrol",
        slurm: "slurm",
    };

    fn node(state: &'static str, instance: Option<&'static str>) -> NodeView<'static> {
        NodeView {
            uuid: "node-1",
            provision_state: state,
            target_provision_state: "",
            maintenance: false,
            instance_uuid: instance,
            lessee: Some("slurm"),
            last_error: None,
        }
    }

    fn server(id: &'static str, status: &'static str) -> ServerView<'static> {
        ServerView {
            id,
            status,
            deleting: false,
            fault: None,
        }
    }

    fn code(n: Next) -> Option<FailureCode> {
        match n {
            Next::Fail(code, _) => Some(code),
            _ => None,
        }
    }

    /// A fresh run's Image step once the host-name search found no server.
    fn image_unnamed(n: &NodeView<'_>) -> Next {
        image_next(n, &P, None, &Found::Named(vec![]))
    }

    /// The failure of an Unimage step on a node in `state` bound to `bound`,
    /// the run's server `pinned` (and its delete `intent`) not in Nova.
    fn unimage_failure(
        state: &'static str,
        bound: Option<&'static str>,
        pinned: Option<&str>,
        intent: bool,
    ) -> Option<FailureCode> {
        code(unimage_next(&node(state, bound), &P, pinned, intent, None))
    }

    #[test]
    fn image_moves_the_lease_before_creating_the_server() {
        // "Before Nova creation it moves the Ironic lease from the enrol
        // project to the SLURM project, then creates the server".
        let mut n = node("available", None);
        n.lessee = Some("enrol");
        assert_eq!(image_lookup(&n, None), Lookup::ByName);
        assert_eq!(image_unnamed(&n), Next::MoveLease { to: "slurm".into() });
        n.lessee = None;
        assert_eq!(image_unnamed(&n), Next::MoveLease { to: "slurm".into() });
        n.lessee = Some("slurm");
        assert_eq!(image_unnamed(&n), Next::Create);
        n.lessee = Some("customer");
        assert_eq!(code(image_unnamed(&n)), Some(F::IronicLesseeUnexpected));
    }

    #[test]
    fn image_waits_for_the_build_and_ends_on_a_bound_active_node() {
        let n = node("available", None);
        assert_eq!(image_lookup(&n, Some("s-1")), Lookup::ById("s-1".into()));
        let building = Found::Server(Some(server("s-1", "BUILD")));
        assert_eq!(image_next(&n, &P, Some("s-1"), &building), Next::Wait);
        assert_eq!(
            image_next(&node("deploying", Some("s-1")), &P, Some("s-1"), &building),
            Next::Wait
        );
        let active = Found::Server(Some(server("s-1", "ACTIVE")));
        assert_eq!(
            image_next(&node("active", Some("s-1")), &P, Some("s-1"), &active),
            Next::Done
        );
        // Nova ACTIVE on a node that is idle and bound to nothing: the
        // server landed somewhere else.
        assert_eq!(
            code(image_next(&n, &P, Some("s-1"), &active)),
            Some(F::IronicInstanceMismatch)
        );
    }

    #[test]
    fn image_recovers_the_server_from_the_binding_or_a_sole_name_match() {
        // "A retry recovers the server from Ironic's instance_uuid".
        let bound = node("deploying", Some("s-9"));
        assert_eq!(image_lookup(&bound, None), Lookup::ById("s-9".into()));
        assert_eq!(
            image_next(
                &bound,
                &P,
                None,
                &Found::Server(Some(server("s-9", "BUILD")))
            ),
            Next::Adopt {
                server_id: "s-9".into()
            }
        );
        // "... or from a sole exact host-name match in the SLURM Nova
        // project before Ironic has recorded that binding."
        let n = node("available", None);
        assert_eq!(
            image_next(&n, &P, None, &Found::Named(vec![server("s-2", "BUILD")])),
            Next::Adopt {
                server_id: "s-2".into()
            }
        );
        // "Multiple exact-name matches fail closed."
        let two = Found::Named(vec![server("s-2", "BUILD"), server("s-3", "ACTIVE")]);
        assert_eq!(
            code(image_next(&n, &P, None, &two)),
            Some(F::NovaServerAmbiguous)
        );
        // A binding the SLURM project does not know is someone else's.
        assert_eq!(
            code(image_next(&bound, &P, None, &Found::Server(None))),
            Some(F::IronicNodeNotAvailable)
        );
        // The run's own server gone.
        assert_eq!(
            code(image_next(&n, &P, Some("s-1"), &Found::Server(None))),
            Some(F::NovaServerMissing)
        );
        // Bound to another instance than the run's.
        assert_eq!(
            code(image_next(&bound, &P, Some("s-1"), &Found::Server(None))),
            Some(F::IronicInstanceMismatch)
        );
    }

    #[test]
    fn image_fails_closed_on_terminal_nova_states_and_ironic_failures() {
        // "Terminal Nova states also fail without automatically deleting the
        // discovered server."
        let n = node("deploying", Some("s-1"));
        for st in [
            "ERROR",
            "DELETED",
            "SOFT_DELETED",
            "SHELVED_OFFLOADED",
            "SHUTOFF",
        ] {
            let mut s = server("s-1", st);
            s.fault = Some("No valid host was found.");
            match image_next(&n, &P, Some("s-1"), &Found::Server(Some(s))) {
                Next::Fail(code, message) => {
                    assert_eq!(code, F::NovaServerFailed, "{st}");
                    assert!(message.contains("No valid host"), "{message}");
                }
                other => panic!("{st}: {other:?}"),
            }
        }
        // "Image admission requires authoritative maintenance=false and
        // rejects every Ironic failure state".
        let mut m = node("available", None);
        m.maintenance = true;
        assert_eq!(code(image_unnamed(&m)), Some(F::IronicNodeInMaintenance));
        assert_eq!(
            code(image_next(
                &node("deploy failed", Some("s-1")),
                &P,
                Some("s-1"),
                &Found::Server(None)
            )),
            Some(F::IronicDeployFailed)
        );
        for s in crate::ironic::FAILURE_STATES
            .iter()
            .filter(|s| **s != "deploy failed")
        {
            assert_eq!(
                code(image_unnamed(&node(s, None))),
                Some(F::IronicFailureState),
                "{s}"
            );
        }
        assert_eq!(
            code(image_unnamed(&node("manageable", None))),
            Some(F::IronicNodeNotAvailable)
        );
    }

    #[test]
    fn unimage_deletes_only_the_bound_server_then_returns_the_lease() {
        // "only deletes the Nova server identified by Ironic's
        // instance_uuid".
        let n = node("active", Some("s-1"));
        assert_eq!(
            unimage_next(&n, &P, None, false, None),
            Next::Adopt {
                server_id: "s-1".into()
            }
        );
        let s = server("s-1", "ACTIVE");
        assert_eq!(
            unimage_next(&n, &P, Some("s-1"), false, Some(&s)),
            Next::IntendDelete
        );
        assert_eq!(
            unimage_next(&n, &P, Some("s-1"), true, Some(&s)),
            Next::Delete {
                server_id: "s-1".into()
            }
        );
        // "waits for the server to disappear and Ironic to return to
        // AVAILABLE, then returns the lease to the enrol project".
        let mut deleting = s;
        deleting.deleting = true;
        assert_eq!(
            unimage_next(&n, &P, Some("s-1"), true, Some(&deleting)),
            Next::Wait
        );
        assert_eq!(
            unimage_next(&node("cleaning", None), &P, Some("s-1"), true, None),
            Next::Wait
        );
        assert_eq!(
            unimage_next(&node("available", Some("s-1")), &P, Some("s-1"), true, None),
            Next::Wait
        );
        let done = node("available", None);
        assert_eq!(
            unimage_next(&done, &P, Some("s-1"), true, None),
            Next::MoveLease { to: "enrol".into() }
        );
        // "A retry accepts that already-completed enrol-leased state."
        let mut returned = done;
        returned.lessee = Some("enrol");
        assert_eq!(
            unimage_next(&returned, &P, Some("s-1"), true, None),
            Next::Done
        );
        assert_eq!(unimage_next(&returned, &P, None, false, None), Next::Done);
    }

    #[test]
    fn unimage_leaves_a_customers_server_alone() {
        let mut n = node("active", Some("s-1"));
        n.lessee = Some("customer");
        assert_eq!(
            code(unimage_next(&n, &P, None, false, None)),
            Some(F::IronicLesseeUnexpected)
        );
        n.lessee = None;
        assert_eq!(
            unimage_next(&n, &P, None, false, None),
            Next::Adopt {
                server_id: "s-1".into()
            }
        );
    }

    #[test]
    fn unimage_fails_for_operator_repair_without_a_usable_binding() {
        // "An unbound node is already complete only when Ironic is
        // AVAILABLE. Otherwise a missing binding ... fails".
        assert_eq!(
            unimage_failure("active", None, None, false),
            Some(F::NovaBindingMissing)
        );
        assert_eq!(
            unimage_next(&node("available", None), &P, None, false, None),
            Next::MoveLease { to: "enrol".into() }
        );
        // "... or a bound UUID whose Nova server is missing".
        assert_eq!(
            unimage_failure("active", Some("s-1"), Some("s-1"), false),
            Some(F::NovaServerMissing)
        );
        // A concurrent rebind is not this run's to tear down.
        assert_eq!(
            unimage_failure("active", Some("s-2"), Some("s-1"), true),
            Some(F::IronicInstanceMismatch)
        );
    }

    #[test]
    fn unimage_admits_a_bound_deploy_failed_node_and_no_other_failure() {
        // "A bound DEPLOYFAIL is admitted for this explicit cleanup, and the
        // workflow tolerates that original state while Nova deletion
        // starts."
        let failed = node("deploy failed", Some("s-1"));
        assert_eq!(
            unimage_next(&failed, &P, None, false, None),
            Next::Adopt {
                server_id: "s-1".into()
            }
        );
        let s = server("s-1", "ERROR");
        assert_eq!(
            unimage_next(&failed, &P, Some("s-1"), true, Some(&s)),
            Next::Delete {
                server_id: "s-1".into()
            }
        );
        // "Other Ironic failure states are rejected before Nova deletion and
        // reported immediately if reached during teardown."
        assert_eq!(
            unimage_failure("error", Some("s-1"), None, false),
            Some(F::IronicFailureState)
        );
        assert_eq!(
            unimage_failure("clean failed", None, Some("s-1"), true),
            Some(F::IronicCleaningFailed)
        );
    }
}
