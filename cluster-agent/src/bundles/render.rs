//! A bundle's objects as this cluster gets them: variables substituted, namespace, labels and
//! images as the hub's customisations say.

use std::collections::BTreeMap;

use proto::cluster::v1::BundleDeployment;
use serde_json::{Value, json};

/// The label every object of a bundle carries: what pruning and the inventory trust.
pub const BUNDLE_LABEL: &str = "drover.io/bundle";

/// Kinds that live outside namespaces, as far as a bundle usually holds them; any other kind
/// is taken as namespaced (the API server says otherwise when applied).
const CLUSTER_SCOPED: [&str; 9] = [
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
];

pub fn cluster_scoped(kind: &str) -> bool {
    CLUSTER_SCOPED.contains(&kind)
}

/// `objects` rendered for `deployment`; an unknown `${…}` is an error naming it and the object.
pub fn render(objects: &[Value], deployment: &BundleDeployment) -> Result<Vec<Value>, String> {
    let mut out = Vec::with_capacity(objects.len());
    for object in objects {
        let mut object = object.clone();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        let kind = object["kind"].as_str().unwrap_or("?").to_owned();
        substitute(&mut object, &deployment.vars)
            .map_err(|v| format!("{kind} {name}: ${{{v}}} is not known in this cluster (known: cluster.name, cluster.labels.KEY for the cluster's labels)"))?;
        if !cluster_scoped(&kind) {
            let given = object["metadata"]["namespace"].as_str().unwrap_or("");
            let namespace = [
                deployment.namespace.as_str(),
                given,
                deployment.default_namespace.as_str(),
                "default",
            ]
            .into_iter()
            .find(|n| !n.is_empty())
            .unwrap_or("default")
            .to_owned();
            object["metadata"]["namespace"] = json!(namespace);
        }
        if !object["metadata"]["labels"].is_object() {
            object["metadata"]["labels"] = json!({});
        }
        for (k, v) in &deployment.labels {
            object["metadata"]["labels"][k] = json!(v);
        }
        object["metadata"]["labels"][BUNDLE_LABEL] = json!(deployment.bundle);
        replace_images(&mut object, &deployment.images);
        out.push(object);
    }
    Ok(out)
}

/// Replaces `${NAME}` in every string; the first unknown name is the error.
fn substitute(value: &mut Value, vars: &BTreeMap<String, String>) -> Result<(), String> {
    match value {
        Value::String(text) if text.contains("${") => {
            let mut out = String::with_capacity(text.len());
            let mut rest = text.as_str();
            while let Some(start) = rest.find("${") {
                out.push_str(&rest[..start]);
                let after = &rest[start + 2..];
                let Some(end) = after.find('}') else {
                    out.push_str(&rest[start..]);
                    rest = "";
                    break;
                };
                let name = &after[..end];
                out.push_str(vars.get(name).ok_or_else(|| name.to_owned())?);
                rest = &after[end + 1..];
            }
            out.push_str(rest);
            *text = out;
            Ok(())
        }
        Value::Array(items) => items.iter_mut().try_for_each(|v| substitute(v, vars)),
        Value::Object(map) => map.values_mut().try_for_each(|v| substitute(v, vars)),
        _ => Ok(()),
    }
}

/// An image's name without its tag or digest (`registry:5000/nginx:1.27` → `registry:5000/nginx`).
fn image_name(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => &image[..i],
        _ => image,
    }
}

/// Every container's image that `images` names (the whole reference first, else its name)
/// replaced.
fn replace_images(value: &mut Value, images: &BTreeMap<String, String>) {
    if images.is_empty() {
        return;
    }
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if matches!(key.as_str(), "containers" | "initContainers")
                    && let Value::Array(containers) = child
                {
                    for container in containers {
                        let Some(image) = container["image"].as_str() else {
                            continue;
                        };
                        let replacement =
                            images.get(image).or_else(|| images.get(image_name(image)));
                        if let Some(r) = replacement {
                            container["image"] = json!(r);
                        }
                    }
                } else {
                    replace_images(child, images);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| replace_images(v, images)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn variables_namespace_labels_and_images_are_the_clusters() {
        let deployment = BundleDeployment {
            bundle: "shop".into(),
            default_namespace: "apps".into(),
            namespace: String::new(),
            labels: [("tier".to_string(), "prod".to_string())].into(),
            images: [("nginx".to_string(), "mirror.local/nginx:1.27".to_string())].into(),
            vars: [
                ("cluster.name".to_string(), "east".to_string()),
                ("cluster.labels.region".to_string(), "eu".to_string()),
            ]
            .into(),
            ..BundleDeployment::default()
        };
        let objects = vec![
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                   "spec": {"template": {"spec": {"containers": [
                       {"name": "web", "image": "nginx:1.25",
                        "env": [{"name": "WHERE", "value": "${cluster.name} in ${cluster.labels.region}"}]},
                       {"name": "side", "image": "envoy:1"}]}}}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}}),
        ];
        let out = render(&objects, &deployment).unwrap();
        let web = &out[0];
        assert_eq!(web["metadata"]["namespace"], "apps");
        assert_eq!(web["metadata"]["labels"]["tier"], "prod");
        assert_eq!(web["metadata"]["labels"][BUNDLE_LABEL], "shop");
        let containers = &web["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers[0]["image"], "mirror.local/nginx:1.27");
        assert_eq!(containers[1]["image"], "envoy:1");
        assert_eq!(containers[0]["env"][0]["value"], "east in eu");
        assert!(out[1]["metadata"].get("namespace").is_none());

        let unknown = vec![json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c"}, "data": {"a": "${cluster.labels.zone}"}})];
        assert_eq!(
            render(&unknown, &deployment).unwrap_err(),
            "ConfigMap c: ${cluster.labels.zone} is not known in this cluster (known: cluster.name, cluster.labels.KEY for the cluster's labels)"
        );
        assert_eq!(
            image_name("registry:5000/nginx:1.27"),
            "registry:5000/nginx"
        );
        assert_eq!(image_name("registry:5000/nginx"), "registry:5000/nginx");
        assert_eq!(image_name("nginx@sha256:abc"), "nginx");
    }
}
