//! Installing the agents into a hosted cluster, once, with no hand step: when the cloud says
//! the control plane is active, the hub reaches its API server itself — this once, at the
//! endpoint and CA the cloud reports, with a bearer token made from the cloud credential as
//! EKS authenticates (`drivers::eks::token`: a presigned STS call, so the key itself is never
//! sent) — and applies the cluster's import manifest there with server-side apply. From then
//! on the hub talks to the cluster only through its cluster-agent's tunnel; the credential is
//! not kept in the cluster.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

/// The field manager the hub's apply is recorded under.
const FIELD_MANAGER: &str = "drover-hub";

/// Where an object of the import manifest lives in the API: its collection's path for
/// `apiVersion`/`kind`, and whether it is namespaced. Only the kinds the manifest holds.
fn collection(api_version: &str, kind: &str) -> Option<(String, &'static str, bool)> {
    let (plural, namespaced) = match kind {
        "Namespace" => ("namespaces", false),
        "ServiceAccount" => ("serviceaccounts", true),
        "Secret" => ("secrets", true),
        "ConfigMap" => ("configmaps", true),
        "Service" => ("services", true),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        "Deployment" => ("deployments", true),
        "DaemonSet" => ("daemonsets", true),
        _ => return None,
    };
    let base = if api_version == "v1" {
        "/api/v1".to_owned()
    } else {
        format!("/apis/{api_version}")
    };
    Some((base, plural, namespaced))
}

/// The server-side apply path of `object`.
pub(super) fn apply_path(object: &Value) -> Result<String, String> {
    let text = |key: &str| object[key].as_str().unwrap_or_default();
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let (base, plural, namespaced) = collection(api_version, kind).ok_or_else(|| {
        format!("the import manifest holds a {api_version} {kind}, which the hub cannot apply")
    })?;
    let at = if namespaced {
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default");
        format!("{base}/namespaces/{namespace}/{plural}/{name}")
    } else {
        format!("{base}/{plural}/{name}")
    };
    Ok(format!("{at}?fieldManager={FIELD_MANAGER}&force=true"))
}

/// Applies every object of `manifest` (YAML documents) at the API server `endpoint`
/// (`https://HOST[:PORT]`), trusting `ca_pem`, as `token`'s holder. Returns how many.
pub(super) async fn apply(
    endpoint: &str,
    ca_pem: &str,
    token: &str,
    manifest: &str,
) -> Result<usize, String> {
    let objects: Vec<Value> =
        serde_saphyr::from_multiple(manifest).map_err(|e| format!("the import manifest: {e}"))?;
    let objects: Vec<Value> = objects.into_iter().filter(|o| !o.is_null()).collect();
    let authority = endpoint
        .strip_prefix("https://")
        .map(|rest| rest.trim_end_matches('/'))
        .filter(|a| !a.is_empty() && !a.contains('/'))
        .ok_or_else(|| format!("the cluster's endpoint {endpoint:?} is not https://HOST[:PORT]"))?;
    // `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT`.
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !authority.ends_with(']') && !port.contains(']') => (
            host.trim_matches(['[', ']']),
            port.parse::<u16>()
                .map_err(|_| format!("the cluster's endpoint {endpoint:?}: a bad port"))?,
        ),
        _ => (authority.trim_matches(['[', ']']), 443),
    };
    let roots = tunnel::tls::roots_from_pem(ca_pem.as_bytes())
        .map_err(|e| format!("the cluster's CA: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(tunnel::tls::client_config(roots));
    let name = rustls_pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| format!("{host}: {e}"))?;
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("cannot reach the cluster's API server at {authority}: {e}"))?;
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS with the cluster's API server at {authority}: {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| format!("the cluster's API server at {authority}: {e}"))?;
    let driver = tokio::spawn(connection);
    let result = async {
        for object in &objects {
            let path = apply_path(object)?;
            let request = http::Request::patch(&path)
                .header(http::header::HOST, authority)
                .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
                .header(http::header::CONTENT_TYPE, "application/apply-patch+yaml")
                .header(http::header::ACCEPT, "application/json")
                .body(Full::new(Bytes::from(object.to_string())))
                .map_err(|e| e.to_string())?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| format!("applying {path}: {e}"))?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("applying {path}: {e}"))?
                .to_bytes();
            if !status.is_success() {
                let answer: Value = serde_json::from_slice(&body).unwrap_or_default();
                let message = answer["message"].as_str().map_or_else(
                    || String::from_utf8_lossy(&body).into_owned(),
                    str::to_owned,
                );
                return Err(format!(
                    "the cluster's API server refused {} {}: {status}: {message}",
                    object["kind"].as_str().unwrap_or_default(),
                    object["metadata"]["name"].as_str().unwrap_or_default()
                ));
            }
        }
        Ok(objects.len())
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_kind_of_the_manifest_is_applied_at_its_own_path() {
        let path = |o: Value| apply_path(&o).unwrap();
        assert_eq!(
            path(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "drover-system"}})
            ),
            "/api/v1/namespaces/drover-system?fieldManager=drover-hub&force=true"
        );
        assert_eq!(
            path(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": "drover-cluster-agent", "namespace": "drover-system"}})),
            "/apis/apps/v1/namespaces/drover-system/deployments/drover-cluster-agent?fieldManager=drover-hub&force=true"
        );
        assert_eq!(
            path(
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                        "metadata": {"name": "drover-admin"}})
            ),
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/drover-admin?fieldManager=drover-hub&force=true"
        );
        let unknown = apply_path(&json!({"apiVersion": "batch/v1", "kind": "Job",
                                         "metadata": {"name": "x"}}));
        assert!(unknown.unwrap_err().contains("cannot apply"));
    }
}
