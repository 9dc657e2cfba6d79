//! The hub's kinds as a Kubernetes API group, `management.drover.io/v1`, so kubectl and every
//! other Kubernetes client manage the hub as they manage a cluster: discovery (`/api`, `/apis`,
//! aggregated too), OpenAPI v2 and v3, read-only `CustomResourceDefinition`s, Table answers,
//! watches as Kubernetes streams them, the patch formats and server-side apply, and
//! `SelfSubjectAccessReview`. Every verb goes through the same handlers' checks as `/v1`: the
//! same authorisation, validation and secrets kept write-only.

use super::Api;
use crate::model::Kind;
use axum::{
    Router,
    http::{HeaderMap, header},
    routing::{get, post},
};

mod discovery;
mod fields;
mod review;
mod schema;
mod table;
mod verbs;
mod watch;

/// The group and version the hub's kinds are served as.
pub const GROUP: &str = crate::model::HUB_GROUP;
pub const VERSION: &str = "v1";

pub fn router(api: Api) -> Router {
    let kinds = format!("/apis/{GROUP}/{VERSION}");
    Router::new()
        .route("/version", get(discovery::version))
        .route("/api", get(discovery::core))
        .route("/apis", get(discovery::groups))
        .route("/apis/{group}", get(discovery::group))
        .route("/apis/{group}/{version}", get(discovery::resources))
        .route("/openapi/v2", get(schema::v2))
        .route("/openapi/v3", get(schema::v3_index))
        .route("/openapi/v3/apis/{group}/{version}", get(schema::v3))
        .route(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            post(review::create),
        )
        .route(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            get(schema::crds),
        )
        .route(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
            get(schema::crd)
                .put(schema::read_only)
                .patch(schema::read_only)
                .delete(schema::read_only),
        )
        .route(
            &format!("{kinds}/{{plural}}"),
            get(verbs::list).post(verbs::create),
        )
        .route(
            &format!("{kinds}/{{plural}}/{{name}}"),
            get(verbs::get)
                .put(verbs::update)
                .patch(verbs::patch)
                .delete(verbs::delete),
        )
        .with_state(api)
}

/// The singular a kind's objects are named by on the command line (`kubectl get cluster`).
fn singular(kind: Kind) -> String {
    kind.name().to_lowercase()
}

/// The verbs each kind takes here: all of kubectl's but `deletecollection`; machines and what
/// a bundle gives a cluster are made by the hub only.
fn verbs_of(kind: Kind) -> Vec<&'static str> {
    let mut verbs = vec!["delete", "get", "list", "patch", "update", "watch"];
    if !matches!(kind, Kind::Machine | Kind::BundleDeployment) {
        verbs.insert(0, "create");
    }
    verbs
}

/// Every hub kind is in this category: `kubectl get drover` lists them all.
const CATEGORY: &str = "drover";

/// Whether the client asks for a Table (`kubectl get` does), as `Accept: …;as=Table;…`.
fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|t| t.contains("as=Table")))
}
