//! Registering clusters and hosts: the commands an operator runs, and the registration token
//! they carry. The token's value appears only in those commands; the hub keeps its hash.

use serde_json::{Value, json};

use crate::{
    api::Api,
    auth::secret::NewToken,
    model::{ClusterType, Kind},
    store::Object,
};

/// The RegistrationToken object for a new token of `cluster`.
pub fn token_object(cluster: &str, token: &NewToken) -> Object {
    Object::new(
        Kind::RegistrationToken.name(),
        &token.name,
        json!({"cluster": cluster, "secretHash": token.hash}),
    )
}

/// The commands that register agents with `token`: for an imported cluster the manifest to
/// apply, for a custom cluster the host install script (flags pick the host's roles).
pub fn commands(api: &Api, cluster_type: ClusterType, token: &str) -> Value {
    let url = &api.server_url;
    match cluster_type {
        ClusterType::Imported => json!({
            "token": token,
            "manifestUrl": format!("{url}/v3/import/{token}.yaml"),
            "importCommand": format!("kubectl apply -f {url}/v3/import/{token}.yaml"),
            // The hub's own CA is not in kubectl's trust store; the manifest carries the CA
            // checksum the agents then verify.
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
