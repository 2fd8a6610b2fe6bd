//! Issue 15, item 7: `docs/configuration.md` is tested against the
//! configuration structs. Every key the defaults serialize to appears in
//! the document's key column, and every key the document names exists.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::support::repo;

/// Dotted keys of every leaf of `v` (a map's entries are its keys; an empty
/// map or list is itself a leaf).
fn leaves(prefix: &str, v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&key, v, out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

/// The keys the document's tables name: every backticked token of a row's
/// first cell. A token without a dot is relative: to the first token's
/// parent in the same cell (`nmx_username`, `nmx_password`), or to the
/// table's prefix named just above it (`connectors.<name>.poll.<key>`).
fn documented() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(repo("docs/configuration.md")).unwrap();
    let mut out = BTreeSet::new();
    let mut table_prefix: Option<String> = None;
    for line in doc.lines() {
        if !line.starts_with('|') {
            if let Some(i) = line.find(".<key>`") {
                let start = line[..i].rfind('`').map_or(0, |s| s + 1);
                table_prefix = Some(line[start..i].to_string());
            } else if !line.trim().is_empty() {
                table_prefix = None;
            }
            continue;
        }
        let cell = line.split('|').nth(1).unwrap_or_default();
        let tokens: Vec<&str> = cell.split('`').skip(1).step_by(2).collect();
        let Some(first) = tokens.first() else {
            continue;
        };
        if *first == "key" {
            continue;
        }
        let parent = first.rsplit_once('.').map(|(p, _)| p.to_string());
        for t in &tokens {
            if !t
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._<>".contains(c))
            {
                continue;
            }
            let key = match (t.contains('.'), &parent, &table_prefix) {
                (true, _, _) => t.to_string(),
                (false, Some(p), _) => format!("{p}.{t}"),
                (false, None, Some(prefix)) => format!("{prefix}.{t}"),
                (false, None, None) => continue,
            };
            out.insert(key);
        }
    }
    out
}

/// Whether documented key `doc` names configuration leaf `key`: segment by
/// segment, a `<placeholder>` matches any one; `doc` may stop early (it
/// covers a table under it) or run on past `key` in placeholders and what
/// follows them (a per-site key, when the defaults have no sites).
fn names(doc: &str, key: &str) -> bool {
    let d: Vec<&str> = doc.split('.').collect();
    let k: Vec<&str> = key.split('.').collect();
    for (i, seg) in d.iter().enumerate() {
        match k.get(i) {
            Some(ks) if seg.starts_with('<') || seg == ks => {}
            Some(_) => return false,
            None => return seg.starts_with('<'),
        }
    }
    true
}

#[test]
fn the_configuration_document_names_every_key_and_no_other() {
    let config = serde_json::to_value(fleet::config::FleetConfig::default()).unwrap();
    let mut keys = BTreeSet::new();
    leaves("", &config, &mut keys);
    let doc = documented();
    assert!(
        doc.len() > 60,
        "the document's keys are read: {}",
        doc.len()
    );
    let covered = |k: &str| doc.iter().any(|d| names(d, k));
    let missing: Vec<&String> = keys.iter().filter(|k| !covered(k)).collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md does not name: {missing:#?}"
    );
    // Every documented key exists (is a leaf, or has leaves under it).
    let unknown: Vec<&String> = doc
        .iter()
        .filter(|d| !keys.iter().any(|k| names(d, k)))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/configuration.md names keys the configuration does not have: {unknown:#?}"
    );
}
