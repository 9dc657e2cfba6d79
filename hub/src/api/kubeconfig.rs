//! `POST /v1/kubeconfig`: a kubeconfig for the hub itself; `POST
//! /v1/clusters/{name}/kubeconfig`: a kubeconfig for the caller that points `kubectl` at
//! the hub's authentication proxy for that cluster (`/k8s/clusters/{name}`), with a new API
//! token of the caller's own for that cluster, so it can be revoked on its own. With the
//! cluster's authorized endpoint on, it also has a context per control-plane host (and one
//! for the endpoint's FQDN) that reaches the cluster's API servers directly with the same
//! token; the hub's context stays the current one.

use axum::{
    extract::{Path, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use base64::Engine as _;
use serde_json::{Value, json};

use super::{Api, ApiError};
use crate::{
    auth::{lifetimes, secret},
    model::{ClusterSpec, HostSpec, Kind, Status},
    store::{LabelSelector, Object, Op},
};

/// One context of the kubeconfig: its name, the server and the CA (PEM) that verifies it.
#[derive(Debug, Clone, PartialEq)]
struct Context {
    name: String,
    server: String,
    ca_pem: String,
}

pub(super) async fn create(
    State(api): State<Api>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = api.principal(&headers).await?;
    let cluster = super::readable(&api, &principal, Kind::Cluster, &name).await?;
    let token = new_token(&api, &principal, Some(&name)).await?;
    let mut contexts = vec![Context {
        name: name.clone(),
        server: format!("{}/k8s/clusters/{name}", api.server_url),
        ca_pem: api.ca_pem.to_string(),
    }];
    let (hosts, _) = api
        .store
        .list(Kind::Host.name(), &LabelSelector::everything())
        .await?;
    contexts.extend(direct_contexts(&cluster, &hosts));
    let user = format!("{}@{name}", principal.user);
    Ok((
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/yaml")],
        render(&contexts, &user, &token),
    )
        .into_response())
}

/// `POST /v1/kubeconfig`: a kubeconfig for the hub itself (its URL, its CA, a new token of the
/// caller's), with which kubectl manages the hub's own objects as `management.drover.io/v1`;
/// what the caller may do there is what their roles allow through `/v1`.
pub(super) async fn hub(State(api): State<Api>, headers: HeaderMap) -> Result<Response, ApiError> {
    let principal = api.principal(&headers).await?;
    let token = new_token(&api, &principal, None).await?;
    let context = Context {
        name: "drover-hub".into(),
        server: api.server_url.clone(),
        ca_pem: api.ca_pem.to_string(),
    };
    let user = format!("{}@drover-hub", principal.user);
    Ok((
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/yaml")],
        render(&[context], &user, &token),
    )
        .into_response())
}

/// A new API token of the caller's for a kubeconfig (for `cluster`'s proxy only, or the hub),
/// with the kubeconfig lifetime, stored hashed; its value, which only the kubeconfig holds.
async fn new_token(
    api: &Api,
    principal: &crate::auth::Principal,
    cluster: Option<&str>,
) -> Result<String, ApiError> {
    let token = secret::new_token(secret::TokenKind::Token);
    let lifetimes = lifetimes::read(api.store.as_ref()).await?;
    let description = match cluster {
        Some(cluster) => format!("kubeconfig for cluster {cluster}"),
        None => "kubeconfig for the hub".to_owned(),
    };
    let mut spec = json!({
        "user": principal.user,
        "description": description,
        "expiresAt": lifetimes::expiry(lifetimes.kubeconfig),
        "secretHash": token.hash,
    });
    if let Some(cluster) = cluster {
        spec["cluster"] = json!(cluster);
    }
    let mut object = Object::new(Kind::Token.name(), &token.name, spec);
    object
        .metadata
        .labels
        .insert(lifetimes::USER_LABEL.to_owned(), principal.user.clone());
    let mut ops = vec![Op::Create(object)];
    crate::refs::stamp_all(api.store.as_ref(), &mut ops).await?;
    api.store.transact(ops).await?;
    Ok(token.value)
}

/// The authorized endpoint's contexts of `cluster`: one per control-plane host (by node name)
/// at its address with the cluster's own CA (as its cluster-agent reported it), and one for
/// the FQDN with `caCerts` (else that CA). None while the endpoint is off, or while no CA is
/// known to verify the API servers with.
fn direct_contexts(cluster: &Object, hosts: &[Object]) -> Vec<Context> {
    let Ok(spec) = serde_json::from_value::<ClusterSpec>(cluster.spec.clone()) else {
        return Vec::new();
    };
    let Some(endpoint) = spec
        .authorized_endpoint
        .as_ref()
        .filter(|_| spec.endpoint_enabled())
    else {
        return Vec::new();
    };
    let name = &cluster.metadata.name;
    let own_ca = Status::of(cluster)
        .extra
        .get("apiServerCA")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let mut servers: Vec<(String, String)> = hosts
        .iter()
        .filter(|h| h.metadata.deletion_timestamp.is_none())
        .filter_map(|h| serde_json::from_value::<HostSpec>(h.spec.clone()).ok())
        .filter(|h| &h.cluster == name && h.roles.control_plane)
        .filter_map(|h| {
            let address = [&h.address, &h.internal_address]
                .into_iter()
                .find(|a| !a.is_empty())?
                .clone();
            Some((h.node_name, address))
        })
        .collect();
    servers.sort();
    let mut contexts = Vec::new();
    if !own_ca.is_empty() {
        for (node, address) in servers {
            let host = if address.contains(':') {
                format!("[{address}]")
            } else {
                address
            };
            contexts.push(Context {
                name: format!("{name}-{node}"),
                server: format!("https://{host}:6443"),
                ca_pem: own_ca.clone(),
            });
        }
    }
    let fqdn_ca = if endpoint.ca_certs.trim().is_empty() {
        own_ca
    } else {
        endpoint.ca_certs.clone()
    };
    if !endpoint.fqdn.is_empty() && !fqdn_ca.is_empty() {
        let server = if endpoint.fqdn.contains(':') {
            endpoint.fqdn.clone()
        } else {
            format!("{}:6443", endpoint.fqdn)
        };
        contexts.push(Context {
            name: format!("{name}-fqdn"),
            server: format!("https://{server}"),
            ca_pem: fqdn_ca,
        });
    }
    contexts
}

/// The kubeconfig: a cluster and a context per entry of `contexts`, all with the one user
/// (`token`); the first context is the current one.
fn render(contexts: &[Context], user: &str, token: &str) -> String {
    // JSON strings are YAML strings: every value quoted the one way.
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem.as_bytes());
    let mut out = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
    for c in contexts {
        out.push_str(&format!(
            "  - name: {}\n    cluster:\n      server: {}\n      certificate-authority-data: {}\n",
            q(&c.name),
            q(&c.server),
            b64(&c.ca_pem)
        ));
    }
    out.push_str(&format!(
        "users:\n  - name: {}\n    user:\n      token: {}\ncontexts:\n",
        q(user),
        q(token)
    ));
    for c in contexts {
        out.push_str(&format!(
            "  - name: {0}\n    context:\n      cluster: {0}\n      user: {1}\n",
            q(&c.name),
            q(user)
        ));
    }
    if let Some(first) = contexts.first() {
        out.push_str(&format!("current-context: {}\n", q(&first.name)));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn host(cluster: &str, node: &str, address: &str, control_plane: bool) -> Object {
        Object::new(
            "Host",
            node,
            json!({"cluster": cluster, "nodeName": node, "address": address,
                   "roles": {"etcd": control_plane, "controlPlane": control_plane, "worker": true}}),
        )
    }

    fn cluster(endpoint: Value, ca: Option<&str>) -> Object {
        let mut c = Object::new(
            "Cluster",
            "edge",
            json!({"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1",
                   "authorizedEndpoint": endpoint}),
        );
        if let Some(ca) = ca {
            c.status = json!({"apiServerCA": ca});
        }
        c
    }

    #[test]
    fn each_control_plane_host_of_the_cluster_gets_a_context_with_the_clusters_ca() {
        let hosts = [
            host("edge", "node-2", "10.0.0.2", true),
            host("edge", "node-1", "10.0.0.1", true),
            host("edge", "node-3", "10.0.0.3", false),
            host("other", "node-9", "10.0.0.9", true),
        ];
        let on = cluster(
            json!({"enabled": true, "fqdn": "api.edge.example.com"}),
            Some("CA"),
        );
        let direct = direct_contexts(&on, &hosts);
        let seen: Vec<(&str, &str, &str)> = direct
            .iter()
            .map(|c| (c.name.as_str(), c.server.as_str(), c.ca_pem.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                ("edge-node-1", "https://10.0.0.1:6443", "CA"),
                ("edge-node-2", "https://10.0.0.2:6443", "CA"),
                ("edge-fqdn", "https://api.edge.example.com:6443", "CA"),
            ]
        );
        let own_ca = cluster(
            json!({"enabled": true, "fqdn": "lb.example.com:443", "caCerts": "LB CA"}),
            Some("CA"),
        );
        let fqdn = direct_contexts(&own_ca, &hosts).pop().unwrap();
        assert_eq!(
            (fqdn.server.as_str(), fqdn.ca_pem.as_str()),
            ("https://lb.example.com:443", "LB CA")
        );
        // Off, or with no CA known yet: the hub's context only.
        assert!(
            direct_contexts(&cluster(json!({"enabled": false}), Some("CA")), &hosts).is_empty()
        );
        assert!(direct_contexts(&cluster(json!({"enabled": true}), None), &hosts).is_empty());
    }

    #[test]
    fn the_hub_context_is_current_and_every_context_uses_the_one_token() {
        let contexts = [
            Context {
                name: "edge".into(),
                server: "https://hub:8443/k8s/clusters/edge".into(),
                ca_pem: "HUB".into(),
            },
            Context {
                name: "edge-node-1".into(),
                server: "https://10.0.0.1:6443".into(),
                ca_pem: "CA".into(),
            },
        ];
        let text = render(&contexts, "ann@edge", "drt_tabc.secret");
        let config: Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(config["current-context"], "edge");
        assert_eq!(config["contexts"][1]["context"]["cluster"], "edge-node-1");
        assert_eq!(config["contexts"][1]["context"]["user"], "ann@edge");
        assert_eq!(config["users"][0]["user"]["token"], "drt_tabc.secret");
        assert_eq!(config["users"].as_array().unwrap().len(), 1);
        assert_eq!(
            config["clusters"][1]["cluster"]["certificate-authority-data"],
            base64::engine::general_purpose::STANDARD.encode("CA")
        );
    }
}
