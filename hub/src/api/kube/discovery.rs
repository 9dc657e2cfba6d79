//! `/version` and discovery: `/api` (no core kinds here), `/apis`, a group, and a group
//! version's resources, each unaggregated (what every client reads) or, when the client asks
//! for `apidiscovery.k8s.io/v2` as kubectl does, aggregated in one answer.

use axum::{
    Json,
    extract::{Path, State},
    http::{HeaderMap, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use super::{CATEGORY, GROUP, VERSION, singular, verbs_of};
use crate::{
    api::{Api, ApiError},
    model::Kind,
};

/// The groups served, each with its resources: (plural, singular, kind, verbs, short names,
/// categories).
type Resource = (
    String,
    String,
    String,
    Vec<&'static str>,
    Vec<&'static str>,
    Vec<&'static str>,
);

/// The other groups a client needs to reach here: the kinds' definitions and access reviews.
const CRDS: &str = "apiextensions.k8s.io";
const REVIEWS: &str = "authorization.k8s.io";

fn resources_of(group: &str) -> Option<Vec<Resource>> {
    match group {
        GROUP => Some(
            Kind::ALL
                .into_iter()
                .map(|k| {
                    (
                        k.plural().to_owned(),
                        singular(k),
                        k.name().to_owned(),
                        verbs_of(k),
                        Vec::new(),
                        vec![CATEGORY],
                    )
                })
                .collect(),
        ),
        CRDS => Some(vec![(
            "customresourcedefinitions".into(),
            "customresourcedefinition".into(),
            "CustomResourceDefinition".into(),
            vec!["get", "list"],
            vec!["crd", "crds"],
            Vec::new(),
        )]),
        REVIEWS => Some(vec![(
            "selfsubjectaccessreviews".into(),
            "selfsubjectaccessreview".into(),
            "SelfSubjectAccessReview".into(),
            vec!["create"],
            Vec::new(),
            Vec::new(),
        )]),
        _ => None,
    }
}

const GROUPS: [&str; 3] = [GROUP, CRDS, REVIEWS];

/// What kubectl sends to ask for aggregated discovery, and what it then reads back.
const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            let params: Vec<&str> = t.split(';').map(str::trim).collect();
            params.contains(&"g=apidiscovery.k8s.io") && params.contains(&"v=v2")
        })
}

fn aggregated(items: Vec<Value>) -> Response {
    (
        [(header::CONTENT_TYPE, AGGREGATED)],
        Json(json!({
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": items,
        })),
    )
        .into_response()
}

fn group_version(group: &str) -> Value {
    json!({"groupVersion": format!("{group}/{VERSION}"), "version": VERSION})
}

fn group_entry(group: &str) -> Value {
    json!({
        "name": group,
        "versions": [group_version(group)],
        "preferredVersion": group_version(group),
    })
}

fn aggregated_group(group: &str, resources: &[Resource]) -> Value {
    let resources: Vec<Value> = resources
        .iter()
        .map(|(plural, singular, kind, verbs, short, categories)| {
            json!({
                "resource": plural,
                "responseKind": {"group": group, "version": VERSION, "kind": kind},
                "scope": "Cluster",
                "singularResource": singular,
                "verbs": verbs,
                "shortNames": short,
                "categories": categories,
            })
        })
        .collect();
    json!({
        "metadata": {"name": group},
        "versions": [{"version": VERSION, "resources": resources, "freshness": "Current"}],
    })
}

/// Discovery is for those who may use the API: the caller must be known.
async fn known(api: &Api, headers: &HeaderMap) -> Result<(), ApiError> {
    api.principal(headers).await.map(drop)
}

/// `GET /version`: the hub's own version, where kube-apiserver says its Kubernetes version.
pub(super) async fn version(
    State(api): State<Api>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    known(&api, &headers).await?;
    let version = env!("CARGO_PKG_VERSION");
    let (major, minor) = version
        .split_once('.')
        .map(|(major, rest)| (major, rest.split('.').next().unwrap_or("0")))
        .unwrap_or(("0", "0"));
    Ok(Json(json!({
        "major": major,
        "minor": minor,
        "gitVersion": format!("v{version}+drover-hub"),
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })))
}

/// `GET /api`: the hub serves no core (`v1`) kinds.
pub(super) async fn core(State(api): State<Api>, headers: HeaderMap) -> Result<Response, ApiError> {
    known(&api, &headers).await?;
    if wants_aggregated(&headers) {
        return Ok(aggregated(Vec::new()));
    }
    Ok(
        Json(json!({"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": []}))
            .into_response(),
    )
}

/// `GET /apis`: the groups, or everything at once when aggregated discovery is asked for.
pub(super) async fn groups(
    State(api): State<Api>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    known(&api, &headers).await?;
    if wants_aggregated(&headers) {
        let items = GROUPS
            .iter()
            .filter_map(|g| resources_of(g).map(|r| aggregated_group(g, &r)))
            .collect();
        return Ok(aggregated(items));
    }
    let groups: Vec<Value> = GROUPS.iter().map(|g| group_entry(g)).collect();
    Ok(Json(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})).into_response())
}

fn no_group(group: &str) -> ApiError {
    ApiError::not_found(format!(
        "the hub serves no API group {group:?}; its kinds are {GROUP}/{VERSION} (a cluster's own API is at /k8s/clusters/NAME)"
    ))
}

/// `GET /apis/{group}`.
pub(super) async fn group(
    State(api): State<Api>,
    Path(group): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    known(&api, &headers).await?;
    if !GROUPS.contains(&group.as_str()) {
        return Err(no_group(&group));
    }
    let mut entry = group_entry(&group);
    entry["kind"] = json!("APIGroup");
    entry["apiVersion"] = json!("v1");
    Ok(Json(entry))
}

/// `GET /apis/{group}/{version}`: the resources of a group version.
pub(super) async fn resources(
    State(api): State<Api>,
    Path((group, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    known(&api, &headers).await?;
    let Some(resources) = resources_of(&group).filter(|_| version == VERSION) else {
        return Err(no_group(&format!("{group}/{version}")));
    };
    let resources: Vec<Value> = resources
        .iter()
        .map(|(plural, singular, kind, verbs, short, categories)| {
            json!({
                "name": plural,
                "singularName": singular,
                "namespaced": false,
                "kind": kind,
                "verbs": verbs,
                "shortNames": short,
                "categories": categories,
            })
        })
        .collect();
    Ok(Json(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{group}/{version}"),
        "resources": resources,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectls_accept_header_asks_for_aggregated_discovery_and_a_plain_one_does_not() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
                .parse()
                .unwrap(),
        );
        assert!(wants_aggregated(&headers));
        headers.insert(header::ACCEPT, "application/json, */*".parse().unwrap());
        assert!(!wants_aggregated(&headers));
    }
}
