//! What a request to the simulated API server names: its resource, namespace, name and
//! subresource, its query, its selectors, and whether it asks for a table.

use std::collections::BTreeMap;

use axum::http::{HeaderMap, header};
use serde_json::Value;

use super::{
    resources::{self, Resource},
    store::Key,
    table::Include,
};

/// Where a resource request points.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) resource: &'static Resource,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) sub: Option<String>,
}

impl Target {
    pub(super) fn key(&self) -> Key {
        (
            self.namespace.clone().unwrap_or_default(),
            self.name.clone().unwrap_or_default(),
        )
    }

    pub(super) fn describe(&self) -> String {
        match &self.name {
            Some(name) => format!("{} \"{name}\"", self.resource.plural),
            None => self.resource.plural.to_owned(),
        }
    }
}

pub(super) fn parse_target(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let found = |plural: &str| resources::find(group, version, plural);
    let owned = |s: &&str| Some((*s).to_owned());
    match rest {
        ["namespaces", ns, plural, tail @ ..] if found(plural).is_some_and(|r| r.namespaced) => {
            let resource = found(plural)?;
            match tail {
                [] => Some(Target {
                    resource,
                    namespace: owned(ns),
                    name: None,
                    sub: None,
                }),
                [name] => Some(Target {
                    resource,
                    namespace: owned(ns),
                    name: owned(name),
                    sub: None,
                }),
                [name, sub] => Some(Target {
                    resource,
                    namespace: owned(ns),
                    name: owned(name),
                    sub: owned(sub),
                }),
                _ => None,
            }
        }
        [plural, tail @ ..] => {
            let resource = found(plural)?;
            match (tail, resource.namespaced) {
                ([], _) => Some(Target {
                    resource,
                    namespace: None,
                    name: None,
                    sub: None,
                }),
                ([name], false) => Some(Target {
                    resource,
                    namespace: None,
                    name: owned(name),
                    sub: None,
                }),
                ([name, sub], false) => Some(Target {
                    resource,
                    namespace: None,
                    name: owned(name),
                    sub: owned(sub),
                }),
                _ => None,
            }
        }
        [] => None,
    }
}

pub(super) fn query(uri: &axum::http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .map(|q| {
            q.split('&')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    Some((decode(k)?, decode(v)?))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `field=value`, `field==value`, `field!=value`, joined by commas, on dotted JSON paths.
pub(super) fn field_matches(selector: &str, object: &Value) -> bool {
    selector
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .all(|part| {
            let (path, negate, want) = if let Some((p, v)) = part.split_once("!=") {
                (p, true, v)
            } else if let Some((p, v)) = part.split_once("==") {
                (p, false, v)
            } else if let Some((p, v)) = part.split_once('=') {
                (p, false, v)
            } else {
                return true;
            };
            let pointer = format!("/{}", path.trim().replace('.', "/"));
            let got = object
                .pointer(&pointer)
                .and_then(Value::as_str)
                .unwrap_or_default();
            (got == want.trim()) != negate
        })
}

pub(super) fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the client asks for a Table (server-side printing), and what its rows carry.
pub(super) fn wants_table(
    headers: &HeaderMap,
    params: &BTreeMap<String, String>,
) -> Result<Option<Include>, String> {
    let table = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"));
    if !table {
        return Ok(None);
    }
    Include::of(params.get("includeObject").map(String::as_str)).map(Some)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn paths_name_their_resource_namespace_name_and_subresource() {
        let t = parse_target("/api/v1/namespaces/default/pods/web-1/log").unwrap();
        assert_eq!(
            (
                t.resource.plural,
                t.namespace.as_deref(),
                t.name.as_deref(),
                t.sub.as_deref()
            ),
            ("pods", Some("default"), Some("web-1"), Some("log"))
        );
        let t = parse_target("/api/v1/namespaces/kube-system").unwrap();
        assert_eq!(
            (t.resource.plural, t.name.as_deref()),
            ("namespaces", Some("kube-system"))
        );
        let t = parse_target("/apis/apps/v1/deployments").unwrap();
        assert_eq!((t.resource.plural, t.namespace), ("deployments", None));
        assert!(
            parse_target("/api/v1/pods/x").is_none(),
            "namespaced objects need their namespace"
        );
        assert!(parse_target("/apis/networking.k8s.io/v1/ingresses").is_none());
    }

    #[test]
    fn field_selectors_follow_dotted_paths() {
        let pod = json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        assert!(field_matches("spec.nodeName=n1,status.phase!=Failed", &pod));
        assert!(!field_matches("metadata.name==b", &pod));
        assert!(field_matches("", &pod));
    }

    #[test]
    fn query_strings_are_decoded() {
        let q = query(
            &"/x?labelSelector=app%3Dweb%2Ctier+in+%28a%29&watch=1"
                .parse()
                .unwrap(),
        );
        assert_eq!(q["labelSelector"], "app=web,tier in (a)");
        assert_eq!(q["watch"], "1");
    }
}
