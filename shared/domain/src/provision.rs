//! The provision state table of `device.md`. Anything not listed is
//! `INVALID_STATE`; `failed` can only go back to where it failed from.

use crate::error::DomainError;
use crate::vocab::ProvisionState::{self, *};

/// Legal moves out of `from`, `failed` excepted.
pub fn legal_targets(from: ProvisionState) -> &'static [ProvisionState] {
    match from {
        Adopting => &[Adopted, Failed],
        Enrolling => &[Inspecting, Failed],
        Inspecting => &[Commissioning, Failed],
        Commissioning => &[Ready, Failed],
        Ready => &[Deploying, Retiring],
        Deploying => &[Deployed, Failed],
        Deployed => &[Releasing, Rescue, Retiring],
        Rescue => &[Deployed, Failed],
        Releasing => &[Ready, Failed],
        Adopted => &[Retiring],
        Retiring => &[Retired, Failed],
        Retired | Failed => &[],
    }
}

/// The effect of a legal move on the other axes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub to: ProvisionState,
    /// Set on entering `failed`, cleared on recovering.
    pub failed_from: Option<ProvisionState>,
    /// "Entering failed records failed_from and turns maintenance on".
    pub maintenance_on: bool,
}

pub fn check_move(
    from: ProvisionState,
    failed_from: Option<ProvisionState>,
    to: ProvisionState,
) -> Result<Move, DomainError> {
    if from == Failed {
        return match failed_from {
            Some(back) if back == to => Ok(Move {
                to,
                failed_from: None,
                maintenance_on: false,
            }),
            _ => Err(DomainError::InvalidState(format!(
                "provision_state failed can only recover to {}, not {to}",
                failed_from.map_or("its recorded failed_from (none recorded)", |s| s.as_str())
            ))),
        };
    }
    if !legal_targets(from).contains(&to) {
        return Err(DomainError::InvalidState(format!(
            "provision_state cannot move from {from} to {to}"
        )));
    }
    if to == Failed {
        Ok(Move {
            to,
            failed_from: Some(from),
            maintenance_on: true,
        })
    } else {
        Ok(Move {
            to,
            failed_from: None,
            maintenance_on: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_is_legal_exactly_when_the_table_says() {
        let table: &[(ProvisionState, &[ProvisionState])] = &[
            (Adopting, &[Adopted, Failed]),
            (Enrolling, &[Inspecting, Failed]),
            (Inspecting, &[Commissioning, Failed]),
            (Commissioning, &[Ready, Failed]),
            (Ready, &[Deploying, Retiring]),
            (Deploying, &[Deployed, Failed]),
            (Deployed, &[Releasing, Rescue, Retiring]),
            (Rescue, &[Deployed, Failed]),
            (Releasing, &[Ready, Failed]),
            (Adopted, &[Retiring]),
            (Retiring, &[Retired, Failed]),
            (Retired, &[]),
        ];
        for (from, tos) in table {
            for to in ProvisionState::ALL {
                let ok = check_move(*from, None, *to).is_ok();
                assert_eq!(ok, tos.contains(to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn failure_records_failed_from_and_turns_maintenance_on() {
        let m = check_move(Deploying, None, Failed).unwrap();
        assert_eq!(m.failed_from, Some(Deploying));
        assert!(m.maintenance_on);
        // "failed can recover" to the recorded failed_from only.
        assert!(check_move(Failed, Some(Deploying), Deploying).is_ok());
        assert!(matches!(
            check_move(Failed, Some(Deploying), Ready),
            Err(DomainError::InvalidState(_))
        ));
        assert!(check_move(Failed, None, Ready).is_err());
    }
}
