//! Registering clusters and hosts: the commands an operator runs, and the registration token
//! they carry. The token's value appears only in those commands; the hub keeps its hash.

use axum::{
    extract::{Path, State},
    http::header,
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use crate::{
    api::{error::ApiError, state::Api},
    auth::secret::{self, NewToken, TokenKind},
    model::{ClusterSpec, ClusterType, Kind},
    store::{Object, Op, Store, StoreError},
};

/// The import manifest's template (see `deploy/import.yaml`).
const IMPORT_TEMPLATE: &str = include_str!("../../deploy/import.yaml");

/// The host install script (see `deploy/system-agent-install.sh`).
const INSTALL_SCRIPT: &str = include_str!("../../deploy/system-agent-install.sh");

/// `GET /system-agent-install.sh`: not secret (the token comes on its command line), and it
/// checks the hub's CA against the checksum it is given before it trusts anything it fetches.
pub async fn install_script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/x-shellscript; charset=utf-8")],
        INSTALL_SCRIPT,
    )
        .into_response()
}

/// Where downloads for hosts are served from: agent binaries, and the air-gap artifacts of
/// each distribution version (`<data dir>/artifacts/<version>/<file>`).
#[derive(Debug, Clone)]
pub struct Downloads {
    pub binaries: std::path::PathBuf,
    pub artifacts: std::path::PathBuf,
}

/// This machine's architecture as the install script names it.
fn own_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// `GET /v3/system-agent/{arch}`: the system-agent binary for `amd64` or `arm64`, streamed.
pub async fn system_agent_binary(
    State(downloads): State<Downloads>,
    Path(arch): Path<String>,
) -> Result<Response, ApiError> {
    let binaries = &downloads.binaries;
    if !matches!(arch.as_str(), "amd64" | "arm64") {
        return Err(ApiError::not_found(format!(
            "no system-agent for architecture {arch:?}; there are amd64 and arm64"
        )));
    }
    let mut candidates = vec![binaries.join(format!("drover-system-agent-{arch}"))];
    if arch == own_arch() {
        candidates.push(binaries.join("drover-system-agent"));
    }
    for path in candidates {
        if let Some(response) = stream_file(&path).await {
            return Ok(response);
        }
    }
    Err(ApiError::not_found(format!(
        "this hub has no system-agent binary for {arch} in {} (put drover-system-agent-{arch} there, or start the hub with --agent-binaries)",
        binaries.display()
    )))
}

/// A file as a streamed download, if it can be opened.
async fn stream_file(path: &std::path::Path) -> Option<Response> {
    let file = tokio::fs::File::open(path).await.ok()?;
    let meta = file.metadata().await.ok()?;
    if !meta.is_file() {
        return None;
    }
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Some(
        (
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                (header::CONTENT_LENGTH, meta.len().to_string()),
            ],
            body,
        )
            .into_response(),
    )
}

/// `GET /v3/artifacts/{version}/{file}`: a distribution's air-gap artifact (binary, images,
/// install script), put by the operator under `<data dir>/artifacts/<version>/`. Not secret,
/// like the distributions' own release downloads.
pub async fn artifact(
    State(downloads): State<Downloads>,
    Path((version, file)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let plain = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+'))
    };
    if plain(&version) && plain(&file) {
        let path = downloads.artifacts.join(&version).join(&file);
        // Only regular files that are inside the artifacts directory, however they are
        // reached: a symbolic link there must not serve the rest of the machine.
        let inside = match (
            tokio::fs::canonicalize(&downloads.artifacts).await,
            tokio::fs::canonicalize(&path).await,
        ) {
            (Ok(root), Ok(real)) => real.starts_with(&root),
            _ => false,
        };
        let regular = tokio::fs::symlink_metadata(&path)
            .await
            .is_ok_and(|m| m.file_type().is_file());
        if inside
            && regular
            && let Some(response) = stream_file(&path).await
        {
            return Ok(response);
        }
    }
    // Not a word about where artifacts live: the caller needs no path on the hub's disk.
    Err(ApiError::not_found(format!(
        "no artifact {file:?} for version {version:?} on this hub; its operator puts them in the artifacts directory under the hub's data directory"
    )))
}

/// Checks a registration token's value; returns its cluster's name and spec.
pub async fn verify(api: &Api, value: &str) -> Result<(String, ClusterSpec), ApiError> {
    let bad = || {
        ApiError::unauthorized(
            "unknown, expired or revoked registration token; get a new command from the hub",
        )
    };
    let Some((TokenKind::Registration, name, token_secret)) = secret::parse_token(value) else {
        return Err(bad());
    };
    let registration = match api.store.get(Kind::RegistrationToken.name(), name).await {
        Ok(r) => r,
        Err(StoreError::NotFound { .. }) => return Err(bad()),
        Err(e) => return Err(e.into()),
    };
    if !secret::opens(&registration, token_secret)
        || !crate::refs::Liveness::new(api.store.as_ref())
            .live(&registration)
            .await?
    {
        return Err(bad());
    }
    let cluster = registration
        .spec
        .get("cluster")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let spec = api.store.get(Kind::Cluster.name(), &cluster).await?.spec;
    let spec: ClusterSpec =
        serde_json::from_value(spec).map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok((cluster, spec))
}

pub use crate::model::setting;

/// The manifest that installs the agents into `cluster` (of `spec`) with registration token
/// `token`: the import manifest, and what the planner puts in a provisioned cluster's
/// auto-deploy directory. `Invalid` when the spec's pull credential cannot be had.
pub async fn agents_manifest(
    store: &dyn Store,
    server_url: &str,
    ca_checksum: &str,
    cluster: &str,
    spec: &ClusterSpec,
    token: &str,
) -> Result<String, StoreError> {
    use crate::model::agentconfig;
    let version = env!("CARGO_PKG_VERSION");
    let images = spec.agent_images.clone().unwrap_or_default();
    let pick = |own: &str, setting: String| {
        let image = if own.is_empty() {
            setting
        } else {
            own.to_owned()
        };
        if images.registry.is_empty() || !own.is_empty() {
            image
        } else {
            agentconfig::with_registry(&image, &images.registry)
        }
    };
    let cluster_image = pick(
        &images.cluster_agent,
        crate::model::cluster_agent_image(store).await?,
    );
    let node_image = pick(
        &images.node_agent,
        setting(
            store,
            "node-agent-image",
            format!("drover/node-agent:{version}"),
        )
        .await?,
    );
    let pull_policy = if images.pull_policy.is_empty() {
        setting(store, "agent-image-pull-policy", "IfNotPresent".into()).await?
    } else {
        images.pull_policy.clone()
    };
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    // The variables' values stay in a Secret; the containers name them.
    let env_data = serde_json::Value::Object(
        spec.agent_env
            .iter()
            .map(|v| (v.name.clone(), serde_json::Value::String(v.value.clone())))
            .collect(),
    );
    let env_refs: Vec<String> = spec
        .agent_env
        .iter()
        .map(|v| {
            format!(
                "- name: {name}\n  valueFrom: {{secretKeyRef: {{name: drover-agent-env, key: {name}}}}}",
                name = v.name
            )
        })
        .collect();
    let mut pull_secret = None;
    if !images.pull_credential.is_empty() {
        let invalid =
            |why: String| StoreError::Invalid(format!("spec.agentImages.pullCredential: {why}"));
        // The manifest is its owners' to read (they make its registration tokens).
        crate::grants::cluster_may_use(store, cluster, &images.pull_credential)
            .await?
            .map_err(invalid)?;
        let login = crate::model::registries::login(store, &images.pull_credential)
            .await?
            .map_err(invalid)?;
        if login.username.is_empty() {
            return Err(invalid(format!(
                "CloudCredential {} has no user name and password, which a pull secret is made of",
                images.pull_credential
            )));
        }
        let (username, password) = (login.username, login.password);
        let mut registries = vec![
            agentconfig::registry_of(&cluster_image),
            agentconfig::registry_of(&node_image),
        ];
        registries.dedup();
        pull_secret = Some(agentconfig::docker_config(
            &registries,
            &username,
            &password,
        ));
    }
    let mut manifest = IMPORT_TEMPLATE
        .replace("{{HUB_URL}}", server_url)
        .replace("{{TOKEN}}", token)
        .replace("{{CA_CHECKSUM}}", ca_checksum)
        .replace("{{CLUSTER}}", cluster)
        .replace("{{CLUSTER_AGENT_IMAGE}}", &cluster_image)
        .replace("{{NODE_AGENT_IMAGE}}", &node_image)
        .replace("{{PULL_POLICY}}", &quote(&pull_policy))
        .replace("{{AGENT_ENV_DATA}}", &env_data.to_string())
        .replace(
            "{{PULL_SECRETS}}",
            if pull_secret.is_some() {
                "[{name: drover-registry}]"
            } else {
                "[]"
            },
        );
    manifest = manifest
        .lines()
        .flat_map(|line| match line.split_once("# {{AGENT_ENV}}") {
            Some((indent, _)) => env_refs
                .iter()
                .flat_map(|r| {
                    r.lines()
                        .map(|l| format!("{indent}{l}"))
                        .collect::<Vec<_>>()
                })
                .collect(),
            None => vec![line.to_owned()],
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    if let Some(config) = pull_secret {
        manifest.push_str(&format!(
            "---\n# The agents' image pull secret (spec.agentImages.pullCredential).\napiVersion: v1\nkind: Secret\nmetadata:\n  name: drover-registry\n  namespace: drover-system\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: {}\n",
            quote(&config)
        ));
    }
    Ok(manifest)
}

/// `GET /v3/import/<token>.yaml`: the manifest that installs the agents into an imported
/// cluster. The token in the URL is the credential; 404 for anything but a valid one.
pub async fn import_manifest(
    State(api): State<Api>,
    Path(file): Path<String>,
) -> Result<Response, ApiError> {
    let not_found =
        || ApiError::not_found("no import manifest here; get a new import command from the hub");
    let value = file.strip_suffix(".yaml").ok_or_else(not_found)?;
    let (cluster, spec) = verify(&api, value).await.map_err(|_| not_found())?;
    if spec.cluster_type == ClusterType::Custom {
        return Err(ApiError::not_found(format!(
            "cluster {cluster:?} is a custom cluster; its hosts register with the host command, not a manifest"
        )));
    }
    let manifest = agents_manifest(
        api.store.as_ref(),
        &api.server_url,
        &api.ca_checksum,
        &cluster,
        &spec,
        value,
    )
    .await
    .map_err(|e| match e {
        StoreError::Invalid(why) => ApiError::invalid(format!(
            "the import manifest of cluster {cluster:?} cannot be made: {why}"
        )),
        e => e.into(),
    })?;
    Ok(([(header::CONTENT_TYPE, "application/yaml")], manifest).into_response())
}

/// The RegistrationToken object for a new token of `cluster`.
pub fn token_object(cluster: &str, token: &NewToken) -> Object {
    Object::new(
        Kind::RegistrationToken.name(),
        &token.name,
        json!({"cluster": cluster, "secretHash": token.hash}),
    )
}

/// Makes sure cluster `name` exists (created with `spec` if not; an existing one is left as it
/// is) and returns a new registration token for it. For `serve --demo`, which registers its
/// simulated agents without going through the API.
pub async fn ensure_cluster(
    store: &dyn Store,
    name: &str,
    spec: &Value,
) -> Result<String, StoreError> {
    let token = crate::auth::secret::new_token(crate::auth::secret::TokenKind::Registration);
    let mut ops = vec![Op::Create(token_object(name, &token))];
    match store.get(Kind::Cluster.name(), name).await {
        Ok(_) => {}
        Err(StoreError::NotFound { .. }) => {
            let spec = Kind::Cluster
                .validate_spec(spec)
                .map_err(StoreError::Invalid)?;
            let mut cluster = Object::new(Kind::Cluster.name(), name, spec);
            cluster.metadata.finalizers = vec![crate::model::CLEANUP_FINALIZER.to_owned()];
            ops.insert(0, Op::Create(cluster));
        }
        Err(e) => return Err(e),
    }
    crate::refs::stamp_all(store, &mut ops).await?;
    store.transact(ops).await?;
    Ok(token.value)
}

/// The commands that register agents with `token`: for an imported cluster the manifest to
/// apply, for a custom cluster the host install script (flags pick the host's roles).
pub fn commands(api: &Api, cluster_type: ClusterType, token: &str) -> Value {
    let url = &api.server_url;
    match cluster_type {
        // A hosted cluster's agents are installed by the hub once the cloud's control plane is
        // up; its manifest works by hand as an imported cluster's does.
        ClusterType::Imported | ClusterType::Hosted => json!({
            "token": token,
            "manifestUrl": format!("{url}/v3/import/{token}.yaml"),
            // `kubectl apply -f URL` cannot pin a CA, and the hub's own CA is in no trust
            // store: the CA is fetched, checked against the checksum, then trusted for the
            // manifest.
            "importCommand": format!(
                "curl -fsSk {url}/cacerts -o drover-ca.pem && echo '{}  drover-ca.pem' | sha256sum -c --quiet && curl -fsS --cacert drover-ca.pem {url}/v3/import/{token}.yaml | kubectl apply -f -",
                api.ca_checksum
            ),
            // For a hub serving a certificate the cluster's kubectl trusts (`--tls-cert`).
            "importCommandTrusted": format!("kubectl apply -f {url}/v3/import/{token}.yaml"),
            // Rancher's documented fallback: no certificate check at all (the agents still
            // verify the CA checksum the manifest carries).
            "importCommandInsecure": format!("curl --insecure -sfL {url}/v3/import/{token}.yaml | kubectl apply -f -"),
        }),
        ClusterType::Custom => json!({
            "token": token,
            "hostCommand": format!(
                "curl --insecure -fsSL {url}/system-agent-install.sh | sudo sh -s - --server {url} --token {token} --ca-checksum {}",
                api.ca_checksum
            ),
            "roleFlags": ["--etcd", "--controlplane", "--worker", "--all-roles"],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn artifacts_are_regular_files_inside_the_artifacts_directory_and_404s_name_no_path() {
        let dir = std::env::temp_dir().join(format!("drover-artifacts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let artifacts = dir.join("artifacts");
        std::fs::create_dir_all(artifacts.join("v1")).unwrap();
        std::fs::write(artifacts.join("v1/k3s"), b"binary").unwrap();
        std::fs::write(dir.join("secret"), b"not for you").unwrap();
        std::os::unix::fs::symlink(dir.join("secret"), artifacts.join("v1/leak")).unwrap();
        std::os::unix::fs::symlink(&dir, artifacts.join("v2")).unwrap();
        let downloads = Downloads {
            binaries: dir.clone(),
            artifacts: artifacts.clone(),
        };
        let get = |version: &str, file: &str| {
            artifact(
                State(downloads.clone()),
                Path((version.to_owned(), file.to_owned())),
            )
        };
        assert!(get("v1", "k3s").await.is_ok());
        for (version, file) in [("v1", "leak"), ("v2", "secret"), ("v1", "nothing")] {
            let err = get(version, file).await.unwrap_err();
            assert_eq!(err.code, http::StatusCode::NOT_FOUND, "{version}/{file}");
            let shown = dir.display().to_string();
            assert!(!err.message.contains(&shown), "{}", err.message);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
