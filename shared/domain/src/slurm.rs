//! The closed set of SLURM node state tokens and the normalisation of seed
//! 002, "SLURM mirrors": compound strings split, the not-responding marker
//! stripped, CLI presentation words never stored, unmodelled tokens dropped
//! with a warning naming the node and the token.

use crate::vocab::vocab;

vocab!(
    /// The 30 wire tokens (slurmrestd's node state enum).
    SlurmState, "SLURM state token" {
    Invalid => "INVALID", Unknown => "UNKNOWN", Down => "DOWN", Idle => "IDLE",
    Allocated => "ALLOCATED", Error => "ERROR", Mixed => "MIXED", Future => "FUTURE",
    Reserved => "RESERVED", Undrain => "UNDRAIN", Cloud => "CLOUD", Resume => "RESUME",
    Drain => "DRAIN", Completing => "COMPLETING", NotResponding => "NOT_RESPONDING",
    PoweredDown => "POWERED_DOWN", Fail => "FAIL", PoweringUp => "POWERING_UP",
    Maintenance => "MAINTENANCE", RebootRequested => "REBOOT_REQUESTED",
    RebootCanceled => "REBOOT_CANCELED", PoweringDown => "POWERING_DOWN",
    DynamicFuture => "DYNAMIC_FUTURE", RebootIssued => "REBOOT_ISSUED", Planned => "PLANNED",
    InvalidReg => "INVALID_REG", PowerDown => "POWER_DOWN", PowerUp => "POWER_UP",
    PowerDrain => "POWER_DRAIN", DynamicNorm => "DYNAMIC_NORM",
});

/// Tokens that make `SlurmNodeHealthy` False.
pub const BAD_TOKENS: &[SlurmState] = &[
    SlurmState::Down,
    SlurmState::Drain,
    SlurmState::Fail,
    SlurmState::NotResponding,
    SlurmState::Error,
    SlurmState::Maintenance,
    SlurmState::InvalidReg,
    SlurmState::Invalid,
];

/// The result of normalising one node's reported state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Normalised {
    /// Wire tokens, each once, in the order first reported.
    pub tokens: Vec<SlurmState>,
    /// Unmodelled tokens, dropped (the caller logs them with the node name).
    pub dropped: Vec<String>,
}

impl Normalised {
    fn push(&mut self, t: SlurmState) {
        if !self.tokens.contains(&t) {
            self.tokens.push(t);
        }
    }

    /// The first bad token, which names the `SlurmNodeHealthy` reason.
    pub fn first_bad(&self) -> Option<SlurmState> {
        self.tokens.iter().copied().find(|t| BAD_TOKENS.contains(t))
    }
}

/// CLI presentation words map onto the wire tokens they stand for, so a
/// drained node is stored as IDLE+DRAIN (seed 002) and never as DRAINED.
fn presentation(word: &str) -> Option<&'static [SlurmState]> {
    use SlurmState::*;
    Some(match word {
        "DRAINED" => &[Idle, Drain],
        "DRAINING" => &[Allocated, Drain],
        "MAINT" => &[Maintenance],
        "MIX" => &[Mixed],
        "NO_RESPOND" => &[NotResponding],
        "REBOOT" => &[RebootRequested],
        "REBOOTING" => &[RebootIssued],
        _ => return None,
    })
}

/// Normalises the tokens of one node: each entry may itself be a compound
/// (`DOWN+DRAIN`, `idle*`).
pub fn normalise<S: AsRef<str>>(reported: &[S]) -> Normalised {
    let mut out = Normalised::default();
    for entry in reported {
        for part in entry.as_ref().split('+') {
            let word = part
                .trim()
                .trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-'])
                .to_ascii_uppercase();
            if word.is_empty() {
                continue;
            }
            if let Ok(t) = SlurmState::parse(&word) {
                out.push(t);
            } else if let Some(ts) = presentation(&word) {
                ts.iter().for_each(|t| out.push(*t));
            } else if !out.dropped.contains(&word) {
                out.dropped.push(word);
            }
        }
    }
    out
}

/// CamelCase of a token for condition reasons: `NOT_RESPONDING` -> `NotResponding`.
pub fn camel(token: SlurmState) -> String {
    token
        .as_str()
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_string() + &c.as_str().to_ascii_lowercase(),
                None => String::new(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::SlurmState::*;
    use super::*;

    #[test]
    fn thirty_tokens() {
        assert_eq!(SlurmState::ALL.len(), 30);
    }

    #[test]
    fn normalisation_follows_seed_002() {
        // "A compound string (DOWN+DRAIN) is split into its parts and the
        // not-responding marker (DOWN*) is stripped"
        assert_eq!(normalise(&["DOWN+DRAIN"]).tokens, vec![Down, Drain]);
        assert_eq!(normalise(&["DOWN*"]).tokens, vec![Down]);
        // v0.0.38: lowercase state string plus uppercase flags.
        assert_eq!(
            normalise(&["idle", "DRAIN", "NOT_RESPONDING"]).tokens,
            vec![Idle, Drain, NotResponding]
        );
        // "A node displayed as DRAINED is stored as IDLE+DRAIN, one displayed
        // as DRAINING as ALLOCATED+DRAIN."
        assert_eq!(normalise(&["DRAINED"]).tokens, vec![Idle, Drain]);
        assert_eq!(normalise(&["DRAINING"]).tokens, vec![Allocated, Drain]);
        assert_eq!(normalise(&["MIX"]).tokens, vec![Mixed]);
        // "An unmodelled token is dropped, not stored."
        let n = normalise(&["IDLE", "BLOCKED_BY_FUTURE_SLURM"]);
        assert_eq!(n.tokens, vec![Idle]);
        assert_eq!(n.dropped, vec!["BLOCKED_BY_FUTURE_SLURM".to_string()]);
    }

    #[test]
    fn first_bad_token_names_the_reason() {
        let n = normalise(&["mixed", "DRAIN"]);
        assert_eq!(n.first_bad(), Some(Drain));
        assert_eq!(camel(NotResponding), "NotResponding");
        assert_eq!(normalise(&["IDLE"]).first_bad(), None);
    }
}
