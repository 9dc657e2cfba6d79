//! What the continuous delivery tests share: polling the hub or a cluster until something
//! holds, and the objects they deliver.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::imported::kubectl;

/// Polls `what` (every 100 ms, up to 60 s) until `done` holds for its answer.
pub async fn until<F: Future<Output = Value>>(
    what: &str,
    mut read: impl FnMut() -> F,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let now = read().await;
        if done(&now) {
            return now;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what}: not within 60 s; last seen {now:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What kubectl finds of `kind/name` in namespace shop (`null`: nothing).
pub async fn found(kubeconfig: &Path, kind: &str, name: &str) -> Value {
    let (ok, stdout, _) = kubectl(
        kubeconfig,
        &[
            "get",
            kind,
            name,
            "-n",
            "shop",
            "-o",
            "json",
            "--show-managed-fields",
        ],
    )
    .await;
    if ok {
        serde_json::from_str(&stdout).unwrap()
    } else {
        Value::Null
    }
}

pub fn image(deployment: &Value) -> &str {
    deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
}

/// A Deployment `web` of `image` (its `CLUSTER` variable from the cluster's name and region
/// label), and with `with_settings` a ConfigMap `settings`.
pub fn manifests(image: &str, with_settings: bool) -> String {
    let mut yaml = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 2\n  \
         selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    \
         spec:\n      containers:\n      - name: web\n        image: {image}\n        env:\n        \
         - {{name: CLUSTER, value: \"${{cluster.name}} in ${{cluster.labels.region}}\"}}\n"
    );
    if with_settings {
        yaml.push_str("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {mode: fast}\n");
    }
    yaml
}
