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

/// `value` without the password of a URL's user (`http://user:secret@proxy:3128` →
/// `http://user@proxy:3128`) and that password; `None` when it holds none.
pub fn split_url_password(value: &str) -> Option<(String, String)> {
    let (scheme, rest) = value.split_once("://")?;
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let (userinfo, host) = authority.rsplit_once('@')?;
    let (user, password) = userinfo.split_once(':')?;
    Some((
        format!("{scheme}://{user}@{host}{path}"),
        password.to_owned(),
    ))
}

/// A cluster spec's `agentEnv` as the API shows it: a proxy URL's password is write-only, as
/// every secret the API takes.
pub fn redact_env(spec: &mut serde_json::Value) {
    for var in spec
        .get_mut("agentEnv")
        .and_then(serde_json::Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(value) = var.get_mut("value")
            && let Some((shown, _)) = value.as_str().and_then(split_url_password)
        {
            *value = serde_json::Value::String(shown);
        }
    }
}

/// An update that gives a variable back as the API showed it (without its URL's password)
/// keeps the password stored.
pub fn keep_env_passwords(spec: &mut serde_json::Value, current: &serde_json::Value) {
    let stored: Vec<(String, String)> = current
        .get("agentEnv")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            Some((
                v["name"].as_str()?.to_owned(),
                v["value"].as_str()?.to_owned(),
            ))
        })
        .collect();
    for var in spec
        .get_mut("agentEnv")
        .and_then(serde_json::Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let name = var["name"].as_str().unwrap_or_default().to_owned();
        let Some(value) = var.get_mut("value") else {
            continue;
        };
        let kept = stored.iter().find_map(|(n, v)| {
            let (shown, _) = split_url_password(v)?;
            (*n == name && value.as_str() == Some(shown.as_str())).then(|| v.clone())
        });
        if let Some(kept) = kept {
            *value = serde_json::Value::String(kept);
        }
    }
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

/// The agents' image settings (`cluster-agent-image`, `node-agent-image`,
/// `agent-image-pull-policy`), checked as a cluster's `spec.agentImages` is.
pub fn validate_setting(name: &str, spec: &serde_json::Value) -> Result<(), String> {
    let value = spec
        .get("value")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    let images = match name {
        "cluster-agent-image" => AgentImages {
            cluster_agent: value.into(),
            ..AgentImages::default()
        },
        "node-agent-image" => AgentImages {
            node_agent: value.into(),
            ..AgentImages::default()
        },
        "agent-image-pull-policy" => AgentImages {
            pull_policy: value.into(),
            ..AgentImages::default()
        },
        _ => return Ok(()),
    };
    validate_images(&images)
        .map_err(|e| e.replace("spec.agentImages.", &format!("setting {name}: ")))
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
    fn a_proxy_password_is_write_only() {
        assert_eq!(
            split_url_password("http://drover:s3cr:et@proxy.corp:3128/x"),
            Some(("http://drover@proxy.corp:3128/x".into(), "s3cr:et".into()))
        );
        assert_eq!(split_url_password("http://proxy.corp:3128"), None);
        assert_eq!(split_url_password("10.0.0.0/8,.svc"), None);
        let stored = serde_json::json!({"agentEnv": [
            {"name": "HTTPS_PROXY", "value": "http://drover:s3cret@proxy.corp:3128"},
            {"name": "NO_PROXY", "value": ".svc"}]});
        let mut shown = stored.clone();
        redact_env(&mut shown);
        assert!(!shown.to_string().contains("s3cret"), "{shown}");
        assert_eq!(
            shown["agentEnv"][0]["value"],
            "http://drover@proxy.corp:3128"
        );
        // Given back as shown: kept. Given a new password or another proxy: taken.
        let mut update = shown.clone();
        keep_env_passwords(&mut update, &stored);
        assert_eq!(update, stored);
        let mut update = serde_json::json!({"agentEnv": [
            {"name": "HTTPS_PROXY", "value": "http://drover:new@proxy.corp:3128"}]});
        keep_env_passwords(&mut update, &stored);
        assert_eq!(
            update["agentEnv"][0]["value"],
            "http://drover:new@proxy.corp:3128"
        );
        let mut update = serde_json::json!({"agentEnv": [
            {"name": "HTTPS_PROXY", "value": "http://drover@other.corp:3128"}]});
        keep_env_passwords(&mut update, &stored);
        assert_eq!(
            update["agentEnv"][0]["value"],
            "http://drover@other.corp:3128"
        );
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
