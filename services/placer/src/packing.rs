//! Packing: which devices' atoms a request takes. Pure: the service feeds
//! it candidates (from its capacity view, or from PostgreSQL) and then
//! books the plan under row locks, re-checking everything.
//!
//! Rules (`consumers.md`, "placer"): fill partly used devices first (least
//! fragmentation); keep a multi-GPU request on one device or one NVLink
//! domain when asked; spread across racks only when configured.

use std::collections::{BTreeMap, BTreeSet};

/// A device with free atoms, as a planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub device_id: String,
    pub rack: Option<String>,
    pub nvlink_domain: Option<String>,
    /// GPUs on the device.
    pub total: u32,
    /// Atoms not booked.
    pub free: u32,
}

impl Candidate {
    fn partly_used(&self) -> bool {
        self.free < self.total
    }
}

/// The NVLink constraint of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Domain {
    /// No constraint.
    Any,
    /// Every atom in one domain, whichever fits best (`"*"`).
    One,
    /// Every atom in this domain.
    Named(String),
}

impl Domain {
    /// The request field: empty, `"*"`, or a domain name.
    pub fn parse(s: &str) -> Domain {
        match s.trim() {
            "" => Domain::Any,
            "*" => Domain::One,
            d => Domain::Named(d.to_string()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub gpus: u32,
    pub same_device: bool,
    pub domain: Domain,
    pub spread_racks: bool,
}

/// Atoms to take from one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Take {
    pub device_id: String,
    pub atoms: u32,
}

/// The devices (in booking order) and atom counts that satisfy `req`, or
/// `None` when the candidates cannot.
pub fn plan(req: &Request, candidates: &[Candidate]) -> Option<Vec<Take>> {
    if req.gpus == 0 {
        return None;
    }
    let usable: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.free > 0 && c.free <= c.total)
        .filter(|c| match &req.domain {
            Domain::Named(d) => c.nvlink_domain.as_deref() == Some(d.as_str()),
            Domain::Any | Domain::One => true,
        })
        .collect();
    match req.domain {
        Domain::Any | Domain::Named(_) => plan_within(req, &usable),
        Domain::One => {
            // One device is always inside one domain.
            if let Some(t) = best_single(req.gpus, &usable) {
                return Some(vec![t]);
            }
            if req.same_device {
                return None;
            }
            let mut domains: BTreeMap<&str, Vec<&Candidate>> = BTreeMap::new();
            for c in &usable {
                if let Some(d) = c.nvlink_domain.as_deref() {
                    domains.entry(d).or_default().push(c);
                }
            }
            // Fewest devices, then the tightest domain (least free left).
            domains
                .values()
                .filter_map(|cs| {
                    let free: u32 = cs.iter().map(|c| c.free).sum();
                    plan_within(req, cs).map(|p| (p.len(), free, p))
                })
                .min_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)))
                .map(|(_, _, p)| p)
        }
    }
}

/// Best fit on one device: partly used devices before empty ones, then the
/// least free atoms that still fit, then the device id (deterministic).
fn best_single(gpus: u32, cands: &[&Candidate]) -> Option<Take> {
    cands
        .iter()
        .filter(|c| c.free >= gpus)
        .min_by(|a, b| {
            (!a.partly_used(), a.free, &a.device_id).cmp(&(!b.partly_used(), b.free, &b.device_id))
        })
        .map(|c| Take {
            device_id: c.device_id.clone(),
            atoms: gpus,
        })
}

fn plan_within(req: &Request, cands: &[&Candidate]) -> Option<Vec<Take>> {
    if let Some(t) = best_single(req.gpus, cands) {
        return Some(vec![t]);
    }
    if req.same_device {
        return None;
    }
    let total_free: u64 = cands.iter().map(|c| c.free as u64).sum();
    if total_free < req.gpus as u64 {
        return None;
    }
    // Partly used devices first, the fullest-free first so few devices are
    // touched; then empty devices, largest first.
    let mut order: Vec<&Candidate> = cands.to_vec();
    order.sort_by(|a, b| {
        (!a.partly_used(), std::cmp::Reverse(a.free), &a.device_id).cmp(&(
            !b.partly_used(),
            std::cmp::Reverse(b.free),
            &b.device_id,
        ))
    });
    let mut remaining = req.gpus;
    let mut takes: Vec<Take> = Vec::new();
    let mut used: BTreeSet<&str> = BTreeSet::new();
    if req.spread_racks {
        // First pass: at most one device per rack.
        let mut racks: BTreeSet<&str> = BTreeSet::new();
        for c in &order {
            if remaining == 0 {
                break;
            }
            let rack = c.rack.as_deref().unwrap_or("");
            if !rack.is_empty() && !racks.insert(rack) {
                continue;
            }
            let n = c.free.min(remaining);
            remaining -= n;
            used.insert(&c.device_id);
            takes.push(Take {
                device_id: c.device_id.clone(),
                atoms: n,
            });
        }
    }
    for c in &order {
        if remaining == 0 {
            break;
        }
        if used.contains(c.device_id.as_str()) {
            continue;
        }
        let n = c.free.min(remaining);
        remaining -= n;
        takes.push(Take {
            device_id: c.device_id.clone(),
            atoms: n,
        });
    }
    (remaining == 0).then_some(takes)
}

/// The lowest `n` atom indices below `total` not in `booked`.
pub fn pick_atoms(total: u32, booked: &BTreeSet<u32>, n: u32) -> Option<Vec<u32>> {
    let free: Vec<u32> = (0..total)
        .filter(|a| !booked.contains(a))
        .take(n as usize)
        .collect();
    (free.len() == n as usize).then_some(free)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(id: &str, total: u32, free: u32, domain: Option<&str>, rack: Option<&str>) -> Candidate {
        Candidate {
            device_id: id.into(),
            rack: rack.map(str::to_string),
            nvlink_domain: domain.map(str::to_string),
            total,
            free,
        }
    }

    fn req(gpus: u32, same_device: bool, domain: Domain) -> Request {
        Request {
            gpus,
            same_device,
            domain,
            spread_racks: false,
        }
    }

    fn ids(p: &[Take]) -> Vec<(&str, u32)> {
        p.iter().map(|t| (t.device_id.as_str(), t.atoms)).collect()
    }

    #[test]
    fn fills_partly_used_devices_first() {
        // "fill partly used devices first (least fragmentation)"
        let cands = vec![
            c("a", 8, 8, None, None),
            c("b", 8, 3, None, None),
            c("c", 8, 5, None, None),
        ];
        assert_eq!(
            ids(&plan(&req(2, false, Domain::Any), &cands).unwrap()),
            vec![("b", 2)]
        );
        assert_eq!(
            ids(&plan(&req(4, false, Domain::Any), &cands).unwrap()),
            vec![("c", 4)]
        );
        assert_eq!(
            ids(&plan(&req(8, false, Domain::Any), &cands).unwrap()),
            vec![("a", 8)]
        );
        // Split: partly used ones are drained before an empty one is touched.
        assert_eq!(
            ids(&plan(&req(10, false, Domain::Any), &cands).unwrap()),
            vec![("c", 5), ("b", 3), ("a", 2)]
        );
    }

    #[test]
    fn same_device_never_splits() {
        // "keep a multi-GPU request on one device ... when asked"
        let cands = vec![c("a", 8, 4, None, None), c("b", 8, 4, None, None)];
        assert_eq!(plan(&req(6, true, Domain::Any), &cands), None);
        assert_eq!(
            ids(&plan(&req(6, false, Domain::Any), &cands).unwrap()),
            vec![("a", 4), ("b", 2)]
        );
    }

    #[test]
    fn nvlink_domains_are_honoured() {
        // "... or one NVLink domain when asked"
        let cands = vec![
            c("a", 4, 4, Some("nvl-1"), None),
            c("b", 4, 4, Some("nvl-2"), None),
            c("c", 4, 2, Some("nvl-2"), None),
            c("d", 4, 4, None, None),
        ];
        assert_eq!(
            ids(&plan(&req(4, false, Domain::Named("nvl-1".into())), &cands).unwrap()),
            vec![("a", 4)]
        );
        assert_eq!(
            plan(&req(5, false, Domain::Named("nvl-1".into())), &cands),
            None
        );
        // "*": one domain, whichever fits; nvl-2 holds 6.
        assert_eq!(
            ids(&plan(&req(6, false, Domain::One), &cands).unwrap()),
            vec![("c", 2), ("b", 4)]
        );
        assert_eq!(plan(&req(7, false, Domain::One), &cands), None);
        // Unconstrained, 7 fit across domains.
        assert!(plan(&req(7, false, Domain::Any), &cands).is_some());
    }

    #[test]
    fn spreads_across_racks_only_when_configured() {
        let cands = vec![
            c("a", 4, 4, None, Some("r1")),
            c("b", 4, 4, None, Some("r1")),
            c("c", 4, 4, None, Some("r2")),
        ];
        let mut r = req(8, false, Domain::Any);
        assert_eq!(ids(&plan(&r, &cands).unwrap()), vec![("a", 4), ("b", 4)]);
        r.spread_racks = true;
        assert_eq!(ids(&plan(&r, &cands).unwrap()), vec![("a", 4), ("c", 4)]);
    }

    #[test]
    fn picks_the_lowest_free_atoms() {
        let booked: BTreeSet<u32> = [0, 2].into_iter().collect();
        assert_eq!(pick_atoms(4, &booked, 2), Some(vec![1, 3]));
        assert_eq!(pick_atoms(4, &booked, 3), None);
    }

    fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
        prop::collection::vec(
            (1u32..=8, 0u32..=8, prop::option::of(0u8..3), 0u8..3),
            0..12,
        )
        .prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (total, used, dom, rack))| Candidate {
                    device_id: format!("d{i:02}"),
                    rack: Some(format!("r{rack}")),
                    nvlink_domain: dom.map(|d| format!("nvl-{d}")),
                    total,
                    free: total - used.min(total),
                })
                .collect()
        })
    }

    fn domain() -> impl Strategy<Value = Domain> {
        prop_oneof![
            Just(Domain::Any),
            Just(Domain::One),
            (0u8..3).prop_map(|d| Domain::Named(format!("nvl-{d}"))),
        ]
    }

    proptest! {
        #[test]
        fn a_plan_is_always_bookable_and_complete(
            cands in candidates(),
            gpus in 1u32..20,
            same_device: bool,
            spread_racks: bool,
            domain in domain(),
        ) {
            let r = Request { gpus, same_device, domain: domain.clone(), spread_racks };
            let by_id: BTreeMap<&str, &Candidate> = cands.iter().map(|c| (c.device_id.as_str(), c)).collect();
            match plan(&r, &cands) {
                Some(p) => {
                    prop_assert_eq!(p.iter().map(|t| t.atoms).sum::<u32>(), gpus);
                    let mut seen = BTreeSet::new();
                    for t in &p {
                        prop_assert!(seen.insert(t.device_id.clone()), "a device taken twice");
                        let c = by_id[t.device_id.as_str()];
                        prop_assert!(t.atoms >= 1 && t.atoms <= c.free);
                    }
                    if same_device {
                        prop_assert_eq!(p.len(), 1);
                    }
                    match &domain {
                        Domain::Named(d) => for t in &p {
                            prop_assert_eq!(by_id[t.device_id.as_str()].nvlink_domain.as_deref(), Some(d.as_str()));
                        },
                        Domain::One if p.len() > 1 => {
                            let ds: BTreeSet<_> = p.iter().map(|t| by_id[t.device_id.as_str()].nvlink_domain.clone()).collect();
                            prop_assert_eq!(ds.len(), 1);
                            prop_assert!(ds.iter().next().unwrap().is_some());
                        }
                        _ => {}
                    }
                }
                None => {
                    // Nothing feasible was missed.
                    let fits = |cs: &[&Candidate]| {
                        if same_device {
                            cs.iter().any(|c| c.free >= gpus)
                        } else {
                            cs.iter().map(|c| c.free).sum::<u32>() >= gpus
                        }
                    };
                    let all: Vec<&Candidate> = cands.iter().collect();
                    let feasible = match &domain {
                        Domain::Any => fits(&all),
                        Domain::Named(d) => fits(&all.iter().copied().filter(|c| c.nvlink_domain.as_deref() == Some(d.as_str())).collect::<Vec<_>>()),
                        Domain::One => all.iter().any(|c| c.free >= gpus)
                            || (0..3).any(|d| {
                                let name = format!("nvl-{d}");
                                fits(&all.iter().copied().filter(|c| c.nvlink_domain.as_deref() == Some(name.as_str())).collect::<Vec<_>>())
                            }),
                    };
                    prop_assert!(!feasible, "a feasible request was refused");
                }
            }
        }
    }
}
