//! What a record keeps of a request's body: its JSON with every password, token, key and
//! Secret value replaced by `<redacted>`, or for the kinds that hold secrets only what the
//! body names.

use axum::extract::Request;

use super::{
    BODY_LIMIT, REDACTED,
    describe::{as_v1, kube_resource},
};

/// Whether a JSON key names something secret.
fn secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "token",
        "privatekey",
        "credential",
        "passphrase",
    ]
    .iter()
    .any(|s| key.contains(s))
}

/// The hub's own kinds whose objects hold secrets (a project secret's data, a credential's
/// keys and passwords, a provider's bind password or client secret), by API plural.
const SECRET_KINDS: &[&str] = &["projectsecrets", "cloudcredentials", "authproviders"];

/// Whether a request to `path` carries a secret whatever its body looks like: a Secret
/// through the proxy, or one of the hub's secret-bearing kinds. Such a body is never recorded,
/// only a summary of it ([`summary`]): a patch of any type, YAML or protobuf, a body without
/// `kind`, or kubectl's `last-applied-configuration` would each slip past redaction by field.
fn secret_bearing(path: &str) -> bool {
    let path = as_v1(path);
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["k8s", "clusters", _, rest @ ..] => {
            let (resource, _) = kube_resource(rest);
            resource == "secrets" || resource.starts_with("secrets/")
        }
        ["v1", plural, ..] => SECRET_KINDS.contains(plural),
        _ => false,
    }
}

/// What is recorded of a secret-bearing request's body: which object it names and what kind
/// of change it is, never a value.
fn summary(body: &serde_json::Value) -> serde_json::Value {
    let mut kept = serde_json::Map::new();
    match body {
        serde_json::Value::Object(object) => {
            for field in ["apiVersion", "kind"] {
                if let Some(value) = object.get(field).filter(|v| v.is_string()) {
                    kept.insert(field.to_owned(), value.clone());
                }
            }
            let metadata = &object.get("metadata");
            let mut named = serde_json::Map::new();
            for field in ["name", "namespace"] {
                if let Some(value) = metadata
                    .and_then(|m| m.get(field))
                    .filter(|v| v.is_string())
                {
                    named.insert(field.to_owned(), value.clone());
                }
            }
            if !named.is_empty() {
                kept.insert("metadata".into(), named.into());
            }
        }
        serde_json::Value::Array(operations) => {
            kept.insert("operations".into(), operations.len().into());
        }
        _ => {}
    }
    kept.insert(
        "redacted".into(),
        "the body of a request to a secret-bearing resource is not recorded".into(),
    );
    kept.into()
}

/// The annotation in which `kubectl apply` keeps the whole object it applied, as a string.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// `value` with every secret replaced: fields whose names say secret, and the values of a
/// Secret's (or a project secret's) `data` and `stringData` and its `last-applied-configuration`.
pub fn redact(mut value: serde_json::Value) -> serde_json::Value {
    fn walk(value: &mut serde_json::Value, secret_data: bool) {
        match value {
            serde_json::Value::Object(map) => {
                let holds_data = secret_data
                    || map
                        .get("kind")
                        .and_then(serde_json::Value::as_str)
                        .is_some_and(|k| k == "Secret" || k == "ProjectSecret");
                for (key, field) in map.iter_mut() {
                    if secret_key(key) && !field.is_object() {
                        *field = REDACTED.into();
                    } else if key == LAST_APPLIED {
                        // The whole applied object, as text: redacted as the object would be.
                        if let Some(applied) = field
                            .as_str()
                            .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
                        {
                            *field = redact(applied).to_string().into();
                        } else {
                            *field = REDACTED.into();
                        }
                    } else if holds_data && (key == "data" || key == "stringData") {
                        if let serde_json::Value::Object(entries) = field {
                            for entry in entries.values_mut() {
                                *entry = REDACTED.into();
                            }
                        } else {
                            *field = REDACTED.into();
                        }
                    } else {
                        // A project secret's data sits in its spec.
                        walk(field, holds_data && key == "spec");
                    }
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    walk(item, secret_data);
                }
            }
            // A URL's password (a proxy's, in a cluster's agentEnv), wherever it is.
            serde_json::Value::String(text) => {
                if let Some((shown, _)) = crate::model::agentconfig::split_url_password(text) {
                    *text = shown.replacen('@', &format!(":{REDACTED}@"), 1);
                }
            }
            _ => {}
        }
    }
    walk(&mut value, false);
    value
}

/// The request again (its body read, if it was), and what the record keeps of the body.
pub(super) async fn body_of(request: Request) -> (Request, Option<serde_json::Value>) {
    // (Read before any await: a borrowed request is not `Send`, its body not being `Sync`.)
    let (kind, length) = {
        let header = |name| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        (
            header(axum::http::header::CONTENT_TYPE).unwrap_or_default(),
            header(axum::http::header::CONTENT_LENGTH).and_then(|l| l.parse::<u64>().ok()),
        )
    };
    let json = kind.starts_with("application/json")
        || kind.starts_with("application/merge-patch+json")
        || kind.starts_with("application/strategic-merge-patch+json")
        || kind.starts_with("application/json-patch+json")
        || kind.starts_with("application/apply-patch+json");
    match length {
        Some(0) | None if kind.is_empty() => (request, None),
        Some(n) if n <= BODY_LIMIT && json => {
            let (parts, body) = request.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, BODY_LIMIT as usize).await else {
                // The client stopped sending: the handler sees the same.
                return (
                    Request::from_parts(parts, axum::body::Body::empty()),
                    Some("<not recorded: the body could not be read>".into()),
                );
            };
            let secret = secret_bearing(parts.uri.path());
            let kept = serde_json::from_slice::<serde_json::Value>(&bytes)
                .map(|body| if secret { summary(&body) } else { redact(body) })
                .unwrap_or_else(|_| "<not recorded: not JSON>".into());
            (
                Request::from_parts(parts, axum::body::Body::from(bytes)),
                Some(kept),
            )
        }
        _ => {
            let why = format!(
                "<not recorded: {} of {}>",
                length.map_or_else(|| "a streamed body".to_owned(), |n| format!("{n} bytes")),
                if kind.is_empty() {
                    "no stated type"
                } else {
                    kind.as_str()
                }
            );
            (request, Some(why.into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_to_secret_bearing_resources_keep_only_what_they_name() {
        for path in [
            "/k8s/clusters/prod/api/v1/namespaces/default/secrets",
            "/k8s/clusters/prod/api/v1/namespaces/default/secrets/db",
            "/k8s/clusters/prod/api/v1/secrets",
            "/v1/projectsecrets",
            "/v1/projectsecrets/db",
            "/v1/cloudcredentials/corp-pull",
            "/v1/authproviders/corp",
            "/apis/management.drover.io/v1/cloudcredentials/corp-pull",
        ] {
            assert!(secret_bearing(path), "{path}");
        }
        for path in [
            "/k8s/clusters/prod/api/v1/namespaces/default/configmaps/secrets",
            "/k8s/clusters/prod/api/v1/namespaces/secrets/pods",
            "/v1/clusters/secrets",
            "/v1/users",
        ] {
            assert!(!secret_bearing(path), "{path}");
        }
        // Whatever the body's shape: an object without kind, a JSON patch, a merge patch.
        let object = summary(
            &serde_json::json!({"metadata": {"name": "db", "namespace": "x",
            "annotations": {"note": "hunter2"}}, "stringData": {"pw": "hunter2"}}),
        );
        assert_eq!(
            object["metadata"],
            serde_json::json!({"name": "db", "namespace": "x"})
        );
        assert!(!object.to_string().contains("hunter2"), "{object}");
        let patch = summary(&serde_json::json!([{"op": "replace", "path": "/data/pw",
            "value": "aHVudGVyMg=="}]));
        assert_eq!(patch["operations"], 1);
        assert!(!patch.to_string().contains("aHVudGVyMg"), "{patch}");
        let merge = summary(&serde_json::json!({"data": {"pw": "aHVudGVyMg=="}}));
        assert!(!merge.to_string().contains("aHVudGVyMg"), "{merge}");
    }

    #[test]
    fn a_secrets_last_applied_configuration_is_redacted_wherever_it_is() {
        let applied = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "db"}, "stringData": {"pw": "hunter2-hunter2"}});
        let list = redact(
            serde_json::json!({"kind": "List", "items": [{"kind": "Secret",
            "metadata": {"name": "db", "annotations": {LAST_APPLIED: applied.to_string()}},
            "stringData": {"pw": "hunter2-hunter2"}}]}),
        );
        assert!(!list.to_string().contains("hunter2-hunter2"), "{list}");
        // Another kind's stays as it was.
        let config = serde_json::json!({"kind": "ConfigMap", "metadata": {"name": "c"},
            "data": {"k": "v"}});
        let kept = redact(
            serde_json::json!({"kind": "ConfigMap", "metadata": {"name": "c",
            "annotations": {LAST_APPLIED: config.to_string()}}}),
        );
        let text = kept["metadata"]["annotations"][LAST_APPLIED]
            .as_str()
            .unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(text).unwrap(),
            config
        );
    }

    #[test]
    fn secrets_in_bodies_are_redacted_and_the_rest_kept() {
        let body = serde_json::json!({
            "username": "pat", "password": "hunter2-hunter2",
            "spec": {"password": "p", "groups": ["ops"], "bindPassword": "b", "tokenTTL": 5,
                     "nested": [{"clientSecret": "c", "name": "x"}]},
        });
        let kept = redact(body);
        assert_eq!(kept["password"], REDACTED);
        assert_eq!(kept["username"], "pat");
        assert_eq!(kept["spec"]["password"], REDACTED);
        assert_eq!(kept["spec"]["bindPassword"], REDACTED);
        assert_eq!(kept["spec"]["groups"], serde_json::json!(["ops"]));
        assert_eq!(kept["spec"]["nested"][0]["clientSecret"], REDACTED);
        assert_eq!(kept["spec"]["nested"][0]["name"], "x");
        let secret = redact(
            serde_json::json!({"kind": "Secret", "metadata": {"name": "s"},
            "data": {"pw": "aHVudGVy"}, "stringData": {"pw": "hunter"}}),
        );
        assert_eq!(secret["data"]["pw"], REDACTED);
        assert_eq!(secret["stringData"]["pw"], REDACTED);
        assert_eq!(secret["metadata"]["name"], "s");
        let project = redact(serde_json::json!({"kind": "ProjectSecret",
            "spec": {"cluster": "prod", "data": {"k": "dg=="}}}));
        assert_eq!(project["spec"]["data"]["k"], REDACTED);
        assert_eq!(project["spec"]["cluster"], "prod");
        // A ConfigMap's data is not secret.
        let config = redact(serde_json::json!({"kind": "ConfigMap", "data": {"k": "v"}}));
        assert_eq!(config["data"]["k"], "v");
        // A proxy's password in a cluster's agentEnv.
        let cluster = redact(serde_json::json!({"spec": {"agentEnv": [
            {"name": "HTTPS_PROXY", "value": "http://drover:s3cret@proxy:3128"}]}}));
        assert_eq!(
            cluster["spec"]["agentEnv"][0]["value"],
            format!("http://drover:{REDACTED}@proxy:3128")
        );
    }
}
