//! Conditions that recur on every poll (a device NetBox lists without a
//! name, a device the hub refuses, a duplicate key) are logged once when
//! they start and once when they end, however many polls they last; the
//! connector's warning metric counts every occurrence. One poll is one
//! round: [`Recurring::starts`] for each occurrence, then
//! [`Recurring::end_round`].

use std::collections::{HashMap, HashSet};

#[derive(Debug, Default)]
pub struct Recurring {
    /// Each active key and the rounds it has been seen in.
    active: HashMap<String, u64>,
    this_round: HashSet<String>,
}

impl Recurring {
    /// Records `key` in this round; `true` in the first round it appears
    /// (log it then), `false` while it lasts.
    pub fn starts(&mut self, key: impl Into<String>) -> bool {
        let key = key.into();
        if !self.this_round.insert(key.clone()) {
            return false;
        }
        let rounds = self.active.entry(key).or_insert(0);
        *rounds += 1;
        *rounds == 1
    }

    /// Ends the round: the keys not seen in it have ended, returned sorted
    /// with the rounds they lasted (log them once).
    pub fn end_round(&mut self) -> Vec<(String, u64)> {
        let seen = std::mem::take(&mut self.this_round);
        let mut ended: Vec<(String, u64)> = self
            .active
            .iter()
            .filter(|(k, _)| !seen.contains(*k))
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        for (k, _) in &ended {
            self.active.remove(k);
        }
        ended.sort();
        ended
    }

    /// Keys active now.
    pub fn len(&self) -> usize {
        self.active.len()
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_is_logged_when_it_starts_and_when_it_ends() {
        let mut r = Recurring::default();
        // (round's keys, the keys that start, the keys that end)
        let rounds: &[(&[&str], &[&str], &[(&str, u64)])] = &[
            (&["a", "b"], &["a", "b"], &[]),
            (&["a", "b", "a"], &[], &[]),
            (&["a"], &[], &[("b", 2)]),
            (&["a", "b"], &["b"], &[]),
            (&[], &[], &[("a", 4), ("b", 1)]),
            (&[], &[], &[]),
        ];
        for (i, (keys, starts, ends)) in rounds.iter().enumerate() {
            let started: Vec<&str> = keys.iter().copied().filter(|k| r.starts(*k)).collect();
            assert_eq!(started, *starts, "round {i}");
            let ended = r.end_round();
            let ended: Vec<(&str, u64)> = ended.iter().map(|(k, n)| (k.as_str(), *n)).collect();
            assert_eq!(ended, *ends, "round {i}");
        }
        assert!(r.is_empty());
    }
}
