//! A custom cluster's private registries (`spec.registries`): mirrors and per-registry TLS and
//! credentials, written on every host as the distribution's `registries.yaml`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// K3s's and RKE2's `registries.yaml`, with credentials by reference.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Registries {
    /// By registry name (`docker.io`, `registry.example.com:5000`, `*`): where to pull from.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mirrors: BTreeMap<String, Mirror>,
    /// By registry host (`mirror.example.com:5000`): how to reach it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub configs: BTreeMap<String, RegistryConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mirror {
    /// The mirrors' URLs, tried in order (`https://mirror.example.com:5000`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoint: Vec<String>,
    /// Image name rewrites: a regular expression and its replacement (`^rancher/(.*)` →
    /// `mirror/rancher/$1`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rewrite: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryConfig {
    /// A CloudCredential of driver `registry` (user name and write-only password).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub credential: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<RegistryTls>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryTls {
    /// The CA certificates (PEM) the registry's certificate is checked against.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_bundle: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_skip_verify: bool,
}

/// Registry credential `name` (a CloudCredential of driver `registry`: a login, a client
/// certificate, or both), or why it cannot be had.
pub async fn login(
    store: &dyn crate::store::Store,
    name: &str,
) -> Result<Result<super::RegistryCredential, String>, crate::store::StoreError> {
    let object = match store.get(super::Kind::CloudCredential.name(), name).await {
        Ok(object) => object,
        Err(crate::store::StoreError::NotFound { .. }) => {
            return Ok(Err(format!(
                "CloudCredential {name} does not exist; create it (driver registry)"
            )));
        }
        Err(e) => return Err(e),
    };
    Ok(serde_json::from_value::<super::CloudCredentialSpec>(object.spec)
        .ok()
        .and_then(|c| c.registry)
        .ok_or_else(|| {
            format!("CloudCredential {name} is not a registry's (driver registry, with spec.registry)")
        }))
}

/// Checks names, URLs, credentials' names and CA bundles, naming the bad field.
pub fn validate(registries: &Registries) -> Result<(), String> {
    let host_ok = |h: &str| {
        !h.is_empty()
            && h.len() <= 253
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '*' | '_'))
    };
    for (name, mirror) in &registries.mirrors {
        let at = format!("spec.registries.mirrors[{name:?}]");
        if !host_ok(name) {
            return Err(format!(
                "{at}: a registry's name, as images name it (docker.io, registry.example.com:5000, or *)"
            ));
        }
        for url in &mirror.endpoint {
            let rest = url
                .strip_prefix("https://")
                .or_else(|| url.strip_prefix("http://"));
            if !rest.is_some_and(|r| !r.is_empty() && !r.contains(char::is_whitespace)) {
                return Err(format!(
                    "{at}.endpoint: {url:?} must be an https:// or http:// URL"
                ));
            }
        }
        for pattern in mirror.rewrite.keys() {
            if pattern.is_empty() {
                return Err(format!("{at}.rewrite: a rewrite needs a pattern"));
            }
        }
    }
    for (host, config) in &registries.configs {
        let at = format!("spec.registries.configs[{host:?}]");
        if !host_ok(host) {
            return Err(format!(
                "{at}: a registry's host (and port), e.g. registry.example.com:5000"
            ));
        }
        if !config.credential.is_empty() {
            super::validate_name(super::Kind::CloudCredential, &config.credential)
                .map_err(|e| format!("{at}.credential: {e}"))?;
        }
        // Parsed as certificates, not just by its header: a bundle the hosts' containerd cannot
        // read would break every pull from the registry, quietly.
        if let Some(tls) = &config.tls
            && !tls.ca_bundle.is_empty()
            && let Err(e) = tunnel::tls::roots_from_pem(tls.ca_bundle.as_bytes())
        {
            return Err(format!(
                "{at}.tls.caBundle: give the CA certificates in PEM (-----BEGIN CERTIFICATE----- …): {e}"
            ));
        }
    }
    Ok(())
}

/// The credentials `registries` names.
pub fn credentials_named(registries: &Registries) -> Vec<String> {
    let mut names: Vec<String> = registries
        .configs
        .values()
        .map(|c| c.credential.clone())
        .filter(|c| !c.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}
