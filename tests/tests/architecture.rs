//! The crate table in `docs/architecture.md` is the rule for which Drover crate may use which;
//! `cargo metadata` and `cargo tree` say what the manifests really do. The two must agree, so
//! neither the design nor the code drifts without the other.

#![allow(clippy::unwrap_used, clippy::expect_used)]

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
    // The table of the "## Crates" section (the next section has a table of its own).
    let section = text
        .split("\n## Crates\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .unwrap();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
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

/// A module of the hub, as a path (`api::objects`), and the file that holds it.
fn hub_modules() -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(root).unwrap().with_extension("");
                let mut parts: Vec<String> = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    parts.last().map(String::as_str),
                    Some("mod" | "lib" | "main")
                ) {
                    parts.pop();
                }
                // Tests are not part of the structure.
                if parts.iter().any(|p| p == "tests") {
                    continue;
                }
                out.insert(parts.join("::"), path);
            }
        }
    }
    let root = workspace().join("hub/src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// The paths a file names from `crate::`, `super::` (resolved against `module`) and, for a
/// module with children, `child::`: every path of a `use` tree, and every path in code.
/// Comments and the test module at the end are left out.
fn named_paths(source: &str, module: &str, modules: &BTreeMap<String, PathBuf>) -> Vec<String> {
    let code: String = source
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap()
        .lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let bytes = code.as_bytes();
    let ident_at = |i: usize| -> (String, usize) {
        let mut j = i;
        while j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || bytes[j] == b'_') {
            j += 1;
        }
        (code[i..j].to_owned(), j)
    };
    // `a::b::{c, d::{e, f}}` from `i` on, each path prefixed by `prefix`.
    fn tree(code: &str, mut i: usize, prefix: &str, out: &mut Vec<String>) -> usize {
        let bytes = code.as_bytes();
        let mut path = prefix.to_owned();
        loop {
            while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            if i < bytes.len() && bytes[i] == b'{' {
                i += 1;
                loop {
                    i = tree(code, i, &path, out);
                    while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                        i += 1;
                    }
                    match bytes.get(i) {
                        Some(b',') => i += 1,
                        Some(b'}') => return i + 1,
                        _ => return i,
                    }
                    while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                        i += 1;
                    }
                    if bytes.get(i) == Some(&b'}') {
                        return i + 1;
                    }
                }
            }
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            if start == i {
                out.push(path);
                return i;
            }
            if !path.is_empty() {
                path.push_str("::");
            }
            path.push_str(&code[start..i]);
            if code[i..].starts_with("::") {
                i += 2;
            } else {
                out.push(path);
                return i;
            }
        }
    }
    let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
    let mut paths = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let boundary = i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':');
        if !boundary || !(bytes[i].is_ascii_lowercase() || bytes[i] == b'_') {
            i += 1;
            continue;
        }
        let (word, end) = ident_at(i);
        if !code[end..].starts_with("::") {
            i = end.max(i + 1);
            continue;
        }
        let prefix = match word.as_str() {
            "crate" => Some(String::new()),
            "super" => Some(parent.to_owned()),
            child => {
                let full = if module.is_empty() {
                    child.to_owned()
                } else {
                    format!("{module}::{child}")
                };
                modules.contains_key(&full).then(|| module.to_owned())
            }
        };
        match prefix {
            Some(prefix) => {
                let from = if matches!(word.as_str(), "crate" | "super") {
                    end + 2
                } else {
                    i
                };
                let mut found = Vec::new();
                i = tree(&code, from, &prefix, &mut found);
                paths.extend(found);
            }
            None => i = end,
        }
    }
    paths
}

#[test]
fn the_hubs_modules_import_each_other_without_cycles() {
    // A module may use its own ancestors (a module's children share its types); every other
    // use of one module by another is an edge, and the edges must form no cycle.
    let modules = hub_modules();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &modules {
        let source = std::fs::read_to_string(file).unwrap();
        for path in named_paths(&source, module, &modules) {
            let parts: Vec<&str> = path.split("::").collect();
            let target = (1..=parts.len())
                .rev()
                .map(|n| parts[..n].join("::"))
                .find(|candidate| modules.contains_key(candidate));
            if let Some(target) = target
                && target != *module
                && !module.starts_with(&format!("{target}::"))
                && !target.is_empty()
            {
                edges.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    // Sanity: the checker sees the edges there are.
    assert!(
        edges["api::objects::create"].contains("registration"),
        "{edges:?}"
    );
    // Depth-first search for a path back to where it started.
    fn cycle_from(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            return Some(stack[at..].to_vec());
        }
        if !done.insert(node.to_owned()) {
            return None;
        }
        stack.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = cycle_from(next, edges, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    for module in modules.keys() {
        let mut stack = Vec::new();
        if let Some(cycle) = cycle_from(module, &edges, &mut stack, &mut done) {
            panic!(
                "the hub's modules import each other in a cycle: {}",
                cycle.join(" → ")
            );
        }
    }
}
