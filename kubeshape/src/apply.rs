//! Field ownership and server-side apply, as kube-apiserver's structured-merge-diff does them,
//! as far as the hub and the simulator go.
//!
//! Every write records which manager set which fields in `metadata.managedFields` (FieldsV1):
//! an apply (`PATCH` with `application/apply-patch+yaml`) owns exactly the fields of its
//! configuration; any other write (`create`, `update`, a patch) takes the fields whose values
//! it changed from whoever held them. An apply that would change a value another manager
//! owns is a conflict (409, naming manager and field) unless forced, which takes the field
//! over; a field the applier set before and leaves out now is removed unless someone else
//! also owns it. Lists of objects with a merge key (containers by `name`, ports by
//! `containerPort` or a Service's by `port`, …) are associative, key by key; every other list
//! is atomic, owned whole. What it does not model: the real schema's per-type list kinds (a
//! `set` list of scalars is atomic here), multi-field keys (`containerPort` and `protocol`: the
//! key is the first field only), and version conversion of managed fields.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::patch;

/// One step of a field path, as FieldsV1 spells it: `f:name` (a field), `k:{"name":"web"}` (a
/// list element by its key).
type Path = Vec<String>;

/// The marker FieldsV1 puts in an element (or map) it owns as a whole.
const ITSELF: &str = ".";

/// Fields the server owns: never anyone's.
fn servers(path: &[String]) -> bool {
    matches!(
        path,
        [f] if ["f:apiVersion", "f:kind", "f:status"].contains(&f.as_str())
    ) || matches!(
        path,
        [m, f] if m == "f:metadata" && [
            "f:name", "f:namespace", "f:uid", "f:resourceVersion", "f:generation",
            "f:creationTimestamp", "f:managedFields", "f:selfLink", "f:deletionTimestamp",
        ].contains(&f.as_str())
    )
}

/// The key field of the list `field`'s elements, if that list is associative.
fn key_field(field: &str, element: &Value) -> Option<&'static str> {
    let key = match (field, element.get("containerPort")) {
        ("ports", None) => "port",
        _ => patch::merge_key(field)?,
    };
    element.get(key).map(|_| key)
}

fn element_step(key: &str, element: &Value) -> String {
    let mut one = Map::new();
    one.insert(key.to_owned(), element[key].clone());
    format!("k:{}", Value::Object(one))
}

/// The leaf fields `object` sets, and the list elements it names.
pub fn fields(object: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    collect(object, &mut Vec::new(), &mut out);
    out
}

fn collect(value: &Value, at: &mut Path, out: &mut BTreeSet<Path>) {
    let Value::Object(map) = value else {
        out.insert(at.clone());
        return;
    };
    if map.is_empty() && !at.is_empty() {
        out.insert(at.clone());
    }
    for (name, child) in map {
        at.push(format!("f:{name}"));
        if servers(at) {
            at.pop();
            continue;
        }
        match child {
            Value::Array(items)
                if !items.is_empty() && items.iter().all(|i| key_field(name, i).is_some()) =>
            {
                for item in items {
                    let key = key_field(name, item).unwrap_or("name");
                    at.push(element_step(key, item));
                    let mut itself = at.clone();
                    itself.push(ITSELF.to_owned());
                    out.insert(itself);
                    collect(item, at, out);
                    at.pop();
                }
            }
            _ => collect(child, at, out),
        }
        at.pop();
    }
}

/// The value at `path` in `object`, if there is one.
fn value_at<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut here = object;
    for step in path {
        if step == ITSELF {
            return Some(here);
        }
        here = if let Some(name) = step.strip_prefix("f:") {
            here.get(name)?
        } else {
            let key: Value = serde_json::from_str(step.strip_prefix("k:")?).ok()?;
            let (field, want) = key.as_object()?.iter().next()?;
            here.as_array()?
                .iter()
                .find(|e| e.get(field) == Some(want))?
        };
    }
    Some(here)
}

/// Removes what `path` names from `object` (a field, or a whole list element).
fn remove_at(object: &mut Value, path: &[String]) {
    let path = match path.last().map(String::as_str) {
        Some(ITSELF) => &path[..path.len() - 1],
        _ => path,
    };
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut here = object;
    for step in parent {
        let next = if let Some(name) = step.strip_prefix("f:") {
            here.get_mut(name)
        } else {
            element_mut(here, step)
        };
        match next {
            Some(n) => here = n,
            None => return,
        }
    }
    if let Some(name) = last.strip_prefix("f:") {
        if let Value::Object(map) = here {
            map.remove(name);
        }
    } else if let (Some(want), Value::Array(list)) = (parse_key(last), here) {
        list.retain(|e| e.get(&want.0) != Some(&want.1));
    }
}

fn parse_key(step: &str) -> Option<(String, Value)> {
    let key: Value = serde_json::from_str(step.strip_prefix("k:")?).ok()?;
    let (field, want) = key.as_object()?.iter().next()?;
    Some((field.clone(), want.clone()))
}

fn element_mut<'a>(list: &'a mut Value, step: &str) -> Option<&'a mut Value> {
    let (field, want) = parse_key(step)?;
    list.as_array_mut()?
        .iter_mut()
        .find(|e| e.get(&field) == Some(&want))
}

/// FieldsV1 of a set of paths.
fn to_fields_v1(paths: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for path in paths {
        let mut here = &mut root;
        for step in path {
            let next = here.entry(step.clone()).or_insert_with(|| json!({}));
            let Value::Object(map) = next else {
                break;
            };
            here = map;
        }
    }
    Value::Object(root)
}

fn from_fields_v1(tree: &Value) -> BTreeSet<Path> {
    fn walk(tree: &Value, at: &mut Path, out: &mut BTreeSet<Path>) {
        match tree {
            Value::Object(map) if !map.is_empty() => {
                for (step, child) in map {
                    at.push(step.clone());
                    walk(child, at, out);
                    at.pop();
                }
            }
            _ => {
                out.insert(at.clone());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(tree, &mut Vec::new(), &mut out);
    out
}

/// How a path reads in a conflict message: `.spec.template.spec.containers[name="web"].image`.
pub fn describe(path: &[String]) -> String {
    let mut out = String::new();
    for step in path {
        if let Some(name) = step.strip_prefix("f:") {
            out.push('.');
            out.push_str(name);
        } else if let Some((field, value)) = parse_key(step) {
            let shown = value
                .as_str()
                .map_or_else(|| value.to_string(), |s| format!("{s:?}"));
            out.push_str(&format!("[{field}={shown}]"));
        }
    }
    out
}

/// One manager's entry of `metadata.managedFields`.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    apply: bool,
    api_version: String,
    time: String,
    fields: BTreeSet<Path>,
}

fn entries(object: &Value) -> Vec<Entry> {
    let Some(list) = object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .map(|e| Entry {
            manager: e["manager"].as_str().unwrap_or_default().to_owned(),
            apply: e["operation"] == "Apply",
            api_version: e["apiVersion"].as_str().unwrap_or_default().to_owned(),
            time: e["time"].as_str().unwrap_or_default().to_owned(),
            fields: from_fields_v1(&e["fieldsV1"]),
        })
        .collect()
}

fn write_entries(object: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            json!({
                "manager": e.manager,
                "operation": if e.apply { "Apply" } else { "Update" },
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            })
        })
        .collect();
    if let Value::Object(meta) = &mut object["metadata"] {
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

fn leaf(path: &[String]) -> bool {
    path.last().is_none_or(|s| s != ITSELF)
}

/// Records a write that is not an apply: `manager` takes every field whose value `after`
/// changed from `before` (`None`: created), others keep the rest, and fields gone are no one's.
pub fn record_update(before: Option<&Value>, after: &mut Value, manager: &str, now: &str) {
    let mut owners = before.map(entries).unwrap_or_default();
    let present = fields(after);
    let changed: BTreeSet<Path> = present
        .iter()
        // An element is the writer's if it added it; changing a field inside it is not
        // owning the element.
        .filter(|p| {
            before.is_none_or(|b| match leaf(p) {
                true => value_at(b, p) != value_at(after, p),
                false => value_at(b, p).is_none(),
            })
        })
        .cloned()
        .collect();
    for entry in &mut owners {
        entry
            .fields
            .retain(|p| present.contains(p) && !changed.contains(p));
    }
    if !changed.is_empty() {
        let api_version = after["apiVersion"].as_str().unwrap_or_default().to_owned();
        match owners.iter_mut().find(|e| e.manager == manager && !e.apply) {
            Some(entry) => {
                entry.fields.extend(changed);
                entry.time = now.to_owned();
            }
            None => owners.push(Entry {
                manager: manager.to_owned(),
                apply: false,
                api_version,
                time: now.to_owned(),
                fields: changed,
            }),
        }
    }
    write_entries(after, &owners);
}

/// Fields another manager owns whose value the apply would change.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflict {
    pub manager: String,
    pub api_version: String,
    pub path: String,
}

/// The message kube-apiserver gives a refused apply.
pub fn conflict_message(conflicts: &[Conflict]) -> String {
    let n = conflicts.len();
    let mut out = format!(
        "Apply failed with {n} conflict{}: ",
        if n == 1 { "" } else { "s" }
    );
    let each: Vec<String> = conflicts
        .iter()
        .map(|c| {
            format!(
                "conflict with {:?} using {}: {}",
                c.manager, c.api_version, c.path
            )
        })
        .collect();
    out.push_str(&each.join("\n"));
    out
}

/// Applies `config` as `manager` to `live` (`None`: the object does not exist yet). Returns the
/// object to store, or the conflicts that refused it.
pub fn apply(
    live: Option<&Value>,
    config: &Value,
    manager: &str,
    force: bool,
    now: &str,
) -> Result<Value, Vec<Conflict>> {
    let applied = fields(config);
    let Some(live) = live else {
        let mut object = config.clone();
        let api_version = config["apiVersion"].as_str().unwrap_or_default().to_owned();
        write_entries(
            &mut object,
            &[Entry {
                manager: manager.to_owned(),
                apply: true,
                api_version,
                time: now.to_owned(),
                fields: applied,
            }],
        );
        return Ok(object);
    };
    let mut owners = entries(live);
    let mut conflicts = Vec::new();
    for entry in owners.iter_mut().filter(|e| e.manager != manager) {
        let differing: Vec<Path> = entry
            .fields
            .iter()
            .filter(|p| applied.contains(*p) && leaf(p))
            .filter(|p| value_at(live, p) != value_at(config, p))
            .cloned()
            .collect();
        if force {
            entry.fields.retain(|p| !differing.contains(p));
        } else {
            conflicts.extend(differing.iter().map(|p| Conflict {
                manager: entry.manager.clone(),
                api_version: entry.api_version.clone(),
                path: describe(p),
            }));
        }
    }
    if !conflicts.is_empty() {
        return Err(conflicts);
    }
    let before = owners
        .iter()
        .find(|e| e.manager == manager && e.apply)
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others: BTreeSet<&Path> = owners
        .iter()
        .filter(|e| !(e.manager == manager && e.apply))
        .flat_map(|e| &e.fields)
        .collect();
    let mut object = live.clone();
    // Deepest first, so an element goes after its fields were looked at.
    let mut dropped: Vec<&Path> = before
        .iter()
        .filter(|p| !applied.contains(*p) && !others.contains(p))
        .collect();
    dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for path in dropped {
        remove_at(&mut object, path);
    }
    let mut config_only = config.clone();
    if let Value::Object(meta) = &mut config_only["metadata"] {
        meta.remove("managedFields");
        meta.remove("resourceVersion");
    }
    patch::strategic(&mut object, &without_nulls(&config_only));
    let present = fields(&object);
    for entry in &mut owners {
        entry.fields.retain(|p| present.contains(p));
    }
    match owners.iter_mut().find(|e| e.manager == manager && e.apply) {
        Some(entry) => {
            entry.fields = applied;
            entry.time = now.to_owned();
            config["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .clone_into(&mut entry.api_version);
        }
        None => owners.push(Entry {
            manager: manager.to_owned(),
            apply: true,
            api_version: config["apiVersion"].as_str().unwrap_or_default().to_owned(),
            time: now.to_owned(),
            fields: applied,
        }),
    }
    write_entries(&mut object, &owners);
    Ok(object)
}

/// An applied `null` sets nothing (strategic merge would read it as "delete").
fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// The manager a write that does not name one is recorded under: the client's program name,
/// as kube-apiserver takes it from the User-Agent (`kubectl/v1.32.0 (linux/amd64) …` →
/// `kubectl`).
pub fn manager_of(field_manager: Option<&str>, user_agent: Option<&str>) -> String {
    if let Some(m) = field_manager.filter(|m| !m.is_empty()) {
        return m.to_owned();
    }
    user_agent
        .and_then(|ua| ua.split('/').next())
        .filter(|p| !p.is_empty())
        .unwrap_or("unknown")
        .to_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn deployment(image: &str, replicas: u64) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [
                {"name": "web", "image": image},
            ]}}},
        })
    }

    fn managers(object: &Value) -> Vec<(String, String)> {
        object["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["manager"].as_str().unwrap().to_owned(),
                    e["operation"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn fields_key_containers_by_name_and_leave_out_what_the_server_owns() {
        let set = fields(&deployment("nginx:1", 2));
        let shown: Vec<String> = set.iter().map(|p| p.join(" ")).collect();
        assert_eq!(
            shown,
            [
                "f:metadata f:labels f:app",
                "f:spec f:replicas",
                "f:spec f:template f:spec f:containers k:{\"name\":\"web\"} .",
                "f:spec f:template f:spec f:containers k:{\"name\":\"web\"} f:image",
                "f:spec f:template f:spec f:containers k:{\"name\":\"web\"} f:name",
            ]
        );
        let tree = to_fields_v1(&set);
        assert_eq!(
            tree["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"web\"}"]["f:image"],
            json!({})
        );
        assert_eq!(from_fields_v1(&tree), set);
    }

    #[test]
    fn an_edit_then_an_apply_of_another_image_conflicts_until_forced() {
        let now = "2026-12-02T00:00:00Z";
        let applied = apply(None, &deployment("nginx:1", 2), "drover", false, now).unwrap();
        assert_eq!(managers(&applied), [("drover".into(), "Apply".into())]);
        // `kubectl edit` changes the image: it owns that field now.
        let mut edited = applied.clone();
        edited["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:evil");
        record_update(Some(&applied), &mut edited, "kubectl-edit", now);
        assert_eq!(
            managers(&edited),
            [
                ("drover".into(), "Apply".into()),
                ("kubectl-edit".into(), "Update".into())
            ]
        );
        // The same configuration again conflicts on exactly that field.
        let refused = apply(
            Some(&edited),
            &deployment("nginx:1", 2),
            "drover",
            false,
            now,
        )
        .unwrap_err();
        assert_eq!(
            conflict_message(&refused),
            "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using apps/v1: \
             .spec.template.spec.containers[name=\"web\"].image"
        );
        // Applying the value the editor set is no conflict: the field is shared.
        apply(
            Some(&edited),
            &deployment("nginx:evil", 2),
            "drover",
            false,
            now,
        )
        .unwrap();
        // Forced, the applier takes the field back and the editor is left with nothing.
        let forced = apply(
            Some(&edited),
            &deployment("nginx:1", 2),
            "drover",
            true,
            now,
        )
        .unwrap();
        assert_eq!(
            forced["spec"]["template"]["spec"]["containers"][0]["image"],
            "nginx:1"
        );
        assert_eq!(managers(&forced), [("drover".into(), "Apply".into())]);
    }

    #[test]
    fn a_field_the_applier_drops_goes_unless_someone_else_owns_it() {
        let now = "2026-12-02T00:00:00Z";
        let mut config = deployment("nginx:1", 2);
        config["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "sidecar", "image": "envoy"}));
        let first = apply(None, &config, "drover", false, now).unwrap();
        // Someone else labels it: that label survives the applier.
        let mut labelled = first.clone();
        labelled["metadata"]["labels"]["team"] = json!("a");
        record_update(Some(&first), &mut labelled, "kubectl-label", now);
        // The next configuration drops the sidecar and the replicas.
        let mut next = deployment("nginx:1", 2);
        next["spec"].as_object_mut().unwrap().remove("replicas");
        let after = apply(Some(&labelled), &next, "drover", false, now).unwrap();
        let containers = after["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        assert_eq!(containers.len(), 1, "{after}");
        assert!(after["spec"].get("replicas").is_none(), "{after}");
        assert_eq!(after["metadata"]["labels"]["team"], "a");
    }

    #[test]
    fn the_manager_is_the_field_manager_or_the_clients_program() {
        assert_eq!(
            manager_of(Some("kubectl-edit"), Some("kubectl/v1.32")),
            "kubectl-edit"
        );
        assert_eq!(
            manager_of(None, Some("kubectl/v1.32.0 (linux/amd64) kubernetes/abc")),
            "kubectl"
        );
        assert_eq!(manager_of(None, None), "unknown");
    }
}
