//! The crate table in `docs/architecture.md` is the rule for which Drover crate may use which;
//! `cargo metadata` and `cargo tree` say what the manifests really do. The two must agree, so
//! neither the design nor the code drifts without the other.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace holds the tests crate")
        .to_owned()
}

fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .current_dir(workspace())
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cargo prints UTF-8")
}

/// `None`: may depend on any Drover crate.
type Allowed = Option<BTreeSet<String>>;

/// The crate table: crate → what it may depend on.
fn documented() -> BTreeMap<String, Allowed> {
    let text = std::fs::read_to_string(workspace().join("docs/architecture.md")).unwrap();
    let ticked = |cell: &str| -> BTreeSet<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    let mut table = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        assert_eq!(cells.len(), 3, "a crate row has three cells: {line}");
        let name = ticked(cells[0]).into_iter().next().unwrap();
        let allowed = match cells[2].trim() {
            "any" => None,
            "—" => Some(BTreeSet::new()),
            cell => Some(ticked(cell)),
        };
        table.insert(name, allowed);
    }
    table
}

#[test]
fn every_crate_depends_only_on_what_the_architecture_allows() {
    let metadata: serde_json::Value =
        serde_json::from_str(&cargo(&["metadata", "--format-version", "1", "--no-deps"])).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let ours: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    let table = documented();
    assert_eq!(
        table.keys().cloned().collect::<BTreeSet<_>>(),
        ours,
        "docs/architecture.md lists exactly the workspace's crates"
    );
    let mut wrong = Vec::new();
    for package in packages {
        let name = package["name"].as_str().unwrap();
        let uses: BTreeSet<String> = package["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].is_null() && ours.contains(d["name"].as_str().unwrap()))
            .map(|d| d["name"].as_str().unwrap().to_owned())
            .collect();
        if let Some(allowed) = &table[name] {
            let extra: Vec<_> = uses.difference(allowed).collect();
            let unused: Vec<_> = allowed.difference(&uses).collect();
            if !extra.is_empty() || !unused.is_empty() {
                wrong.push(format!(
                    "{name}: uses {extra:?} beyond the table; the table allows {unused:?} it does not use"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The crates `cargo tree -p package -e normal` reaches.
fn reaches(package: &str) -> BTreeSet<String> {
    cargo(&[
        "tree", "-p", package, "-e", "normal", "--prefix", "none", "--format", "{p}",
    ])
    .lines()
    .filter_map(|l| l.split_whitespace().next())
    .map(str::to_owned)
    .collect()
}

#[test]
fn the_hub_links_no_agent_no_simulator_and_no_kubernetes_client() {
    let hub = reaches("hub");
    for banned in [
        "sim",
        "cluster-agent",
        "node-agent",
        "system-agent",
        "agentkit",
        "kube",
        "k8s-openapi",
        "sysinfo",
    ] {
        assert!(!hub.contains(banned), "drover-hub links {banned}");
    }
    assert!(
        hub.contains("tunnel") && hub.contains("rusqlite"),
        "{hub:?}"
    );
    let node_agent = reaches("node-agent");
    assert!(!node_agent.contains("kube"), "the node-agent links kube");
    assert!(!node_agent.contains("cluster-agent"));
    assert!(node_agent.contains("agentkit"), "{node_agent:?}");
}
