//! What a cluster's agents run with beyond Drover's own settings: extra environment
//! (`spec.agentEnv`: an HTTP proxy, above all) and where their images come from
//! (`spec.agentImages`: another registry, a pull policy, a pull secret).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One environment variable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    pub name: String,
    #[serde(default)]
    pub value: String,
}

/// The agents' images and how the cluster pulls them; what is left out comes from the hub's
/// settings (`cluster-agent-image`, `node-agent-image`, `agent-image-pull-policy`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentImages {
    /// A registry both images are pulled from instead (`registry.example.com:5000`): the
    /// images' names are kept, their registry replaced.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub registry: String,
    /// The cluster-agent's image, whole (`registry.example.com/drover/cluster-agent:0.1.0`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster_agent: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_agent: String,
    /// `Always`, `IfNotPresent` or `Never`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pull_policy: String,
    /// A CloudCredential of driver `registry`: the cluster gets it as an image pull secret for
    /// the images' registries.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pull_credential: String,
}

/// The variables Drover sets itself in the agents' containers and on hosts.
fn drovers_own(name: &str) -> bool {
    name.starts_with("DROVER_") || name == "KUBECONFIG"
}

/// Names are environment variables' (`[A-Za-z_][A-Za-z0-9_]*`), each once, none of Drover's
/// own; values are one line.
pub fn validate_env(env: &[EnvVar]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, var) in env.iter().enumerate() {
        let name = &var.name;
        let good = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !good {
            return Err(format!(
                "spec.agentEnv[{i}].name: {name:?} is not an environment variable's name (letters, digits and _, not starting with a digit)"
            ));
        }
        if drovers_own(name) {
            return Err(format!(
                "spec.agentEnv[{i}].name: {name} is Drover's own (DROVER_*, KUBECONFIG): the agents get it from their registration"
            ));
        }
        if var.value.contains(['\n', '\r', '\0']) {
            return Err(format!(
                "spec.agentEnv[{i}].value: {name}'s value must be one line"
            ));
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("spec.agentEnv[{i}].name: {name} is given twice"));
        }
    }
    Ok(())
}

pub fn validate_images(images: &AgentImages) -> Result<(), String> {
    if !matches!(
        images.pull_policy.as_str(),
        "" | "Always" | "IfNotPresent" | "Never"
    ) {
        return Err(format!(
            "spec.agentImages.pullPolicy: {:?} is not a pull policy (Always, IfNotPresent, Never)",
            images.pull_policy
        ));
    }
    if !images.registry.is_empty() && !registry_host_ok(&images.registry) {
        return Err(format!(
            "spec.agentImages.registry: {:?} must be a registry's host (and port), e.g. registry.example.com:5000",
            images.registry
        ));
    }
    for (field, image) in [
        ("clusterAgent", &images.cluster_agent),
        ("nodeAgent", &images.node_agent),
    ] {
        if image.contains(char::is_whitespace) || image.contains(['"', '\\']) {
            return Err(format!(
                "spec.agentImages.{field}: {image:?} is not an image reference (registry/name:tag)"
            ));
        }
    }
    Ok(())
}

fn registry_host_ok(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'))
}

/// The registry an image reference names (`docker.io` when it names none), as Docker and
/// containerd read references: the first component is a registry only if it has a `.` or a
/// `:`, or is `localhost`.
pub fn registry_of(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
}

/// `image` pulled from `registry` instead of its own.
pub fn with_registry(image: &str, registry: &str) -> String {
    let own = registry_of(image);
    let path = if own == "docker.io" && !image.starts_with("docker.io/") {
        image
    } else {
        image.split_once('/').map_or(image, |(_, rest)| rest)
    };
    format!("{registry}/{path}")
}

/// A `kubernetes.io/dockerconfigjson` Secret's `.dockerconfigjson`: one login for each of
/// `registries`.
pub fn docker_config(registries: &[&str], username: &str, password: &str) -> String {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
    let auths: serde_json::Map<String, serde_json::Value> = registries
        .iter()
        .map(|r| {
            // Docker Hub's logins are kept under its old index URL.
            let key = if *r == "docker.io" {
                "https://index.docker.io/v1/".to_owned()
            } else {
                (*r).to_owned()
            };
            (
                key,
                serde_json::json!({"username": username, "password": password, "auth": auth}),
            )
        })
        .collect();
    serde_json::json!({ "auths": auths }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn agent_env_names_are_checked_and_drovers_own_refused() {
        assert!(
            validate_env(&[
                var("HTTPS_PROXY", "http://p:3128"),
                var("NO_PROXY", "10.0.0.0/8")
            ])
            .is_ok()
        );
        let e = validate_env(&[var("HTTPS_PROXY", "x"), var("1X", "")]).unwrap_err();
        assert!(e.starts_with("spec.agentEnv[1].name: \"1X\""), "{e}");
        let e = validate_env(&[var("DROVER_SERVER", "https://elsewhere")]).unwrap_err();
        assert!(e.contains("Drover's own"), "{e}");
        let e = validate_env(&[var("A", "x\ny")]).unwrap_err();
        assert!(e.contains("one line"), "{e}");
        let e = validate_env(&[var("A", "1"), var("A", "2")]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn image_references_are_read_as_docker_reads_them() {
        assert_eq!(registry_of("drover/cluster-agent:0.1.0"), "docker.io");
        assert_eq!(registry_of("busybox"), "docker.io");
        assert_eq!(
            registry_of("registry.corp:5000/drover/a:1"),
            "registry.corp:5000"
        );
        assert_eq!(registry_of("localhost/a:1"), "localhost");
        assert_eq!(
            with_registry("drover/cluster-agent:0.1.0", "registry.corp:5000"),
            "registry.corp:5000/drover/cluster-agent:0.1.0"
        );
        assert_eq!(
            with_registry("old.registry/drover/node-agent:1", "new.registry"),
            "new.registry/drover/node-agent:1"
        );
        assert_eq!(
            with_registry("docker.io/drover/node-agent:1", "new.registry"),
            "new.registry/drover/node-agent:1"
        );
        let bad = AgentImages {
            pull_policy: "Sometimes".into(),
            ..AgentImages::default()
        };
        assert!(
            validate_images(&bad)
                .unwrap_err()
                .contains("Always, IfNotPresent, Never")
        );
    }

    #[test]
    fn a_pull_secret_holds_one_login_per_registry() {
        let config: serde_json::Value = serde_json::from_str(&docker_config(
            &["registry.corp:5000", "docker.io"],
            "u",
            "p",
        ))
        .unwrap();
        assert_eq!(config["auths"]["registry.corp:5000"]["auth"], "dTpw");
        assert_eq!(
            config["auths"]["https://index.docker.io/v1/"]["username"],
            "u"
        );
    }
}
