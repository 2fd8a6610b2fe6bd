//! The hardware key (`device.md`, "Identity and placement"; Better Compute
//! seed, "Identity, ownership and generations"): the identifiers a node
//! agent reports at join are normalised, placeholders dropped, and
//! `hardware_key` = SHA-256 over the sorted survivors. The key is trusted
//! when at least two *independent* identifiers survive: identifiers of two
//! different kinds with different values (two NIC MACs of one card, or a
//! board serial equal to the system serial, count once).

use sha2::{Digest, Sha256};

/// What an agent reports about the machine it runs on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HardwareIds {
    pub system_serial: String,
    pub board_serial: String,
    pub bmc_mac: String,
    pub nic_macs: Vec<String>,
    /// Hash of the TPM endorsement key (hex).
    pub tpm_ek_hash: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IdKind {
    SystemSerial,
    BoardSerial,
    BmcMac,
    NicMac,
    TpmEk,
}

impl IdKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            IdKind::SystemSerial => "system_serial",
            IdKind::BoardSerial => "board_serial",
            IdKind::BmcMac => "bmc_mac",
            IdKind::NicMac => "nic_mac",
            IdKind::TpmEk => "tpm_ek",
        }
    }
}

/// One identifier that survived normalisation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Survivor {
    pub kind: IdKind,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HardwareKey {
    /// Lower-case hex SHA-256 over the sorted `kind:value` survivors.
    pub key: String,
    pub trusted: bool,
    /// Sorted, without duplicates.
    pub survivors: Vec<Survivor>,
}

/// Strings firmware ships in place of a real serial, as they read after
/// [`normalize_serial`]'s case and separator folding.
const PLACEHOLDERS: &[&str] = &[
    "TOBEFILLEDBYOEM",
    "TOBEFILLEDBYOEM0",
    "DEFAULTSTRING",
    "DEFAULT",
    "SYSTEMSERIALNUMBER",
    "CHASSISSERIALNUMBER",
    "BASEBOARDSERIALNUMBER",
    "BOARDSERIALNUMBER",
    "SERIALNUMBER",
    "SYSTEMPRODUCTNAME",
    "NOTSPECIFIED",
    "NOTAPPLICABLE",
    "NOTAVAILABLE",
    "NA",
    "NONE",
    "NULL",
    "UNKNOWN",
    "INVALID",
    "EMPTY",
    "OEM",
    "TBD",
    "0123456789",
    "123456789",
    "1234567890",
];

/// Characters that separate groups in serials and MACs; dropped.
fn is_separator(c: char) -> bool {
    c.is_whitespace() || matches!(c, '-' | ':' | '.' | '_' | '/' | ',')
}

fn fold(raw: &str) -> String {
    raw.chars()
        .filter(|c| !is_separator(*c))
        .flat_map(char::to_uppercase)
        .collect()
}

/// Every character the same and one of the fillers firmware uses for
/// "unset" (`0000…`, `FFFF…`, `XXXX…`, `****…`).
fn is_filler(s: &str) -> bool {
    let mut chars = s.chars();
    let Some(first) = chars.next() else {
        return true;
    };
    matches!(first, '0' | 'F' | 'X' | '*' | '#' | '?') && chars.all(|c| c == first)
}

/// A system or board serial: case and separators folded; placeholders,
/// fillers, non-printable values and anything shorter than 3 characters
/// are dropped.
pub fn normalize_serial(raw: &str) -> Option<String> {
    let s = fold(raw);
    if s.len() < 3
        || s.chars().any(|c| c.is_control() || !c.is_ascii())
        || is_filler(&s)
        || PLACEHOLDERS.contains(&s.as_str())
    {
        return None;
    }
    Some(s)
}

/// Whether an agent's first join may claim a device imported without a
/// hardware key (from NetBox) by site and name: only when both serials are
/// known and name the same machine after normalisation. A device with no
/// serial, or an agent whose serial did not survive, is never claimed by
/// name alone (the join is refused instead, as any name collision is).
pub fn claims(device_serial: Option<&str>, agent_serial: Option<&str>) -> bool {
    match (
        device_serial.and_then(normalize_serial),
        agent_serial.and_then(normalize_serial),
    ) {
        (Some(d), Some(a)) => d == a,
        _ => false,
    }
}

/// A MAC address in any common notation (`aa:bb:..`, `AA-BB-..`,
/// `aabb.ccdd.eeff`): 12 hex digits, upper case. All-zero, broadcast and
/// multicast addresses are no machine's identity and are dropped.
pub fn normalize_mac(raw: &str) -> Option<String> {
    let s = fold(raw);
    if s.len() != 12 || !s.chars().all(|c| c.is_ascii_hexdigit()) || is_filler(&s) {
        return None;
    }
    let first = u8::from_str_radix(&s[0..2], 16).ok()?;
    if first & 1 == 1 {
        return None;
    }
    Some(s)
}

/// A TPM endorsement-key hash: hex, at least 32 digits (128 bits),
/// upper case; fillers dropped.
pub fn normalize_ek_hash(raw: &str) -> Option<String> {
    let s = fold(raw);
    if s.len() < 32 || !s.chars().all(|c| c.is_ascii_hexdigit()) || is_filler(&s) {
        return None;
    }
    Some(s)
}

/// The identifiers that survive normalisation, sorted and deduplicated.
pub fn survivors(ids: &HardwareIds) -> Vec<Survivor> {
    let mut out = Vec::new();
    let mut push = |kind, v: Option<String>| {
        if let Some(value) = v {
            out.push(Survivor { kind, value });
        }
    };
    push(IdKind::SystemSerial, normalize_serial(&ids.system_serial));
    push(IdKind::BoardSerial, normalize_serial(&ids.board_serial));
    push(IdKind::BmcMac, normalize_mac(&ids.bmc_mac));
    for m in &ids.nic_macs {
        push(IdKind::NicMac, normalize_mac(m));
    }
    push(IdKind::TpmEk, normalize_ek_hash(&ids.tpm_ek_hash));
    out.sort();
    out.dedup();
    out
}

/// The number of independent identifiers among the survivors: distinct
/// kinds, where a value already counted under another kind (a board serial
/// equal to the system serial, a NIC MAC equal to the BMC MAC) is not
/// counted again.
pub fn independent_count(survivors: &[Survivor]) -> usize {
    let mut kinds: Vec<IdKind> = Vec::new();
    let mut values: Vec<&str> = Vec::new();
    for s in survivors {
        if kinds.contains(&s.kind) || values.contains(&s.value.as_str()) {
            continue;
        }
        kinds.push(s.kind);
        values.push(&s.value);
    }
    kinds.len()
}

/// The hardware key, or `None` when no identifier survives.
pub fn hardware_key(ids: &HardwareIds) -> Option<HardwareKey> {
    let survivors = survivors(ids);
    if survivors.is_empty() {
        return None;
    }
    let mut h = Sha256::new();
    for (i, s) in survivors.iter().enumerate() {
        if i > 0 {
            h.update(b"\n");
        }
        h.update(s.kind.as_str().as_bytes());
        h.update(b":");
        h.update(s.value.as_bytes());
    }
    Some(HardwareKey {
        key: hex::encode(h.finalize()),
        trusted: independent_count(&survivors) >= 2,
        survivors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_join_claims_an_imported_device_only_by_its_serial() {
        // (NetBox's serial, the agent's, claims)
        let cases: &[(Option<&str>, Option<&str>, bool)] = &[
            (Some("SIM00000001"), Some("SIM00000001"), true),
            // The same serial written differently (case, separators).
            (Some("sim-0000-0001"), Some("SIM00000001"), true),
            (Some("SIM00000001"), Some("SIM00000002"), false),
            // Name alone never claims.
            (None, Some("SIM00000001"), false),
            (Some("SIM00000001"), None, false),
            (None, None, false),
            // A placeholder is no serial.
            (
                Some("To be filled by O.E.M."),
                Some("TOBEFILLEDBYOEM"),
                false,
            ),
            (Some("0000000"), Some("0000000"), false),
        ];
        for (device, agent, want) in cases {
            assert_eq!(claims(*device, *agent), *want, "{device:?} / {agent:?}");
        }
    }

    #[test]
    fn serials_fold_case_and_separators_and_drop_placeholders() {
        // (raw, normalised or None)
        let cases: &[(&str, Option<&str>)] = &[
            ("abc-123 45", Some("ABC12345")),
            ("  Abc.123_45 ", Some("ABC12345")),
            // "placeholder strings such as `To be filled by O.E.M.`, `Default string`"
            ("To be filled by O.E.M.", None),
            ("TO BE FILLED BY O.E.M.", None),
            ("Default string", None),
            ("Default String", None),
            ("System Serial Number", None),
            ("Not Specified", None),
            ("N/A", None),
            ("None", None),
            ("0123456789", None),
            // "all-zero serials"
            ("00000000", None),
            ("0000-0000-0000", None),
            ("FFFFFFFF", None),
            ("xxxxxx", None),
            ("", None),
            ("   ", None),
            ("ab", None),
            ("SN\u{7}123", None),
            ("00000001", Some("00000001")),
            ("J1234567890", Some("J1234567890")),
        ];
        check_normalises("normalize_serial", normalize_serial, cases);
    }

    /// Holds a normaliser to `(raw, normalised or None)` rows.
    fn check_normalises(
        name: &str,
        normalise: fn(&str) -> Option<String>,
        cases: &[(&str, Option<&str>)],
    ) {
        for (raw, want) in cases {
            assert_eq!(normalise(raw).as_deref(), *want, "{name}({raw:?})");
        }
    }

    #[test]
    fn macs_in_any_notation_are_one_form() {
        let cases: &[(&str, Option<&str>)] = &[
            ("aa:bb:cc:dd:ee:f0", Some("AABBCCDDEEF0")),
            ("AA-BB-CC-DD-EE-F0", Some("AABBCCDDEEF0")),
            ("aabb.ccdd.eef0", Some("AABBCCDDEEF0")),
            ("AABBCCDDEEF0", Some("AABBCCDDEEF0")),
            ("00:00:00:00:00:00", None),
            ("ff:ff:ff:ff:ff:ff", None),
            // multicast bit set: no NIC's burned-in address
            ("01:00:5e:00:00:01", None),
            ("aa:bb:cc:dd:ee", None),
            ("zz:bb:cc:dd:ee:ff", None),
            ("", None),
        ];
        check_normalises("normalize_mac", normalize_mac, cases);
    }

    #[test]
    fn ek_hashes_are_hex_of_at_least_128_bits() {
        let h = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let upper = h.to_uppercase();
        let zeros = "0".repeat(64);
        check_normalises(
            "normalize_ek_hash",
            normalize_ek_hash,
            &[
                (h, Some(&upper)),
                (&h[..31], None),
                (&zeros, None),
                ("not-a-hash-not-a-hash-not-a-hash", None),
            ],
        );
    }

    fn ids(system: &str, board: &str, bmc: &str, nics: &[&str], ek: &str) -> HardwareIds {
        HardwareIds {
            system_serial: system.into(),
            board_serial: board.into(),
            bmc_mac: bmc.into(),
            nic_macs: nics.iter().map(|s| s.to_string()).collect(),
            tpm_ek_hash: ek.into(),
        }
    }

    #[test]
    fn trusted_when_at_least_two_independent_identifiers_survive() {
        let ek = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        // (ids, survivors, trusted)
        let cases: Vec<(HardwareIds, usize, bool)> = vec![
            (
                ids(
                    "SN1234",
                    "BRD5678",
                    "aa:bb:cc:00:00:01",
                    &["aa:bb:cc:00:00:02"],
                    ek,
                ),
                5,
                true,
            ),
            (
                ids("SN1234", "To be filled by O.E.M.", "", &[], ""),
                1,
                false,
            ),
            (
                ids("SN1234", "Default string", "aa:bb:cc:00:00:01", &[], ""),
                2,
                true,
            ),
            (
                ids(
                    "To be filled by O.E.M.",
                    "Default string",
                    "00:00:00:00:00:00",
                    &[],
                    "",
                ),
                0,
                false,
            ),
            // two MACs of one card are one kind of identifier
            (
                ids("", "", "", &["aa:bb:cc:00:00:01", "aa:bb:cc:00:00:02"], ""),
                2,
                false,
            ),
            // a board serial equal to the system serial is not independent
            (ids("SN1234", "sn-1234", "", &[], ""), 2, false),
            (ids("", "", "", &[], ek), 1, false),
            (ids("", "", "aa:bb:cc:00:00:01", &[], ek), 2, true),
            // the same NIC reported twice is one survivor
            (
                ids(
                    "SN1234",
                    "",
                    "",
                    &["aa:bb:cc:00:00:02", "AA-BB-CC-00-00-02"],
                    "",
                ),
                2,
                true,
            ),
        ];
        for (i, (input, n, trusted)) in cases.iter().enumerate() {
            let got = hardware_key(input);
            let (got_n, got_trusted) = got
                .as_ref()
                .map_or((0, false), |k| (k.survivors.len(), k.trusted));
            assert_eq!((got_n, got_trusted), (*n, *trusted), "case {i}: {input:?}");
        }
    }

    #[test]
    fn the_key_is_stable_under_notation_and_order() {
        let a = ids(
            "sn-1234",
            "brd 5678",
            "AA:BB:CC:00:00:01",
            &["aa:bb:cc:00:00:02", "aa:bb:cc:00:00:03"],
            "",
        );
        let b = ids(
            "SN1234",
            "BRD5678",
            "aabb.cc00.0001",
            &["AA-BB-CC-00-00-03", "aabbcc000002"],
            "",
        );
        let (ka, kb) = (hardware_key(&a).unwrap(), hardware_key(&b).unwrap());
        assert_eq!(ka.key, kb.key);
        assert_eq!(ka.key.len(), 64);
        // A different machine has a different key; placeholders change nothing.
        let c = ids(
            "SN1235",
            "BRD5678",
            "AA:BB:CC:00:00:01",
            &["aa:bb:cc:00:00:02", "aa:bb:cc:00:00:03"],
            "Default string",
        );
        assert_ne!(hardware_key(&c).unwrap().key, ka.key);
        let d = ids(
            "sn-1234",
            "brd 5678",
            "AA:BB:CC:00:00:01",
            &["aa:bb:cc:00:00:02", "aa:bb:cc:00:00:03"],
            "0000000000000000000000000000000000000000",
        );
        assert_eq!(hardware_key(&d).unwrap().key, ka.key);
        // A serial that looks like a MAC does not collide with the MAC.
        let e = ids("AABBCC000001", "", "", &[], "");
        let f = ids("", "", "aa:bb:cc:00:00:01", &[], "");
        assert_ne!(hardware_key(&e).unwrap().key, hardware_key(&f).unwrap().key);
    }
}
