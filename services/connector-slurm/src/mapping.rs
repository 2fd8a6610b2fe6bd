//! slurmrestd node JSON to snapshots. Pure: no IO.
//!
//! v0.0.38 (SLURM 22.05) gives `state` as a lowercase string plus a
//! `state_flags` array; v0.0.39 and later give `state` as a token list.
//! Both go through `fleet_domain::slurm::normalise`.

use chrono::{DateTime, Utc};
use fleet_connector::snapshot::{condition, key, snapshot};
use fleet_domain::slurm::{camel, normalise};
use fleet_domain::{ConditionStatus, ConditionType, KeyKind, Source};
use fleet_proto::v1::{self, condition_snapshot::Mirror};

pub const SCHEDULER_UNREACHABLE: &str = "SchedulerUnreachable";
pub const NO_LONGER_OBSERVED: &str = "NoLongerObserved";
pub const LISTED: &str = "NodeListed";
pub const STATE_HEALTHY: &str = "StateHealthy";
pub const NO_STATE: &str = "NoStateReported";

pub use fleet_slurm::Node;
#[cfg(test)]
use fleet_slurm::NodesResponse;

/// A state token the vocabulary does not model: dropped, logged by the
/// caller with the node and the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub node: String,
    pub token: String,
}

#[derive(Debug, Default)]
pub struct Mapped {
    pub snapshots: Vec<v1::ConditionSnapshot>,
    pub dropped: Vec<Dropped>,
    /// Entries without a name, skipped.
    pub unnamed: usize,
}

fn slurm_mirror(states: Vec<String>, mode: &str) -> Option<Mirror> {
    Some(Mirror::Slurm(v1::SlurmMirror {
        states,
        mode: mode.to_string(),
    }))
}

/// The snapshot of one listed node.
pub fn map_node(
    site: &str,
    name: &str,
    node: &Node,
    at: DateTime<Utc>,
) -> (v1::ConditionSnapshot, Vec<String>) {
    let n = normalise(&node.reported());
    let tokens: Vec<String> = n.tokens.iter().map(|t| t.as_str().to_string()).collect();
    let reason_text = node.reason.as_deref().map(str::trim).unwrap_or_default();
    let healthy = match n.first_bad() {
        Some(bad) => condition(
            ConditionType::SlurmNodeHealthy,
            ConditionStatus::False,
            &camel(bad),
            if reason_text.is_empty() {
                tokens.join("+")
            } else {
                format!("{}: {reason_text}", tokens.join("+"))
            },
        ),
        None if tokens.is_empty() => condition(
            ConditionType::SlurmNodeHealthy,
            ConditionStatus::Unknown,
            NO_STATE,
            "slurmrestd lists the node without a modelled state",
        ),
        None => condition(
            ConditionType::SlurmNodeHealthy,
            ConditionStatus::True,
            STATE_HEALTHY,
            tokens.join("+"),
        ),
    };
    let snap = snapshot(
        Source::Slurm,
        key(site, KeyKind::Name, name),
        at,
        vec![
            condition(
                ConditionType::SlurmRegistered,
                ConditionStatus::True,
                LISTED,
                "",
            ),
            healthy,
        ],
        slurm_mirror(tokens, "observed"),
    );
    (snap, n.dropped)
}

/// Maps one listing of a site's nodes.
pub fn map_nodes(site: &str, nodes: &[Node], at: DateTime<Utc>) -> Mapped {
    let mut out = Mapped::default();
    for node in nodes {
        let Some(name) = node
            .name
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty())
        else {
            out.unnamed += 1;
            continue;
        };
        let (snap, dropped) = map_node(site, name, node, at);
        out.snapshots.push(snap);
        out.dropped.extend(dropped.into_iter().map(|token| Dropped {
            node: name.to_string(),
            token,
        }));
    }
    out
}

/// A node seen before that SLURM no longer lists: `SlurmRegistered` False
/// `NoLongerObserved`, and the mirror cleared.
pub fn no_longer_observed(k: &v1::DeviceKey, at: DateTime<Utc>) -> v1::ConditionSnapshot {
    snapshot(
        Source::Slurm,
        k.clone(),
        at,
        vec![
            condition(
                ConditionType::SlurmRegistered,
                ConditionStatus::False,
                NO_LONGER_OBSERVED,
                "slurmrestd no longer lists the node",
            ),
            condition(
                ConditionType::SlurmNodeHealthy,
                ConditionStatus::Unknown,
                NO_LONGER_OBSERVED,
                "slurmrestd no longer lists the node",
            ),
        ],
        slurm_mirror(vec![], "clear"),
    )
}

/// The mirror of an outage snapshot: leave the states as last known.
pub fn outage_mirror() -> Option<Mirror> {
    slurm_mirror(vec![], "keep")
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_domain::slurm::SlurmState;

    const NODES: &str = include_str!("../testdata/slurm-nodes.json");
    const NODES_37: &str = include_str!("../testdata/slurm-nodes-v0.0.37.json");
    const DRAINING: &str = include_str!("../testdata/slurm-node-gpu05-draining.json");

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-29T16:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn cond<'a>(s: &'a v1::ConditionSnapshot, t: &str) -> &'a v1::Condition {
        s.conditions.iter().find(|c| c.r#type == t).unwrap()
    }

    fn states(s: &v1::ConditionSnapshot) -> (Vec<String>, String) {
        match &s.mirror {
            Some(Mirror::Slurm(m)) => (m.states.clone(), m.mode.clone()),
            other => panic!("{other:?}"),
        }
    }

    fn node(state: serde_json::Value, flags: Option<Vec<&str>>) -> Node {
        let mut v = serde_json::json!({"name": "gpu01", "state": state, "reason": ""});
        if let Some(f) = flags {
            v["state_flags"] = serde_json::json!(f);
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_v0_0_38_sample() {
        for body in [NODES, NODES_37] {
            let r: NodesResponse = serde_json::from_str(body).unwrap();
            let m = map_nodes("s1", &r.nodes, at());
            assert!(m.dropped.is_empty());
            let got: Vec<(String, String, String, Vec<String>)> = m
                .snapshots
                .iter()
                .map(|s| {
                    let h = cond(s, "SlurmNodeHealthy");
                    assert_eq!(cond(s, "SlurmRegistered").status, "True");
                    (
                        s.device.as_ref().unwrap().key.clone(),
                        h.status.clone(),
                        h.reason.clone(),
                        states(s).0,
                    )
                })
                .collect();
            let row = |n: &str, st: &str, r: &str, t: &[&str]| {
                (
                    n.to_string(),
                    st.to_string(),
                    r.to_string(),
                    t.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                )
            };
            assert_eq!(
                got,
                vec![
                    row("gpu01", "True", STATE_HEALTHY, &["IDLE"]),
                    row("gpu02", "False", "Drain", &["IDLE", "DRAIN"]),
                    row("gpu03", "False", "Down", &["DOWN"]),
                    row("gpu04", "True", STATE_HEALTHY, &["MIXED"]),
                    row("gpu05", "False", "Drain", &["MIXED", "DRAIN"]),
                    row("gpu06", "True", STATE_HEALTHY, &["ALLOCATED"]),
                ]
            );
            let gpu02 = &m.snapshots[1];
            assert_eq!(
                cond(gpu02, "SlurmNodeHealthy").message,
                "IDLE+DRAIN: gpu xid 79"
            );
            assert_eq!(states(gpu02).1, "observed");
        }
        let r: NodesResponse = serde_json::from_str(DRAINING).unwrap();
        let m = map_nodes("s1", &r.nodes, at());
        assert_eq!(cond(&m.snapshots[0], "SlurmNodeHealthy").reason, "Drain");
    }

    #[test]
    fn every_token_alone_in_both_wire_forms() {
        for t in SlurmState::ALL {
            let bad = fleet_domain::slurm::BAD_TOKENS.contains(t);
            for n in [
                node(serde_json::json!([t.as_str()]), None),
                node(
                    serde_json::json!(t.as_str().to_ascii_lowercase()),
                    Some(vec![]),
                ),
            ] {
                let (s, dropped) = map_node("s1", "gpu01", &n, at());
                assert!(dropped.is_empty(), "{t}");
                let h = cond(&s, "SlurmNodeHealthy");
                assert_eq!(h.status, if bad { "False" } else { "True" }, "{t}");
                if bad {
                    assert_eq!(h.reason, camel(*t), "{t}");
                }
                assert_eq!(states(&s).0, vec![t.as_str().to_string()]);
            }
        }
    }

    #[test]
    fn compound_forms_flags_and_presentation_words() {
        let cases: Vec<(Node, &[&str], &str, &str)> = vec![
            // v0.0.40+ token list
            (
                node(serde_json::json!(["IDLE", "DRAIN"]), None),
                &["IDLE", "DRAIN"],
                "False",
                "Drain",
            ),
            (
                node(serde_json::json!(["DOWN", "NOT_RESPONDING"]), None),
                &["DOWN", "NOT_RESPONDING"],
                "False",
                "Down",
            ),
            // v0.0.38 string plus flags
            (
                node(serde_json::json!("idle"), Some(vec!["NOT_RESPONDING"])),
                &["IDLE", "NOT_RESPONDING"],
                "False",
                "NotResponding",
            ),
            (
                node(
                    serde_json::json!("mixed"),
                    Some(vec!["MAINTENANCE", "RESERVED"]),
                ),
                &["MIXED", "MAINTENANCE", "RESERVED"],
                "False",
                "Maintenance",
            ),
            (
                node(serde_json::json!("allocated"), Some(vec!["COMPLETING"])),
                &["ALLOCATED", "COMPLETING"],
                "True",
                STATE_HEALTHY,
            ),
            // compound strings and markers
            (
                node(serde_json::json!("DOWN+DRAIN"), None),
                &["DOWN", "DRAIN"],
                "False",
                "Down",
            ),
            (
                node(serde_json::json!("idle*"), None),
                &["IDLE"],
                "True",
                STATE_HEALTHY,
            ),
            (
                node(serde_json::json!("down*"), Some(vec!["NOT_RESPONDING"])),
                &["DOWN", "NOT_RESPONDING"],
                "False",
                "Down",
            ),
            (
                node(serde_json::json!(["drained"]), None),
                &["IDLE", "DRAIN"],
                "False",
                "Drain",
            ),
            (
                node(serde_json::json!(["DRAINING"]), None),
                &["ALLOCATED", "DRAIN"],
                "False",
                "Drain",
            ),
            (
                node(serde_json::json!("mix"), None),
                &["MIXED"],
                "True",
                STATE_HEALTHY,
            ),
            (
                node(serde_json::json!(["IDLE", "INVALID_REG"]), None),
                &["IDLE", "INVALID_REG"],
                "False",
                "InvalidReg",
            ),
            (
                node(serde_json::json!(["FAIL", "DOWN"]), None),
                &["FAIL", "DOWN"],
                "False",
                "Fail",
            ),
            // no state at all
            (node(serde_json::json!([]), None), &[], "Unknown", NO_STATE),
            (
                node(serde_json::Value::Null, None),
                &[],
                "Unknown",
                NO_STATE,
            ),
        ];
        for (n, tokens, status, reason) in cases {
            let (s, _) = map_node("s1", "gpu01", &n, at());
            let h = cond(&s, "SlurmNodeHealthy");
            assert_eq!(
                (h.status.as_str(), h.reason.as_str()),
                (status, reason),
                "{n:?}"
            );
            assert_eq!(states(&s).0, tokens, "{n:?}");
        }
    }

    #[test]
    fn unmodelled_tokens_are_dropped_and_reported() {
        let n = node(
            serde_json::json!(["IDLE", "BLOCKED", "PLANNED"]),
            Some(vec!["FUTURE_FLAG_X"]),
        );
        let m = map_nodes("s1", &[n], at());
        assert_eq!(states(&m.snapshots[0]).0, vec!["IDLE", "PLANNED"]);
        assert_eq!(
            m.dropped,
            vec![
                Dropped {
                    node: "gpu01".into(),
                    token: "BLOCKED".into()
                },
                Dropped {
                    node: "gpu01".into(),
                    token: "FUTURE_FLAG_X".into()
                }
            ]
        );
        assert_eq!(cond(&m.snapshots[0], "SlurmNodeHealthy").status, "True");
        let only = node(serde_json::json!(["WEIRD"]), None);
        let m = map_nodes("s1", &[only], at());
        assert_eq!(cond(&m.snapshots[0], "SlurmNodeHealthy").status, "Unknown");
    }

    #[test]
    fn vanished_clears_and_outage_keeps() {
        let k = key("s1", KeyKind::Name, "gpu09");
        let s = no_longer_observed(&k, at());
        assert_eq!(cond(&s, "SlurmRegistered").status, "False");
        assert_eq!(cond(&s, "SlurmRegistered").reason, NO_LONGER_OBSERVED);
        assert_eq!(cond(&s, "SlurmNodeHealthy").status, "Unknown");
        assert_eq!(states(&s), (vec![], "clear".to_string()));
        match outage_mirror() {
            Some(Mirror::Slurm(m)) => assert_eq!(m.mode, "keep"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unnamed_nodes_are_skipped_and_bodies_must_have_nodes() {
        let n: Node = serde_json::from_value(serde_json::json!({"state": "idle"})).unwrap();
        let m = map_nodes("s1", &[n], at());
        assert_eq!((m.snapshots.len(), m.unnamed), (0, 1));
        for body in [
            r#"{"errors": []}"#,
            r#"{"nodes": {}}"#,
            r#"{"nodes": [{"state": 7}]}"#,
            "",
        ] {
            assert!(
                serde_json::from_str::<NodesResponse>(body).is_err(),
                "{body}"
            );
        }
    }
}
