//! The patch formats Kubernetes clients send, as the hub's API and the simulated cluster both
//! apply them: JSON merge patch (RFC 7386), strategic merge patch (as far as `kubectl apply`,
//! `label`, `annotate` and `scale` need: maps merge, lists of objects with a known merge key
//! merge by that key, `$patch` and `$setElementOrder` directives), and JSON patch (RFC 6902).

use serde_json::{Map, Value};

/// Applies `patch` to `target`: objects merge key by key, `null` removes a key, anything else
/// replaces what was there.
pub fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (key, value) in p {
                if value.is_null() {
                    t.remove(key);
                } else {
                    merge(t.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

/// The field lists of built-in types merge on (Kubernetes' `patchMergeKey`).
pub fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        _ => return None,
    })
}

/// Strategic merge patch, for the subset above. Service ports merge on `port`; everything else
/// follows [`merge_key`]; lists without a key are replaced.
pub fn strategic(target: &mut Value, patch: &Value) {
    strategic_at(target, patch, "");
}

fn strategic_at(target: &mut Value, patch: &Value, field: &str) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            if p.get("$patch").and_then(Value::as_str) == Some("replace") {
                let mut replacement = p.clone();
                replacement.remove("$patch");
                *t = replacement;
                return;
            }
            for (key, value) in p {
                if key.starts_with("$setElementOrder/") || key == "$retainKeys" || key == "$patch" {
                    continue;
                }
                if let Some(list) = key.strip_prefix("$deleteFromPrimitiveList/") {
                    if let (Some(Value::Array(items)), Value::Array(remove)) =
                        (t.get_mut(list), value)
                    {
                        items.retain(|i| !remove.contains(i));
                    }
                    continue;
                }
                if value.is_null() {
                    t.remove(key);
                    continue;
                }
                let slot = t.entry(key.clone()).or_insert(Value::Null);
                match (slot.is_array(), value) {
                    (true, Value::Array(items)) => merge_list(slot, items, key),
                    _ if slot.is_null() => *slot = without_directives(value),
                    _ => strategic_at(slot, value, key),
                }
            }
        }
        (target, patch) => {
            let _ = field;
            *target = without_directives(patch);
        }
    }
}

fn merge_list(target: &mut Value, patch: &[Value], field: &str) {
    let Some(key) = merge_key(field).filter(|_| patch.iter().all(Value::is_object)) else {
        *target = Value::Array(patch.iter().map(without_directives).collect());
        return;
    };
    let Value::Array(items) = target else { return };
    for element in patch {
        let id = element.get(key).or_else(|| element.get("port"));
        let position = items
            .iter()
            .position(|i| id.is_some() && (i.get(key) == id || i.get("port") == id));
        let directive = element.get("$patch").and_then(Value::as_str);
        match (position, directive) {
            (Some(i), Some("delete")) => {
                items.remove(i);
            }
            (None, Some("delete")) => {}
            (Some(i), _) => strategic_at(&mut items[i], element, field),
            (None, _) => items.push(without_directives(element)),
        }
    }
}

fn without_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), without_directives(v)))
                .collect::<Map<_, _>>(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_directives).collect()),
        other => other.clone(),
    }
}

/// RFC 6902: add, remove, replace, test (what kubectl and client libraries send).
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch is an array of operations")?;
    for op in ops {
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or("every operation needs a path")?;
        let value = op.get("value").cloned().unwrap_or(Value::Null);
        let (parent_path, last) = path
            .rsplit_once('/')
            .ok_or_else(|| format!("bad path {path:?}"))?;
        let last = last.replace("~1", "/").replace("~0", "~");
        match op.get("op").and_then(Value::as_str) {
            Some("test") => {
                if target.pointer(path) != Some(&value) {
                    return Err(format!("test failed at {path}"));
                }
            }
            Some(kind @ ("add" | "replace" | "remove")) => {
                let parent = target
                    .pointer_mut(parent_path)
                    .ok_or_else(|| format!("no {parent_path:?}"))?;
                match parent {
                    Value::Object(map) => {
                        if kind == "remove" {
                            map.remove(&last)
                                .ok_or_else(|| format!("nothing at {path}"))?;
                        } else {
                            map.insert(last, value);
                        }
                    }
                    Value::Array(items) => {
                        let index = if last == "-" {
                            items.len()
                        } else {
                            last.parse().map_err(|_| format!("bad index in {path}"))?
                        };
                        match kind {
                            "add" if index <= items.len() => items.insert(index, value),
                            "replace" if index < items.len() => items[index] = value,
                            "remove" if index < items.len() => {
                                items.remove(index);
                            }
                            _ => return Err(format!("index out of range in {path}")),
                        }
                    }
                    _ => return Err(format!("{parent_path:?} is not a container")),
                }
            }
            other => return Err(format!("unsupported JSON patch operation {other:?}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_rfc_7386_examples_hold() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge(&mut doc, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}}));
        let mut doc = json!({"a": [{"b": "c"}]});
        merge(&mut doc, &json!({"a": [1]}));
        assert_eq!(doc, json!({"a": [1]}));
        let mut doc = json!(["a", "b"]);
        merge(&mut doc, &json!({"a": "c"}));
        assert_eq!(doc, json!({"a": "c"}));
    }

    #[test]
    fn strategic_merge_merges_containers_by_name_and_replaces_plain_lists() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "args": ["x"]},
            {"name": "b", "image": "b:1"}
        ]}, "metadata": {"labels": {"app": "x", "old": "y"}}});
        let patch = json!({
            "metadata": {"labels": {"old": null, "new": "z"}},
            "spec": {
                "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
                "containers": [{"name": "a", "image": "a:2", "args": ["y"]}, {"name": "b", "$patch": "delete"}]
            }
        });
        strategic(&mut pod, &patch);
        assert_eq!(pod["metadata"]["labels"], json!({"app": "x", "new": "z"}));
        assert_eq!(
            pod["spec"]["containers"],
            json!([{"name": "a", "image": "a:2", "args": ["y"]}])
        );
    }

    #[test]
    fn json_patch_adds_replaces_and_removes() {
        let mut doc = json!({"a": {"b": 1}, "l": [1, 2]});
        json_patch(
            &mut doc,
            &json!([
                {"op": "replace", "path": "/a/b", "value": 2},
                {"op": "add", "path": "/l/-", "value": 3},
                {"op": "remove", "path": "/l/0"},
                {"op": "add", "path": "/a/c~1d", "value": true}
            ]),
        )
        .unwrap();
        assert_eq!(doc, json!({"a": {"b": 2, "c/d": true}, "l": [2, 3]}));
        assert!(
            json_patch(
                &mut doc,
                &json!([{"op": "test", "path": "/a/b", "value": 9}])
            )
            .is_err()
        );
    }
}
