//! JSON merge patch (RFC 7386), as the hub's API and the simulated cluster both apply it.

use serde_json::Value;

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
}
