//! The partner custody API's machine pages to custody snapshots. Pure: no
//! IO.
//!
//! `GET /v1/partners/{partner}/machines?page_size=&page_token=` answers
//! `{"machines": [{"serial", "state", "state_changed_at", "credential"}],
//! "next_page_token"}`; `credential` comes with `PARTNER_OWNED` and is a
//! secret. Bodies are parsed into `serde_json::Value` and read field by
//! field, so no error message ever carries a value from the body (serde's
//! typed errors quote the offending value, and the credential is in there).
//! The credential leaves this module only as a reference: the id the
//! partner gives it (`credential.id` or `credential_id`) as
//! `borneo:<id>`, else `sha256:<hex>` of the partner, serial and the
//! credential's canonical JSON.

use chrono::{DateTime, Utc};
use fleet_connector::snapshot::{key, snapshot};
use fleet_domain::{CustodyState, KeyKind, Source};
use fleet_proto::v1::{self, condition_snapshot::Mirror};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// One machine as the snapshot needs it: the credential is already a
/// reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    pub serial: String,
    pub state: String,
    pub state_changed_at: Option<DateTime<Utc>>,
    pub credential_ref: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    pub machines: Vec<Machine>,
    pub next_page_token: Option<String>,
}

/// A machine entry the mapping could not use entirely, by position (never
/// by content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// Skipped: no usable serial.
    NoSerial { index: usize },
    /// Skipped: no usable state.
    NoState { index: usize, serial: String },
    /// Kept without a time.
    BadStateChangedAt { serial: String },
    /// Skipped: a state outside the hub's custody vocabulary, which the
    /// hub would refuse.
    UnmodelledState { serial: String, state: String },
    /// `PARTNER_OWNED` without a credential.
    NoCredential { serial: String },
}

impl Warning {
    pub fn kind(&self) -> &'static str {
        match self {
            Warning::NoSerial { .. } => "no_serial",
            Warning::NoState { .. } => "no_state",
            Warning::BadStateChangedAt { .. } => "bad_state_changed_at",
            Warning::UnmodelledState { .. } => "unmodelled_state",
            Warning::NoCredential { .. } => "no_credential",
        }
    }
}

/// A JSON value with object keys sorted at every level, so a reference does
/// not depend on key order.
fn canonical(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String((*k).clone()).to_string());
                    out.push(':');
                    write(&m[k.as_str()], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut s = String::new();
    write(v, &mut s);
    s
}

/// The stored reference of a credential; `None` when there is none.
pub fn credential_ref(partner: &str, serial: &str, credential: Option<&Value>) -> Option<String> {
    let c = credential.filter(|c| !c.is_null())?;
    if let Some(obj) = c.as_object() {
        for field in ["id", "credential_id"] {
            let id = match obj.get(field) {
                Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_string()),
                Some(Value::Number(n)) => Some(n.to_string()),
                _ => None,
            };
            if let Some(id) = id {
                return Some(format!("borneo:{id}"));
            }
        }
        if obj.is_empty() {
            return None;
        }
    }
    if c.as_str().is_some_and(|s| s.is_empty()) {
        return None;
    }
    let mut h = Sha256::new();
    h.update(format!("fleet-borneo-credential\n{partner}\n{serial}\n"));
    h.update(canonical(c));
    Some(format!("sha256:{}", hex::encode(h.finalize())))
}

fn text(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Parses one page. A body that is not the page shape is an error that
/// names what was wrong and where, never a value.
pub fn parse_page(body: &[u8], partner: &str) -> Result<(Page, Vec<Warning>), String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        // Syntax errors carry a position only; keep it that way.
        format!(
            "not JSON ({} at line {} column {})",
            category(&e),
            e.line(),
            e.column()
        )
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| "the body is not a JSON object".to_string())?;
    let machines = match obj.get("machines") {
        Some(Value::Array(a)) => a,
        // An empty page may leave the list out.
        None | Some(Value::Null) => &Vec::new() as &Vec<Value>,
        Some(_) => return Err("\"machines\" is not a list".into()),
    };
    let next_page_token = match obj
        .get("next_page_token")
        .or_else(|| obj.get("nextPageToken"))
    {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(s.trim().to_string()),
        Some(_) => return Err("\"next_page_token\" is not a string".into()),
    };
    let mut page = Page {
        machines: Vec::with_capacity(machines.len()),
        next_page_token,
    };
    let mut warnings = Vec::new();
    for (index, m) in machines.iter().enumerate() {
        let Some(m) = m.as_object() else {
            warnings.push(Warning::NoSerial { index });
            continue;
        };
        let Some(serial) = text(m.get("serial")) else {
            warnings.push(Warning::NoSerial { index });
            continue;
        };
        let Some(state) = text(m.get("state")) else {
            warnings.push(Warning::NoState { index, serial });
            continue;
        };
        let state_changed_at = match m.get("state_changed_at") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => match DateTime::parse_from_rfc3339(s.trim()) {
                Ok(t) => Some(t.with_timezone(&Utc)),
                Err(_) => {
                    warnings.push(Warning::BadStateChangedAt {
                        serial: serial.clone(),
                    });
                    None
                }
            },
            Some(_) => {
                warnings.push(Warning::BadStateChangedAt {
                    serial: serial.clone(),
                });
                None
            }
        };
        let modelled = CustodyState::parse(&state).ok();
        if modelled.is_none() {
            // The hub refuses a custody state outside its vocabulary: the
            // machine is left out (its last custody stands) and warned of.
            warnings.push(Warning::UnmodelledState {
                serial: serial.clone(),
                state: state.clone(),
            });
            continue;
        }
        // Only a partner-owned machine's credential is kept, as a reference.
        let credential_ref = if modelled == Some(CustodyState::PartnerOwned) {
            let r = credential_ref(partner, &serial, m.get("credential"));
            if r.is_none() {
                warnings.push(Warning::NoCredential {
                    serial: serial.clone(),
                });
            }
            r
        } else {
            None
        };
        page.machines.push(Machine {
            serial,
            state,
            state_changed_at,
            credential_ref,
        });
    }
    Ok((page, warnings))
}

fn category(e: &serde_json::Error) -> &'static str {
    match e.classify() {
        serde_json::error::Category::Io => "read error",
        serde_json::error::Category::Syntax => "syntax error",
        serde_json::error::Category::Data => "data error",
        serde_json::error::Category::Eof => "unexpected end",
    }
}

/// The custody snapshot of one machine, keyed by serial.
pub fn map_machine(site: &str, m: &Machine, at: DateTime<Utc>) -> v1::ConditionSnapshot {
    snapshot(
        Source::Borneo,
        key(site, KeyKind::Serial, &m.serial),
        at,
        vec![],
        Some(Mirror::Custody(v1::CustodyMirror {
            state: m.state.clone(),
            state_changed_at: m.state_changed_at.map(fleet_proto::timestamp),
            credential_ref: m.credential_ref.clone().unwrap_or_default(),
        })),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE1: &str = include_str!("../testdata/borneo-machines-page1.json");
    const PAGE2: &str = include_str!("../testdata/borneo-machines-page2.json");
    const SECRETS: [&str; 2] = ["s3cr3t-bmc-password", "another-s3cr3t"];

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-29T16:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn custody(s: &v1::ConditionSnapshot) -> &v1::CustodyMirror {
        match &s.mirror {
            Some(Mirror::Custody(c)) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_two_pages() {
        let (p1, w1) = parse_page(PAGE1.as_bytes(), "partner-1").unwrap();
        assert!(w1.is_empty(), "{w1:?}");
        assert_eq!(p1.next_page_token.as_deref(), Some("CAESBnBhZ2UtMg"));
        let (p2, w2) = parse_page(PAGE2.as_bytes(), "partner-1").unwrap();
        assert_eq!(p2.next_page_token, None, "an empty token ends the read");
        assert_eq!(
            w2,
            vec![Warning::UnmodelledState {
                serial: "SN-GB200-0005".into(),
                state: "PENDING_RETURN".into()
            }]
        );
        let got: Vec<(String, String, Option<String>)> = p1
            .machines
            .iter()
            .chain(&p2.machines)
            .map(|m| (m.serial.clone(), m.state.clone(), m.credential_ref.clone()))
            .collect();
        let hashed = got[3].2.clone().unwrap();
        assert!(
            hashed.starts_with("sha256:") && hashed.len() == 7 + 64,
            "{hashed}"
        );
        assert_eq!(
            got,
            vec![
                ("SN-GB200-0001".into(), "GOOGLE_OWNED".into(), None),
                (
                    "SN-GB200-0002".into(),
                    "PARTNER_OWNED".into(),
                    Some("borneo:cred-7f3a91".into())
                ),
                ("SN-GB200-0003".into(), "DRAINED".into(), None),
                ("SN-GB200-0004".into(), "PARTNER_OWNED".into(), Some(hashed)),
                // SN-GB200-0005 (PENDING_RETURN) is warned of, not
                // published: the hub refuses a state outside its vocabulary.
            ]
        );
        assert_eq!(
            p1.machines[1].state_changed_at.unwrap().to_rfc3339(),
            "2026-11-27T22:40:11.250+00:00"
        );
        let s = map_machine("s1", &p1.machines[1], at());
        assert_eq!(s.source, "borneo");
        assert!(s.conditions.is_empty(), "borneo owns no observation types");
        let k = s.device.as_ref().unwrap();
        assert_eq!(
            (k.site.as_str(), k.kind.as_str(), k.key.as_str()),
            ("s1", "serial", "SN-GB200-0002")
        );
        let c = custody(&s);
        assert_eq!(c.state, "PARTNER_OWNED");
        assert_eq!(c.credential_ref, "borneo:cred-7f3a91");
        assert_eq!(
            fleet_proto::datetime(c.state_changed_at.as_ref()),
            p1.machines[1].state_changed_at
        );
        // Nothing derived from the pages carries a secret.
        let all = format!("{p1:?}{p2:?}{w2:?}{s:?}");
        for secret in SECRETS {
            assert!(!all.contains(secret), "{secret} leaked");
        }
    }

    #[test]
    fn credential_references() {
        let c = serde_json::json!({"username": "u", "password": "p"});
        let reordered: Value =
            serde_json::from_str(r#"{"password": "p", "username": "u"}"#).unwrap();
        let a = credential_ref("p1", "SN1", Some(&c)).unwrap();
        assert_eq!(
            a,
            credential_ref("p1", "SN1", Some(&reordered)).unwrap(),
            "key order"
        );
        assert_ne!(
            a,
            credential_ref("p1", "SN2", Some(&c)).unwrap(),
            "bound to the serial"
        );
        assert_ne!(
            a,
            credential_ref("p2", "SN1", Some(&c)).unwrap(),
            "and the partner"
        );
        let rotated = serde_json::json!({"username": "u", "password": "p2"});
        assert_ne!(
            a,
            credential_ref("p1", "SN1", Some(&rotated)).unwrap(),
            "a rotation shows"
        );
        assert!(!a.contains('p') || a.starts_with("sha256:"));
        assert_eq!(
            credential_ref(
                "p1",
                "SN1",
                Some(&serde_json::json!({"credential_id": 42, "password": "x"}))
            ),
            Some("borneo:42".into())
        );
        let s = credential_ref(
            "p1",
            "SN1",
            Some(&serde_json::json!("a-bare-secret-string")),
        )
        .unwrap();
        assert!(s.starts_with("sha256:") && !s.contains("bare"));
        for none in [
            None,
            Some(Value::Null),
            Some(serde_json::json!({})),
            Some(serde_json::json!("")),
        ] {
            assert_eq!(credential_ref("p1", "SN1", none.as_ref()), None, "{none:?}");
        }
    }

    #[test]
    fn bad_entries_are_skipped_by_position_and_bad_bodies_never_echo() {
        let body = serde_json::json!({"machines": [
            {"state": "GOOGLE_OWNED"},
            {"serial": "SN1"},
            {"serial": "SN2", "state": "GOOGLE_OWNED", "state_changed_at": "yesterday"},
            {"serial": "SN3", "state": "PARTNER_OWNED", "credential": null},
            "not-a-machine",
            {"serial": 7, "state": "DRAINED"}
        ]});
        let (p, w) = parse_page(body.to_string().as_bytes(), "p1").unwrap();
        assert_eq!(
            p.machines
                .iter()
                .map(|m| m.serial.as_str())
                .collect::<Vec<_>>(),
            vec!["SN2", "SN3"]
        );
        assert_eq!(p.machines[0].state_changed_at, None);
        assert_eq!(
            w,
            vec![
                Warning::NoSerial { index: 0 },
                Warning::NoState {
                    index: 1,
                    serial: "SN1".into()
                },
                Warning::BadStateChangedAt {
                    serial: "SN2".into()
                },
                Warning::NoCredential {
                    serial: "SN3".into()
                },
                Warning::NoSerial { index: 4 },
                Warning::NoSerial { index: 5 },
            ]
        );
        let secret = "hunter2-in-a-broken-body";
        for body in [
            format!(r#"{{"machines": [{{"serial": "SN1", "credential": {{"password": "{secret}""#),
            format!(r#"{{"machines": "{secret}"}}"#),
            format!(r#"{{"machines": [], "next_page_token": ["{secret}"]}}"#),
            format!(r#"["{secret}"]"#),
            format!(r#"{{"machines": [{{"password": "{secret}" 7}}]}}"#),
        ] {
            let e = parse_page(body.as_bytes(), "p1").unwrap_err();
            assert!(!e.contains(secret), "{e}");
        }
        let (empty, _) = parse_page(br#"{"next_page_token": null}"#, "p1").unwrap();
        assert_eq!(empty, Page::default());
    }
}
