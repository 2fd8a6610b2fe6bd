//! Ironic node JSON (and the Placement answer) to snapshots: the six
//! openstack conditions of `spec/conditions.md` and the Ironic mirror.
//! Pure: no IO.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use fleet_connector::snapshot::{condition, key, snapshot, status};
use fleet_domain::{ironic, ConditionStatus as S, ConditionType as T, KeyKind, Source};
use fleet_proto::v1::{self, condition_snapshot::Mirror};
use serde::Deserialize;

pub const IRONIC_UNREACHABLE: &str = "IronicUnreachable";
pub const PLACEMENT_UNREACHABLE: &str = "PlacementUnreachable";
pub const NO_LONGER_OBSERVED: &str = "NoLongerObserved";

/// `GET /v1/nodes?detail=true`.
#[derive(Debug, Clone, Deserialize)]
pub struct NodesPage {
    pub nodes: Vec<Node>,
    #[serde(default)]
    pub next: Option<String>,
}

/// The fields of an Ironic node the connector reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Node {
    pub uuid: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub provision_state: Option<String>,
    #[serde(default)]
    pub maintenance: Option<bool>,
    #[serde(default)]
    pub maintenance_reason: Option<String>,
    #[serde(default)]
    pub instance_uuid: Option<String>,
    #[serde(default)]
    pub lessee: Option<String>,
    #[serde(default)]
    pub power_state: Option<String>,
    /// Absent below microversion 1.37.
    #[serde(default)]
    pub traits: Option<Vec<String>>,
    #[serde(default)]
    pub last_error: Option<String>,
}

/// `GET /resource_providers?required=<trait>`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResourceProviders {
    pub resource_providers: Vec<ResourceProvider>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ResourceProvider {
    pub uuid: String,
    #[serde(default)]
    pub name: Option<String>,
}

impl ResourceProviders {
    /// Ironic nodes are resource providers named and identified by the node
    /// UUID, so the set holds both.
    pub fn ids(&self) -> HashSet<String> {
        self.resource_providers
            .iter()
            .flat_map(|p| std::iter::once(p.uuid.clone()).chain(p.name.clone()))
            .collect()
    }
}

/// How snapshots name a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyBy {
    Name,
    InfrastructureRef,
}

impl KeyBy {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "" | "name" => Ok(KeyBy::Name),
            "infrastructure_ref" | "uuid" => Ok(KeyBy::InfrastructureRef),
            other => Err(format!("{other:?} is not name or infrastructure_ref")),
        }
    }
}

/// Where customer-ready comes from for this poll.
#[derive(Debug, Clone, Copy)]
pub enum Readiness<'a> {
    /// The resource providers Placement lists with the trait.
    Placement(&'a HashSet<String>),
    /// Standalone Ironic: the node's own `traits`.
    NodeTraits,
    /// Placement could not be read: `Unknown`, with this message.
    Unreadable(&'a str),
}

/// What Placement says of the nodes' resource providers this poll: the
/// device's `placement` resource binding.
#[derive(Debug, Clone, Copy)]
pub enum Providers<'a> {
    /// Standalone Ironic: no Placement, no binding.
    NotUsed,
    /// Every resource provider Placement lists (uuids and names).
    Listed(&'a HashSet<String>),
    /// Placement could not be read: the binding fails, with this message.
    Unreadable(&'a str),
}

/// Reason of a node Placement lists no resource provider for.
pub const RESOURCE_PROVIDER_MISSING: &str = "ResourceProviderMissing";

/// The node's Placement binding: an Ironic node's resource provider has the
/// node's uuid.
fn placement_binding(n: &Node, providers: Providers<'_>) -> Option<v1::ResourceBinding> {
    let resource = fleet_domain::binding::Resource::Placement
        .as_str()
        .to_string();
    match providers {
        Providers::NotUsed => None,
        Providers::Listed(ids) if ids.contains(&n.uuid) => Some(v1::ResourceBinding {
            resource,
            resource_id: n.uuid.clone(),
            ..Default::default()
        }),
        Providers::Listed(_) => Some(v1::ResourceBinding {
            resource,
            reason: RESOURCE_PROVIDER_MISSING.into(),
            message: format!("placement lists no resource provider {}", n.uuid),
            ..Default::default()
        }),
        Providers::Unreadable(msg) => Some(v1::ResourceBinding {
            resource,
            reason: PLACEMENT_UNREACHABLE.into(),
            message: msg.to_string(),
            ..Default::default()
        }),
    }
}

/// What the mapping needs besides the node.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub site: &'a str,
    pub key_by: KeyBy,
    pub customer_ready_trait: &'a str,
    /// The maintenance/SLURM project; empty when not configured.
    pub maintenance_project_id: &'a str,
    pub readiness: Readiness<'a>,
    pub providers: Providers<'a>,
    pub observed_at: DateTime<Utc>,
}

fn present(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// The device key of a node, and whether the name was missing so the UUID
/// was used instead.
pub fn node_key(site: &str, key_by: KeyBy, n: &Node) -> (v1::DeviceKey, bool) {
    match (key_by, present(&n.name)) {
        (KeyBy::Name, Some(name)) => (key(site, KeyKind::Name, name), false),
        (KeyBy::Name, None) => (key(site, KeyKind::InfrastructureRef, &n.uuid), true),
        (KeyBy::InfrastructureRef, _) => (key(site, KeyKind::InfrastructureRef, &n.uuid), false),
    }
}

fn provision_conditions(n: &Node) -> [v1::Condition; 2] {
    const MISSING: &str = "ProvisionStateMissing";
    let Some(state) = present(&n.provision_state) else {
        let msg = "ironic reports no provision_state";
        return [
            condition(T::IronicProvisionHealthy, S::Unknown, MISSING, msg),
            condition(T::IronicAvailable, S::Unknown, MISSING, msg),
        ];
    };
    let camel = ironic::reason(state);
    let healthy = if ironic::is_failure(state) {
        let msg = match present(&n.last_error) {
            Some(e) => format!("provision_state {state}: {e}"),
            None => format!("provision_state {state}"),
        };
        condition(T::IronicProvisionHealthy, S::False, &camel, msg)
    } else {
        condition(
            T::IronicProvisionHealthy,
            S::True,
            &camel,
            format!("provision_state {state}"),
        )
    };
    let available = if state == "available" {
        condition(T::IronicAvailable, S::True, "ProvisionStateAvailable", "")
    } else {
        condition(
            T::IronicAvailable,
            S::False,
            &camel,
            format!("provision_state {state}"),
        )
    };
    [healthy, available]
}

fn customer_ready(n: &Node, c: &Context<'_>) -> v1::Condition {
    let t = c.customer_ready_trait;
    let has = match c.readiness {
        Readiness::Unreadable(msg) => {
            return condition(T::CustomerReady, S::Unknown, PLACEMENT_UNREACHABLE, msg)
        }
        Readiness::Placement(ids) => ids.contains(&n.uuid),
        Readiness::NodeTraits => match &n.traits {
            None => {
                return condition(
                    T::CustomerReady,
                    S::Unknown,
                    "TraitsNotReported",
                    "ironic returned no traits (API microversion below 1.37?)",
                )
            }
            Some(traits) => traits.iter().any(|x| x == t),
        },
    };
    let whose = match c.readiness {
        Readiness::Placement(_) => "the resource provider",
        _ => "the ironic node",
    };
    if has {
        condition(
            T::CustomerReady,
            S::True,
            "TraitPresent",
            format!("{whose} carries {t}"),
        )
    } else {
        condition(
            T::CustomerReady,
            S::False,
            "TraitAbsent",
            format!("{whose} lacks {t}"),
        )
    }
}

fn maintenance_pool(n: &Node, project: &str) -> v1::Condition {
    if project.is_empty() {
        return condition(
            T::InMaintenancePool,
            S::Unknown,
            "MaintenanceProjectNotConfigured",
            "no maintenance project is configured for the site",
        );
    }
    match present(&n.lessee) {
        Some(l) if l == project => condition(
            T::InMaintenancePool,
            S::True,
            "MaintenanceProjectLessee",
            format!("lessee {l}"),
        ),
        Some(l) => condition(
            T::InMaintenancePool,
            S::False,
            "CustomerLessee",
            format!("lessee {l}"),
        ),
        None => condition(T::InMaintenancePool, S::False, "NoLessee", ""),
    }
}

/// The snapshot of one node, and whether its key fell back to the UUID.
pub fn map_node(n: &Node, c: &Context<'_>) -> (v1::ConditionSnapshot, bool) {
    let (k, fell_back) = node_key(c.site, c.key_by, n);
    let maintenance = n.maintenance.unwrap_or(false);
    let [healthy, available] = provision_conditions(n);
    let conditions = vec![
        healthy,
        if maintenance {
            condition(
                T::IronicMaintenance,
                S::True,
                "MaintenanceSet",
                present(&n.maintenance_reason).unwrap_or_default(),
            )
        } else {
            condition(T::IronicMaintenance, S::False, "MaintenanceUnset", "")
        },
        available,
        match present(&n.instance_uuid) {
            Some(i) => condition(
                T::InstanceAllocated,
                status(true),
                "InstanceBound",
                format!("instance {i}"),
            ),
            None => condition(T::InstanceAllocated, status(false), "NoInstance", ""),
        },
        customer_ready(n, c),
        maintenance_pool(n, c.maintenance_project_id),
    ];
    let mirror = v1::IronicMirror {
        provision_state: present(&n.provision_state).unwrap_or_default().to_string(),
        maintenance,
        maintenance_reason: present(&n.maintenance_reason)
            .unwrap_or_default()
            .to_string(),
        instance_uuid: present(&n.instance_uuid).unwrap_or_default().to_string(),
        lessee: present(&n.lessee).unwrap_or_default().to_string(),
        power_state: present(&n.power_state).unwrap_or_default().to_string(),
        node_uuid: n.uuid.clone(),
    };
    let mut snap = snapshot(
        Source::Openstack,
        k,
        c.observed_at,
        conditions,
        Some(Mirror::Ironic(mirror)),
    );
    snap.resource_bindings
        .extend(placement_binding(n, c.providers));
    (snap, fell_back)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DETAIL: &str = include_str!("../testdata/ironic-nodes-detail.json");
    const MAINT: &str = include_str!("../testdata/ironic-node-maintenance.json");
    const ACTIVE: &str = include_str!("../testdata/ironic-node-active.json");
    const TRAIT: &str = "CUSTOM_CUSTOMER_READY";
    const MAINT_PROJECT: &str = "slurm-project";

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-29T16:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn ctx(readiness: Readiness<'_>) -> Context<'_> {
        Context {
            site: "s1",
            key_by: KeyBy::Name,
            customer_ready_trait: TRAIT,
            maintenance_project_id: MAINT_PROJECT,
            readiness,
            providers: Providers::NotUsed,
            observed_at: at(),
        }
    }

    #[test]
    fn the_placement_binding_is_the_nodes_resource_provider() {
        let page: NodesPage = serde_json::from_str(DETAIL).unwrap();
        let n = &page.nodes[0];
        let ready = HashSet::new();
        let listed: HashSet<String> = [n.uuid.clone()].into();
        let binding = |providers| {
            let c = Context {
                providers,
                ..ctx(Readiness::Placement(&ready))
            };
            map_node(n, &c).0.resource_bindings
        };
        let b = binding(Providers::Listed(&listed));
        assert_eq!(
            (b[0].resource.as_str(), b[0].resource_id.as_str()),
            ("placement", n.uuid.as_str())
        );
        let b = binding(Providers::Listed(&ready));
        assert_eq!(
            (b[0].resource_id.as_str(), b[0].reason.as_str()),
            ("", RESOURCE_PROVIDER_MISSING)
        );
        let b = binding(Providers::Unreadable("placement did not answer"));
        assert_eq!(b[0].reason, PLACEMENT_UNREACHABLE);
        assert_eq!(b[0].message, "placement did not answer");
        // Standalone Ironic: no binding at all.
        assert!(binding(Providers::NotUsed).is_empty());
    }

    /// (type, status, reason) of each condition, in catalogue order.
    fn summary(s: &v1::ConditionSnapshot) -> Vec<(String, String, String)> {
        s.conditions
            .iter()
            .map(|c| (c.r#type.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    }

    fn get<'a>(s: &'a v1::ConditionSnapshot, t: &str) -> &'a v1::Condition {
        s.conditions.iter().find(|c| c.r#type == t).unwrap()
    }

    fn mirror(s: &v1::ConditionSnapshot) -> &v1::IronicMirror {
        match &s.mirror {
            Some(Mirror::Ironic(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_detail_sample_with_placement() {
        let page: NodesPage = serde_json::from_str(DETAIL).unwrap();
        // gpu-node-01 carries the trait in Placement.
        let ready: HashSet<String> = ["ca5ca20a-4cd7-4c68-8d6b-b5961e606470".to_string()].into();
        let c = ctx(Readiness::Placement(&ready));
        let snaps: Vec<_> = page.nodes.iter().map(|n| map_node(n, &c).0).collect();
        let r = |t: &str, s: &str, why: &str| (t.to_string(), s.to_string(), why.to_string());
        assert_eq!(
            summary(&snaps[0]),
            vec![
                r("IronicProvisionHealthy", "True", "Active"),
                r("IronicMaintenance", "False", "MaintenanceUnset"),
                r("IronicAvailable", "False", "Active"),
                r("InstanceAllocated", "True", "InstanceBound"),
                r("CustomerReady", "True", "TraitPresent"),
                r("InMaintenancePool", "False", "CustomerLessee"),
            ],
            "gpu-node-01: active, bound, customer-ready: in_use"
        );
        let k = snaps[0].device.as_ref().unwrap();
        assert_eq!(
            (k.site.as_str(), k.kind.as_str(), k.key.as_str()),
            ("s1", "name", "gpu-node-01")
        );
        assert_eq!(
            summary(&snaps[1]),
            vec![
                r("IronicProvisionHealthy", "True", "Enroll"),
                r("IronicMaintenance", "False", "MaintenanceUnset"),
                r("IronicAvailable", "False", "Enroll"),
                r("InstanceAllocated", "False", "NoInstance"),
                r("CustomerReady", "False", "TraitAbsent"),
                r("InMaintenancePool", "False", "NoLessee"),
            ]
        );
        let n4 = &snaps[3];
        assert_eq!(get(n4, "IronicMaintenance").status, "True");
        assert_eq!(
            get(n4, "IronicMaintenance").message,
            "GPU 3 fell off the bus"
        );
        assert_eq!(get(n4, "IronicAvailable").status, "True");
        let m = mirror(&snaps[0]);
        assert_eq!(
            (
                m.provision_state.as_str(),
                m.lessee.as_str(),
                m.power_state.as_str(),
                m.maintenance
            ),
            ("active", "tenant-a", "power on", false)
        );
        assert_eq!(m.instance_uuid, "6ee7302a-98da-458d-84b7-ba8db9d850de");
        assert_eq!(mirror(&snaps[1]).power_state, "");
    }

    #[test]
    fn single_node_samples() {
        let ready = HashSet::new();
        let maint: Node = serde_json::from_str(MAINT).unwrap();
        let (s, _) = map_node(&maint, &ctx(Readiness::Placement(&ready)));
        assert_eq!(get(&s, "IronicMaintenance").reason, "MaintenanceSet");
        assert!(mirror(&s).maintenance);
        assert_eq!(mirror(&s).maintenance_reason, "GPU 3 fell off the bus");
        let active: Node = serde_json::from_str(ACTIVE).unwrap();
        let (s, _) = map_node(&active, &ctx(Readiness::NodeTraits));
        assert_eq!(get(&s, "CustomerReady").reason, "TraitAbsent");
    }

    #[test]
    fn every_failure_state_is_unhealthy_with_its_camel_case_reason() {
        for state in ironic::STATES {
            let n = Node {
                uuid: "u".into(),
                name: Some("n".into()),
                provision_state: Some(state.to_string()),
                last_error: Some("boom".into()),
                ..Default::default()
            };
            let (s, _) = map_node(&n, &ctx(Readiness::NodeTraits));
            let h = get(&s, "IronicProvisionHealthy");
            let failed = ironic::is_failure(state);
            assert_eq!(h.status, if failed { "False" } else { "True" }, "{state}");
            assert_eq!(h.reason, ironic::reason(state), "{state}");
            if failed {
                assert_eq!(h.message, format!("provision_state {state}: boom"));
            }
            assert_eq!(
                get(&s, "IronicAvailable").status,
                if *state == "available" {
                    "True"
                } else {
                    "False"
                },
                "{state}"
            );
            assert_eq!(mirror(&s).provision_state, *state);
        }
        let expected = [
            ("deploy failed", "DeployFailed"),
            ("clean failed", "CleanFailed"),
            ("inspect failed", "InspectFailed"),
            ("rescue failed", "RescueFailed"),
            ("unrescue failed", "UnrescueFailed"),
            ("adopt failed", "AdoptFailed"),
            ("service failed", "ServiceFailed"),
            ("error", "Error"),
        ];
        for (state, reason) in expected {
            let n = Node {
                uuid: "u".into(),
                provision_state: Some(state.into()),
                ..Default::default()
            };
            let (s, _) = map_node(&n, &ctx(Readiness::NodeTraits));
            let h = get(&s, "IronicProvisionHealthy");
            assert_eq!((h.status.as_str(), h.reason.as_str()), ("False", reason));
            assert_eq!(h.message, format!("provision_state {state}"));
        }
        let none = Node {
            uuid: "u".into(),
            ..Default::default()
        };
        let (s, _) = map_node(&none, &ctx(Readiness::NodeTraits));
        assert_eq!(get(&s, "IronicProvisionHealthy").status, "Unknown");
        assert_eq!(get(&s, "IronicAvailable").status, "Unknown");
    }

    #[test]
    fn maintenance_lessee_instance_and_readiness_combinations() {
        let ready: HashSet<String> = ["u-ready".to_string()].into();
        let unreadable = "http://placement/resource_providers did not answer";
        // (maintenance, lessee, instance, uuid, readiness) -> expected statuses
        // of IronicMaintenance, InstanceAllocated, CustomerReady, InMaintenancePool
        type Case<'a> = (
            bool,
            Option<&'a str>,
            Option<&'a str>,
            &'a str,
            Readiness<'a>,
            [&'a str; 4],
        );
        let cases: Vec<Case> = vec![
            (
                false,
                None,
                None,
                "u1",
                Readiness::Placement(&ready),
                ["False", "False", "False", "False"],
            ),
            (
                true,
                None,
                None,
                "u1",
                Readiness::Placement(&ready),
                ["True", "False", "False", "False"],
            ),
            (
                false,
                Some(MAINT_PROJECT),
                None,
                "u1",
                Readiness::Placement(&ready),
                ["False", "False", "False", "True"],
            ),
            (
                false,
                Some(MAINT_PROJECT),
                Some("i-1"),
                "u-ready",
                Readiness::Placement(&ready),
                ["False", "True", "True", "True"],
            ),
            (
                false,
                Some("customer-x"),
                Some("i-1"),
                "u-ready",
                Readiness::Placement(&ready),
                ["False", "True", "True", "False"],
            ),
            (
                true,
                Some(MAINT_PROJECT),
                Some(""),
                "u-ready",
                Readiness::Placement(&ready),
                ["True", "False", "True", "True"],
            ),
            (
                false,
                Some(""),
                None,
                "u1",
                Readiness::Unreadable(unreadable),
                ["False", "False", "Unknown", "False"],
            ),
            (
                false,
                None,
                Some("i-2"),
                "u1",
                Readiness::NodeTraits,
                ["False", "True", "True", "False"],
            ),
        ];
        for (maintenance, lessee, instance, uuid, readiness, want) in cases {
            let n = Node {
                uuid: uuid.into(),
                name: Some("gpu-a".into()),
                provision_state: Some("active".into()),
                maintenance: Some(maintenance),
                lessee: lessee.map(String::from),
                instance_uuid: instance.map(String::from),
                traits: Some(vec!["HW_CPU_X86_AVX2".into(), TRAIT.into()]),
                ..Default::default()
            };
            let (s, _) = map_node(&n, &ctx(readiness));
            let got = [
                get(&s, "IronicMaintenance").status.as_str(),
                get(&s, "InstanceAllocated").status.as_str(),
                get(&s, "CustomerReady").status.as_str(),
                get(&s, "InMaintenancePool").status.as_str(),
            ];
            assert_eq!(got, want, "maintenance {maintenance} lessee {lessee:?} instance {instance:?} uuid {uuid} {readiness:?}");
            assert_eq!(s.conditions.len(), 6);
        }
        let unreadable_snap = map_node(
            &Node {
                uuid: "u".into(),
                ..Default::default()
            },
            &ctx(Readiness::Unreadable(unreadable)),
        )
        .0;
        let cr = get(&unreadable_snap, "CustomerReady");
        assert_eq!(
            (cr.reason.as_str(), cr.message.as_str()),
            (PLACEMENT_UNREACHABLE, unreadable)
        );
    }

    #[test]
    fn traits_absent_unconfigured_project_and_key_choice() {
        let n = Node {
            uuid: "9f1c".into(),
            name: None,
            provision_state: Some("available".into()),
            lessee: Some("p".into()),
            traits: None,
            ..Default::default()
        };
        let mut c = ctx(Readiness::NodeTraits);
        c.maintenance_project_id = "";
        let (s, fell_back) = map_node(&n, &c);
        assert!(fell_back);
        let k = s.device.as_ref().unwrap();
        assert_eq!(
            (k.kind.as_str(), k.key.as_str()),
            ("infrastructure_ref", "9f1c")
        );
        assert_eq!(get(&s, "CustomerReady").reason, "TraitsNotReported");
        assert_eq!(get(&s, "InMaintenancePool").status, "Unknown");
        c.key_by = KeyBy::InfrastructureRef;
        let named = Node {
            name: Some("gpu-x".into()),
            ..n
        };
        let (s, fell_back) = map_node(&named, &c);
        assert!(!fell_back);
        assert_eq!(s.device.as_ref().unwrap().key, "9f1c");
        assert_eq!(KeyBy::parse("uuid"), Ok(KeyBy::InfrastructureRef));
        assert!(KeyBy::parse("serial").is_err());
    }

    #[test]
    fn placement_ids_and_malformed_bodies() {
        let rp: ResourceProviders = serde_json::from_value(serde_json::json!({
            "resource_providers": [
                {"uuid": "a", "name": "a", "generation": 3},
                {"uuid": "b", "name": "compute-1"}
            ]
        }))
        .unwrap();
        let ids = rp.ids();
        assert!(ids.contains("a") && ids.contains("b") && ids.contains("compute-1"));
        for body in [
            r#"{"nodes": [{"name": "x"}]}"#,
            r#"{"node": []}"#,
            r#"{"nodes": [{"uuid": "u", "maintenance": "yes"}]}"#,
        ] {
            assert!(serde_json::from_str::<NodesPage>(body).is_err(), "{body}");
        }
        assert!(serde_json::from_str::<ResourceProviders>(r#"{"providers": []}"#).is_err());
    }
}
