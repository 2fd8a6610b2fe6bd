//! NetBox device JSON to snapshots and device creations. Pure: no IO.
//! NetBox owns no condition types: its snapshot carries the NetBox mirror
//! (inventory status, provisioning tags, name, id, serial, rack) only.

use chrono::{DateTime, Utc};
use fleet_connector::snapshot::{key, snapshot};
use fleet_domain::{InventoryStatus, KeyKind, Source};
use fleet_proto::v1::{self, condition_snapshot::Mirror};
use serde::Deserialize;

/// The fields of a NetBox device the connector reads; everything else is
/// ignored, and every field but `id` may be missing (`?brief=true`) or null.
#[derive(Debug, Clone, Deserialize)]
pub struct Device {
    pub id: i64,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub status: Option<Choice>,
    #[serde(default)]
    pub serial: Option<String>,
    #[serde(default)]
    pub site: Option<Nested>,
    #[serde(default)]
    pub rack: Option<Nested>,
    #[serde(default)]
    pub tags: Option<Vec<Nested>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Choice {
    pub value: String,
}

/// A nested object (site, rack, tag): NetBox gives `name` and usually `slug`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Nested {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub slug: Option<String>,
}

/// The provisioning tags of seed 002, as stored (`netbox_tags`), with the
/// slug NetBox derives from each name.
pub const PROVISIONING_TAGS: [(&str, &str); 5] = [
    ("Not Started", "not-started"),
    ("DHCP Configured", "dhcp-configured"),
    ("BMC Configured", "bmc-configured"),
    ("Ironic Enrolled", "ironic-enrolled"),
    ("Provisioned", "provisioned"),
];

/// Something the mapping could not use, for the caller to log and count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// A device without a name cannot be keyed by name.
    Unnamed { netbox_id: i64 },
    /// A device of another site (the `?site=` filter was not applied).
    OtherSite { netbox_id: i64, site: String },
    /// A status value outside the inventory vocabulary; stored as `unknown`.
    UnknownStatus { name: String, value: String },
}

impl Warning {
    pub fn kind(&self) -> &'static str {
        match self {
            Warning::Unnamed { .. } => "unnamed_device",
            Warning::OtherSite { .. } => "other_site",
            Warning::UnknownStatus { .. } => "unknown_status",
        }
    }
}

#[derive(Debug, Default)]
pub struct Mapped {
    pub snapshots: Vec<v1::ConditionSnapshot>,
    /// One per named device: what `create_devices` sends if the hub does not
    /// know it yet.
    pub creates: Vec<v1::CreateDevice>,
    pub warnings: Vec<Warning>,
}

/// The inventory status of `status.value`; `None` for a value outside the
/// vocabulary.
pub fn inventory_status(value: &str) -> Option<InventoryStatus> {
    InventoryStatus::parse(value.trim().to_ascii_lowercase().as_str()).ok()
}

fn slugish(s: &str) -> String {
    s.trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c == '_' || c == ' ' { '-' } else { c })
        .collect()
}

/// The provisioning tags among a device's tags, matched by name or slug
/// (case-insensitive), in the pipeline order, each once. Other tags are not
/// provisioning tags and are left out.
pub fn provisioning_tags(tags: &[Nested]) -> Vec<String> {
    PROVISIONING_TAGS
        .iter()
        .filter(|(name, slug)| {
            tags.iter().any(|t| {
                t.name
                    .as_deref()
                    .is_some_and(|n| n.trim().eq_ignore_ascii_case(name) || slugish(n) == *slug)
                    || t.slug.as_deref().is_some_and(|s| slugish(s) == *slug)
            })
        })
        .map(|(name, _)| name.to_string())
        .collect()
}

fn non_empty(s: Option<&str>) -> String {
    s.map(str::trim).unwrap_or_default().to_string()
}

/// Maps the devices of one NetBox site (`slug`) to snapshots for the fleet
/// site `site`, keyed by name.
pub fn map_devices(site: &str, slug: &str, devices: &[Device], at: DateTime<Utc>) -> Mapped {
    let mut out = Mapped::default();
    for d in devices {
        let Some(name) = d.name.as_deref().map(str::trim).filter(|n| !n.is_empty()) else {
            out.warnings.push(Warning::Unnamed { netbox_id: d.id });
            continue;
        };
        if let Some(other) = d
            .site
            .as_ref()
            .and_then(|s| s.slug.as_deref())
            .filter(|s| !s.eq_ignore_ascii_case(slug))
        {
            out.warnings.push(Warning::OtherSite {
                netbox_id: d.id,
                site: other.to_string(),
            });
            continue;
        }
        // Absent status (a brief listing) keeps the last known value.
        let status = match &d.status {
            None => String::new(),
            Some(c) => match inventory_status(&c.value) {
                Some(s) => s.as_str().to_string(),
                None => {
                    out.warnings.push(Warning::UnknownStatus {
                        name: name.to_string(),
                        value: c.value.clone(),
                    });
                    InventoryStatus::Unknown.as_str().to_string()
                }
            },
        };
        let rack = non_empty(d.rack.as_ref().and_then(|r| r.name.as_deref()));
        let serial = non_empty(d.serial.as_deref());
        let mirror = v1::NetboxMirror {
            status: status.clone(),
            tags: provisioning_tags(d.tags.as_deref().unwrap_or_default()),
            name: name.to_string(),
            netbox_id: d.id,
            serial: serial.clone(),
            rack: rack.clone(),
        };
        out.snapshots.push(snapshot(
            Source::Netbox,
            key(site, KeyKind::Name, name),
            at,
            vec![],
            Some(Mirror::Netbox(mirror)),
        ));
        out.creates.push(v1::CreateDevice {
            site: site.to_string(),
            name: name.to_string(),
            serial,
            netbox_id: d.id,
            rack,
            inventory_status: status,
            ..Default::default()
        });
    }
    out
}

/// A device the previous read listed and this one does not (deleted in
/// NetBox, or moved to a site this connector does not read): its
/// inventory status goes `unknown` and its provisioning tags are cleared,
/// so it is no longer `active` (nor customer-ready) and the change is a
/// lifecycle row on the inventory axis. A device listed again takes
/// NetBox's status back on the next read.
pub fn vanished(key: &v1::DeviceKey, at: DateTime<Utc>) -> v1::ConditionSnapshot {
    snapshot(
        Source::Netbox,
        key.clone(),
        at,
        vec![],
        Some(Mirror::Netbox(v1::NetboxMirror {
            status: InventoryStatus::Unknown.as_str().into(),
            name: key.key.clone(),
            ..Default::default()
        })),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    type DevicePage = fleet_netbox::Page<Device>;

    #[test]
    fn a_vanished_device_is_marked_unknown_without_tags() {
        let k = key("s1", KeyKind::Name, "gpu05");
        let s = vanished(&k, at());
        assert_eq!(s.device.as_ref(), Some(&k));
        let m = mirror(&s);
        assert_eq!((m.status.as_str(), m.tags.len()), ("unknown", 0));
        assert!(s.conditions.is_empty(), "netbox owns no conditions");
    }

    const SAMPLE: &str = include_str!("../testdata/netbox-devices.json");
    const BRIEF: &str = include_str!("../testdata/netbox-devices-offline-brief.json");

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-29T16:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn mirror(s: &v1::ConditionSnapshot) -> &v1::NetboxMirror {
        match &s.mirror {
            Some(Mirror::Netbox(m)) => m,
            other => panic!("not a netbox mirror: {other:?}"),
        }
    }

    fn device(json: serde_json::Value) -> Device {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_sample_maps_status_name_serial_and_no_conditions() {
        let page: DevicePage = serde_json::from_str(SAMPLE).unwrap();
        assert_eq!(page.next, None);
        let m = map_devices("s1", "dc1", &page.results, at());
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        let got: Vec<(String, String, String, i64, Vec<String>)> = m
            .snapshots
            .iter()
            .map(|s| {
                let k = s.device.as_ref().unwrap();
                let n = mirror(s);
                assert_eq!((k.site.as_str(), k.kind.as_str()), ("s1", "name"));
                assert!(s.conditions.is_empty(), "netbox owns no condition types");
                assert_eq!(s.source, "netbox");
                (
                    k.key.clone(),
                    n.status.clone(),
                    n.serial.clone(),
                    n.netbox_id,
                    n.tags.clone(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "gpu01".into(),
                    "active".into(),
                    "SN-GPU-0001".into(),
                    1,
                    vec![]
                ),
                (
                    "gpu02".into(),
                    "planned".into(),
                    "SN-GPU-0002".into(),
                    2,
                    vec![]
                ),
                (
                    "gpu03".into(),
                    "offline".into(),
                    "SN-GPU-0003".into(),
                    3,
                    vec![]
                ),
            ],
            "the `slurm` tag is not a provisioning tag"
        );
        let c = &m.creates[1];
        assert_eq!(
            (
                c.site.as_str(),
                c.name.as_str(),
                c.netbox_id,
                c.inventory_status.as_str()
            ),
            ("s1", "gpu02", 2, "planned")
        );
    }

    #[test]
    fn a_brief_listing_keeps_the_last_known_status() {
        let page: DevicePage = serde_json::from_str(BRIEF).unwrap();
        let m = map_devices("s1", "dc1", &page.results, at());
        assert_eq!(m.snapshots.len(), 1);
        assert_eq!(mirror(&m.snapshots[0]).status, "");
        assert_eq!(m.creates[0].inventory_status, "");
    }

    #[test]
    fn every_netbox_status_maps_to_inventory_status() {
        let cases = [
            ("offline", "offline"),
            ("active", "active"),
            ("planned", "planned"),
            ("staged", "staged"),
            ("failed", "failed"),
            ("inventory", "inventory"),
            ("decommissioning", "decommissioning"),
            ("Active", "active"),
            ("rma", "rma"),
            ("broken-custom-status", "unknown"),
            ("", "unknown"),
        ];
        for (value, want) in cases {
            let d = device(serde_json::json!({
                "id": 7, "name": "gpu07", "status": {"value": value, "label": value},
                "site": {"slug": "dc1", "name": "DC1"}
            }));
            let m = map_devices("s1", "dc1", &[d], at());
            assert_eq!(mirror(&m.snapshots[0]).status, want, "status {value:?}");
            let warned = m
                .warnings
                .iter()
                .any(|w| matches!(w, Warning::UnknownStatus { .. }));
            assert_eq!(warned, want == "unknown", "status {value:?}");
        }
    }

    #[test]
    fn provisioning_tags_match_by_name_or_slug_in_pipeline_order() {
        let t = |name: Option<&str>, slug: Option<&str>| Nested {
            name: name.map(String::from),
            slug: slug.map(String::from),
        };
        let cases: Vec<(Vec<Nested>, Vec<&str>)> = vec![
            (vec![], vec![]),
            (vec![t(Some("slurm"), Some("slurm"))], vec![]),
            (
                vec![t(Some("Not Started"), Some("not-started"))],
                vec!["Not Started"],
            ),
            (
                vec![t(None, Some("dhcp-configured"))],
                vec!["DHCP Configured"],
            ),
            (
                vec![t(Some("bmc configured"), None)],
                vec!["BMC Configured"],
            ),
            (
                vec![t(Some("x"), Some("ironic_enrolled"))],
                vec!["Ironic Enrolled"],
            ),
            (
                vec![
                    t(Some("Provisioned"), Some("provisioned")),
                    t(Some("DHCP Configured"), Some("dhcp-configured")),
                    t(Some("BMC Configured"), Some("bmc-configured")),
                    t(Some("Ironic Enrolled"), Some("ironic-enrolled")),
                    t(Some("gpu"), Some("gpu")),
                    t(Some("PROVISIONED"), None),
                ],
                vec![
                    "DHCP Configured",
                    "BMC Configured",
                    "Ironic Enrolled",
                    "Provisioned",
                ],
            ),
        ];
        for (tags, want) in cases {
            assert_eq!(provisioning_tags(&tags), want, "{tags:?}");
        }
    }

    #[test]
    fn unusable_devices_are_warned_about_and_skipped() {
        let devices = vec![
            device(serde_json::json!({"id": 1, "name": null})),
            device(serde_json::json!({"id": 2, "name": "  "})),
            device(serde_json::json!({"id": 3, "name": "gpu03", "site": {"slug": "dc2"}})),
            device(serde_json::json!({
                "id": 4, "name": "gpu04", "site": {"slug": "dc1"}, "rack": {"name": "r12"},
                "serial": "", "tags": null
            })),
        ];
        let m = map_devices("s1", "dc1", &devices, at());
        assert_eq!(
            m.warnings,
            vec![
                Warning::Unnamed { netbox_id: 1 },
                Warning::Unnamed { netbox_id: 2 },
                Warning::OtherSite {
                    netbox_id: 3,
                    site: "dc2".into()
                }
            ]
        );
        assert_eq!(m.snapshots.len(), 1);
        let n = mirror(&m.snapshots[0]);
        assert_eq!((n.rack.as_str(), n.serial.as_str()), ("r12", ""));
        assert_eq!(m.creates[0].rack, "r12");
    }

    #[test]
    fn malformed_pages_do_not_decode() {
        for body in [
            r#"{"count": 1, "next": null}"#,
            r#"{"results": [{"name": "gpu01"}]}"#,
            r#"{"results": "nope"}"#,
            "<html>",
        ] {
            assert!(serde_json::from_str::<DevicePage>(body).is_err(), "{body}");
        }
    }
}
