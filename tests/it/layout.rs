//! Issue 15, "Done when": the dependency graph keeps services closed. Read
//! from `cargo metadata` (normal dependencies; tests and builds aside):
//! no service crate depends on another (the `fleet` binary and the `fleet
//! dev` harness compose them, nothing else does), no shared crate depends on
//! a service, no connector (nor the simulated agent) links sqlx, and test
//! support (the test kit, wiremock, the simulated agent in the gateway)
//! stays out of what ships.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

struct Graph {
    /// Package id to (name, directory relative to the repository).
    packages: BTreeMap<String, (String, String)>,
    /// Package id to the ids it depends on (normal dependencies).
    normal: BTreeMap<String, Vec<String>>,
}

/// The host's target triple, from `rustc -vV`.
fn host() -> String {
    let out = std::process::Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc -vV runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

fn graph() -> Graph {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        // The build's own platform: other platforms' crates are not
        // downloaded, and the graph is the one that is built here.
        .args(["metadata", "--format-version", "1", "--offline", "--locked"])
        .args(["--filter-platform", &host()])
        .current_dir(crate::support::repo(""))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let root = meta["workspace_root"].as_str().unwrap().to_string();
    let mut packages = BTreeMap::new();
    for p in meta["packages"].as_array().unwrap() {
        let dir = p["manifest_path"]
            .as_str()
            .unwrap()
            .trim_end_matches("/Cargo.toml")
            .strip_prefix(&format!("{root}/"))
            .unwrap_or("")
            .to_string();
        packages.insert(
            p["id"].as_str().unwrap().to_string(),
            (p["name"].as_str().unwrap().to_string(), dir),
        );
    }
    let mut normal = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let deps = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].is_null())
            })
            .map(|d| d["pkg"].as_str().unwrap().to_string())
            .collect();
        normal.insert(node["id"].as_str().unwrap().to_string(), deps);
    }
    Graph { packages, normal }
}

impl Graph {
    fn id(&self, name: &str) -> &str {
        self.packages
            .iter()
            .find(|(_, (n, _))| n == name)
            .map(|(id, _)| id.as_str())
            .unwrap_or_else(|| panic!("no package {name}"))
    }

    fn name(&self, id: &str) -> &str {
        &self.packages[id].0
    }

    fn dir(&self, id: &str) -> &str {
        &self.packages[id].1
    }

    /// The workspace crates under `prefix` (`services/`, `shared/`).
    fn members(&self, prefix: &str) -> Vec<&str> {
        self.packages
            .iter()
            .filter(|(_, (_, dir))| dir.starts_with(prefix))
            .map(|(id, _)| id.as_str())
            .collect()
    }

    /// Everything `id` links, directly or not.
    fn links(&self, id: &str) -> BTreeSet<&str> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![id];
        while let Some(next) = todo.pop() {
            for dep in self.normal.get(next).into_iter().flatten() {
                if seen.insert(dep.as_str()) {
                    todo.push(dep);
                }
            }
        }
        seen
    }
}

/// The crate that composes services: the binary (with `fleet dev`).
const COMPOSERS: [&str; 1] = ["fleet"];

#[test]
fn no_service_crate_depends_on_another_and_connectors_do_not_link_sqlx() {
    let g = graph();
    let services = g.members("services/");
    assert!(
        services.len() >= 12,
        "the services are found: {}",
        services.len()
    );
    let mut wrong = vec![];
    // A service crate (a composer apart) and a shared crate alike: no
    // direct dependency on a service crate.
    let checked = services
        .iter()
        .filter(|&&s| !COMPOSERS.contains(&g.name(s)))
        .map(|&s| ("", s))
        .chain(g.members("shared/").into_iter().map(|s| ("shared ", s)));
    for (kind, s) in checked {
        for dep in &g.normal[s] {
            if g.dir(dep).starts_with("services/") {
                wrong.push(format!(
                    "{kind}{} depends on the service crate {}",
                    g.name(s),
                    g.name(dep)
                ));
            }
        }
    }
    let sqlx = g
        .packages
        .iter()
        .filter(|(_, (n, _))| n == "sqlx" || n == "sqlx-core")
        .map(|(id, _)| id.as_str())
        .collect::<BTreeSet<_>>();
    assert!(!sqlx.is_empty(), "sqlx is in the graph (the hub links it)");
    assert!(
        !g.links(g.id("fleet-hub")).is_disjoint(&sqlx),
        "the check can see sqlx: the hub links it"
    );
    let mut no_database = services
        .iter()
        .copied()
        .filter(|&s| g.name(s).starts_with("fleet-connector-"))
        .collect::<Vec<_>>();
    assert_eq!(no_database.len(), 6, "six connectors");
    no_database.extend(
        [
            "fleet-connector",
            "fleet-runtime",
            "fleet-domain",
            "fleet-proto",
            "fleet-bus",
            "fleet-agent-sim",
        ]
        .map(|n| g.id(n)),
    );
    for c in no_database {
        if !g.links(c).is_disjoint(&sqlx) {
            wrong.push(format!("{} links sqlx", g.name(c)));
        }
    }
    assert!(
        wrong.is_empty(),
        "the dependency graph:\n{}",
        wrong.join("\n")
    );
}

/// The crates that ship (every service and shared crate, the binary) link
/// no test support: not the test kit, not wiremock; and the production
/// gateway does not link the simulated node agent (the binary's `fleet dev`
/// and `fleet sim agents` do, and the gateway's tests).
#[test]
fn shipped_crates_link_no_test_support() {
    let g = graph();
    let test_only: BTreeSet<&str> = g
        .packages
        .iter()
        .filter(|(_, (n, _))| n == "fleet-testkit" || n == "wiremock")
        .map(|(id, _)| id.as_str())
        .collect();
    assert_eq!(
        test_only.len(),
        2,
        "the kit and wiremock are in the graph (the tests link them)"
    );
    let shipped: Vec<&str> = [g.members("services/"), g.members("shared/")].concat();
    assert!(shipped.contains(&g.id("fleet-agent-sim")));
    let mut wrong = vec![];
    for s in shipped {
        for t in g.links(s).intersection(&test_only) {
            wrong.push(format!("{} links {}", g.name(s), g.name(t)));
        }
    }
    if g.links(g.id("fleet-gateway"))
        .contains(g.id("fleet-agent-sim"))
    {
        wrong.push("fleet-gateway links the simulated agent".into());
    }
    assert!(
        wrong.is_empty(),
        "test support in shipped crates:\n{}",
        wrong.join("\n")
    );
}
