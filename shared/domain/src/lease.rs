//! Hub partition leases: how many of the observation partitions one hub
//! replica should hold, and which to take or hand back, given what the
//! lease table says. Pure: the hub reads the table, asks [`plan`], and
//! writes the claims and releases (docs/scaling.md, "Partition leases").
//!
//! Safety does not rest on this plan: a claim succeeds in PostgreSQL only
//! for a free or expired lease, and every batch is fenced by its lease's
//! epoch. The plan only spreads the partitions evenly over the live
//! replicas, so that a replica that dies leaves each survivor a share.

use std::collections::BTreeSet;

/// What one replica should do with its leases this round.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeasePlan {
    /// Partitions to hand back (stop consuming, then delete the lease).
    pub release: Vec<u32>,
    /// Partitions to try to claim, lowest first.
    pub claim: Vec<u32>,
}

/// A replica's fair share: the partitions spread over the live replicas,
/// rounded up so that every partition has room for an owner.
pub fn share(partitions: u32, live_replicas: usize) -> usize {
    let live = live_replicas.max(1);
    (partitions as usize).div_ceil(live)
}

/// The round's plan for a replica that holds `held` and sees `claimable`
/// (partitions whose lease is absent or expired, or already its own), with
/// `live_replicas` replicas heartbeating, itself included.
///
/// Above its share it releases its highest partitions; below it, it
/// claims the lowest claimable ones up to the share. A replica never
/// releases and claims in the same round.
pub fn plan(
    partitions: u32,
    live_replicas: usize,
    held: &BTreeSet<u32>,
    claimable: &BTreeSet<u32>,
) -> LeasePlan {
    let share = share(partitions, live_replicas);
    // A partition the configuration no longer has is always handed back.
    let mut release: Vec<u32> = held.iter().copied().filter(|p| *p >= partitions).collect();
    let valid = held.len() - release.len();
    if valid > share {
        let extra = valid - share;
        release.extend(
            held.iter()
                .copied()
                .filter(|p| *p < partitions)
                .rev()
                .take(extra),
        );
        release.sort_unstable();
        return LeasePlan {
            release,
            claim: vec![],
        };
    }
    let claim = claimable
        .iter()
        .copied()
        .filter(|p| *p < partitions && !held.contains(p))
        .take(share - valid)
        .collect();
    LeasePlan { release, claim }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    #[test]
    fn a_lone_replica_claims_every_partition() {
        let p = plan(4, 1, &set(&[]), &set(&[0, 1, 2, 3]));
        assert_eq!(p.claim, vec![0, 1, 2, 3]);
        assert!(p.release.is_empty());
    }

    #[test]
    fn a_replica_above_its_share_hands_back_its_highest_partitions() {
        // A second replica joined: 16 partitions, 2 live, a share of 8.
        let held: BTreeSet<u32> = (0..16).collect();
        let p = plan(16, 2, &held, &set(&[]));
        assert_eq!(p.release, (8..16).collect::<Vec<_>>());
        assert!(p.claim.is_empty());
    }

    #[test]
    fn a_survivor_claims_up_to_its_new_share() {
        // Three replicas held 6, 5 and 5 of 16; one died: a share of 8.
        let held: BTreeSet<u32> = (0..6).collect();
        let claimable: BTreeSet<u32> = (11..16).collect();
        let p = plan(16, 2, &held, &claimable);
        assert_eq!(p.claim, vec![11, 12]);
        assert!(p.release.is_empty());
    }

    #[test]
    fn partitions_the_configuration_no_longer_has_are_released() {
        let p = plan(2, 1, &set(&[0, 1, 5]), &set(&[]));
        assert_eq!(p.release, vec![5]);
        assert!(p.claim.is_empty());
    }

    #[test]
    fn the_share_rounds_up_and_never_divides_by_zero() {
        assert_eq!(share(16, 3), 6);
        assert_eq!(share(16, 0), 16);
        assert_eq!(share(1, 3), 1);
    }

    /// Replicas taking turns with the plan against one lease table always
    /// end with every partition owned exactly once, whatever the number of
    /// replicas.
    #[test]
    fn rounds_converge_to_every_partition_owned_once() {
        for partitions in [1u32, 4, 16, 17] {
            for replicas in 1..=5usize {
                let mut owner: Vec<Option<usize>> = vec![None; partitions as usize];
                for _round in 0..10 {
                    for r in 0..replicas {
                        let held: BTreeSet<u32> = (0..partitions)
                            .filter(|p| owner[*p as usize] == Some(r))
                            .collect();
                        let claimable: BTreeSet<u32> = (0..partitions)
                            .filter(|p| owner[*p as usize].is_none())
                            .collect();
                        let lp = plan(partitions, replicas, &held, &claimable);
                        for p in lp.release {
                            owner[p as usize] = None;
                        }
                        for p in lp.claim {
                            assert!(owner[p as usize].is_none(), "claimed only when free");
                            owner[p as usize] = Some(r);
                        }
                    }
                }
                assert!(
                    owner.iter().all(Option::is_some),
                    "{partitions}/{replicas}: {owner:?}"
                );
                let most = (0..replicas)
                    .map(|r| owner.iter().filter(|o| **o == Some(r)).count())
                    .max()
                    .unwrap();
                assert!(most <= share(partitions, replicas));
            }
        }
    }
}
