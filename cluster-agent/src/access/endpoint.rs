//! The authorized cluster endpoint's side in the cluster: while the hub says it is on, the
//! token authenticator (`drover-kube-api-auth`, a DaemonSet on the control-plane nodes, host
//! network, listening on each node's loopback where its API server asks it) and one Secret per
//! hub token that may open the endpoint, holding the token's hash (never the token), who it
//! acts as and when it expires. All of it in the agent's own namespace, which no hub role
//! binds (`cluster-member` gets `edit` everywhere but there), so users cannot add tokens.
//! When the hub says it is off, both go.

use std::collections::BTreeMap;

use k8s_openapi::{
    ByteString,
    api::{
        apps::v1::{DaemonSet, DaemonSetSpec},
        core::v1::{
            Container, EnvVar, EnvVarSource, ObjectFieldSelector, PodSpec, PodTemplateSpec,
            ResourceRequirements, Secret, ServiceAccount, Toleration,
        },
        rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::LabelSelector},
};
use kube::{Api, Client};
use proto::cluster::v1::AuthorizedEndpoint;

use super::{Owned, RBAC_GROUP, labels, meta};

/// The sync label of the token copies.
pub const TOKENS: &str = "cluster-auth-token";
/// The sync label of the authenticator's objects.
pub(super) const AUTHENTICATOR: &str = "kube-api-auth";
/// The authenticator's name: its DaemonSet, service account, role and binding.
pub const NAME: &str = "drover-kube-api-auth";
/// The Secret type of a token copy.
pub const TOKEN_TYPE: &str = "drover.io/cluster-auth-token";
/// A token copy's name: this prefix and the hub Token's name.
pub const TOKEN_PREFIX: &str = "drover-token-";
/// Where the authenticator listens on each control-plane node (the planner points the API
/// servers' token webhook there).
pub const LISTEN: &str = "127.0.0.1:6440";
/// The annotation that holds what the agent last wrote into a DaemonSet's spec: the API
/// server fills in defaults, so comparing the specs themselves would rewrite it every pass.
const WRITTEN: &str = "drover.io/written";

/// What the cluster should hold for the endpoint.
#[derive(Debug, Default)]
pub(super) struct Desired {
    pub tokens: Vec<Secret>,
    pub accounts: Vec<ServiceAccount>,
    pub roles: Vec<Role>,
    pub bindings: Vec<RoleBinding>,
    pub daemon_sets: Vec<DaemonSet>,
}

pub(super) fn desired(endpoint: Option<&AuthorizedEndpoint>, namespace: &str) -> Desired {
    let Some(endpoint) = endpoint else {
        return Desired::default();
    };
    let ns = Some(namespace);
    let tokens = endpoint
        .tokens
        .iter()
        .map(|t| {
            let groups = serde_json::to_string(&t.groups).unwrap_or_else(|_| "[]".into());
            let data = [
                ("hash", t.hash.as_str()),
                ("user", t.user.as_str()),
                ("groups", groups.as_str()),
                ("expiresAt", t.expires_at.as_str()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
            .collect();
            Secret {
                metadata: meta(
                    &format!("{TOKEN_PREFIX}{}", t.name),
                    ns,
                    labels(TOKENS, None),
                ),
                type_: Some(TOKEN_TYPE.to_owned()),
                data: Some(data),
                ..Secret::default()
            }
        })
        .collect();
    let own = || meta(NAME, ns, labels(AUTHENTICATOR, None));
    let app = BTreeMap::from([("app.kubernetes.io/name".to_owned(), NAME.to_owned())]);
    let spec = DaemonSetSpec {
        selector: LabelSelector {
            match_labels: Some(app.clone()),
            ..LabelSelector::default()
        },
        template: PodTemplateSpec {
            metadata: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                labels: Some(app),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                service_account_name: Some(NAME.to_owned()),
                // The API server reaches it on the node's own loopback.
                host_network: Some(true),
                dns_policy: Some("ClusterFirstWithHostNet".to_owned()),
                node_selector: Some(BTreeMap::from([(
                    "node-role.kubernetes.io/control-plane".to_owned(),
                    "true".to_owned(),
                )])),
                tolerations: Some(vec![Toleration {
                    operator: Some("Exists".to_owned()),
                    ..Toleration::default()
                }]),
                containers: vec![Container {
                    name: "kube-api-auth".to_owned(),
                    image: Some(endpoint.image.clone()),
                    command: Some(vec![NAME.to_owned()]),
                    env: Some(vec![
                        EnvVar {
                            name: "DROVER_NAMESPACE".to_owned(),
                            value_from: Some(EnvVarSource {
                                field_ref: Some(ObjectFieldSelector {
                                    field_path: "metadata.namespace".to_owned(),
                                    ..ObjectFieldSelector::default()
                                }),
                                ..EnvVarSource::default()
                            }),
                            ..EnvVar::default()
                        },
                        EnvVar {
                            name: "DROVER_LISTEN".to_owned(),
                            value: Some(LISTEN.to_owned()),
                            ..EnvVar::default()
                        },
                    ]),
                    resources: Some(ResourceRequirements {
                        requests: Some(BTreeMap::from([
                            ("cpu".to_owned(), Quantity("10m".to_owned())),
                            ("memory".to_owned(), Quantity("16Mi".to_owned())),
                        ])),
                        limits: Some(BTreeMap::from([(
                            "memory".to_owned(),
                            Quantity("64Mi".to_owned()),
                        )])),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
        },
        ..DaemonSetSpec::default()
    };
    let mut daemon_set = DaemonSet {
        metadata: own(),
        spec: Some(spec),
        ..DaemonSet::default()
    };
    let written = serde_json::to_string(&daemon_set.spec).unwrap_or_default();
    daemon_set.metadata.annotations = Some(BTreeMap::from([(WRITTEN.to_owned(), written)]));
    Desired {
        tokens,
        accounts: vec![ServiceAccount {
            metadata: own(),
            ..ServiceAccount::default()
        }],
        // It reads the token copies, nothing else.
        roles: vec![Role {
            metadata: own(),
            rules: Some(vec![PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["secrets".to_owned()]),
                verbs: vec!["get".into(), "list".into(), "watch".into()],
                ..PolicyRule::default()
            }]),
        }],
        bindings: vec![RoleBinding {
            metadata: own(),
            role_ref: RoleRef {
                api_group: RBAC_GROUP.to_owned(),
                kind: "Role".to_owned(),
                name: NAME.to_owned(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".to_owned(),
                name: NAME.to_owned(),
                namespace: Some(namespace.to_owned()),
                ..Subject::default()
            }]),
        }],
        daemon_sets: vec![daemon_set],
    }
}

fn in_namespace<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

impl Owned for ServiceAccount {
    fn same(&self, _: &Self) -> bool {
        true
    }
    fn api(client: &Client, namespace: Option<&str>) -> Api<Self> {
        in_namespace(client, namespace)
    }
}

impl Owned for Role {
    fn same(&self, other: &Self) -> bool {
        self.rules == other.rules
    }
    fn api(client: &Client, namespace: Option<&str>) -> Api<Self> {
        in_namespace(client, namespace)
    }
}

impl Owned for DaemonSet {
    fn same(&self, other: &Self) -> bool {
        let written = |d: &DaemonSet| {
            d.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(WRITTEN).cloned())
        };
        written(self).is_some() && written(self) == written(other)
    }
    fn api(client: &Client, namespace: Option<&str>) -> Api<Self> {
        in_namespace(client, namespace)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use kube::ResourceExt;
    use proto::cluster::v1::ClusterToken;

    use super::*;
    use crate::api_auth::TokenCopy;

    #[test]
    fn on_the_authenticator_runs_on_control_plane_nodes_and_reads_what_the_hub_sent() {
        let endpoint = AuthorizedEndpoint {
            image: "registry.example/drover/cluster-agent:1.2.3".into(),
            tokens: vec![ClusterToken {
                name: "tabc".into(),
                hash: "a".repeat(64),
                user: "ann".into(),
                groups: vec!["drover:authenticated".into(), "ldap:ops".into()],
                expires_at: "2030-01-01T00:00:00Z".into(),
            }],
        };
        let want = desired(Some(&endpoint), "drover-system");
        assert_eq!(want.tokens.len(), 1);
        let copy = &want.tokens[0];
        assert_eq!(copy.name_any(), "drover-token-tabc");
        assert_eq!(copy.namespace().as_deref(), Some("drover-system"));
        // What the agent writes is what the authenticator reads.
        assert_eq!(
            TokenCopy::of(copy).unwrap(),
            TokenCopy {
                hash: "a".repeat(64),
                user: "ann".into(),
                groups: vec!["drover:authenticated".into(), "ldap:ops".into()],
                expires_at: Some(time::macros::datetime!(2030-01-01 00:00:00 UTC)),
            }
        );
        let daemon_set = &want.daemon_sets[0];
        let pod = daemon_set
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap();
        assert_eq!(pod.host_network, Some(true));
        assert_eq!(
            pod.node_selector.as_ref().unwrap()["node-role.kubernetes.io/control-plane"],
            "true"
        );
        assert_eq!(
            pod.containers[0].image.as_deref(),
            Some("registry.example/drover/cluster-agent:1.2.3")
        );
        assert_eq!(pod.containers[0].command.as_ref().unwrap(), &[NAME]);
        assert_eq!(
            want.roles[0].rules.as_ref().unwrap()[0]
                .resources
                .as_ref()
                .unwrap(),
            &["secrets"]
        );
        // A DaemonSet as the API server returns it (defaults filled in) is still as wanted.
        let mut served = daemon_set.clone();
        served.spec.as_mut().unwrap().revision_history_limit = Some(10);
        assert!(daemon_set.same(&served));
        let other = desired(
            Some(&AuthorizedEndpoint {
                image: "drover/cluster-agent:2".into(),
                ..endpoint.clone()
            }),
            "drover-system",
        );
        assert!(
            !other.daemon_sets[0].same(daemon_set),
            "a new image is written"
        );
    }

    #[test]
    fn off_nothing_is_wanted() {
        let want = desired(None, "drover-system");
        assert!(want.tokens.is_empty() && want.daemon_sets.is_empty());
        assert!(want.accounts.is_empty() && want.roles.is_empty() && want.bindings.is_empty());
    }
}
