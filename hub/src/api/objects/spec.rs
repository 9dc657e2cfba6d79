//! Each kind's own rules for a spec on its way into the store: what it names must exist,
//! passwords are hashed, secrets an update leaves out are kept, a bundle's objects are stored
//! as content.

use serde_json::Value;

use super::checks::{HUB_WRITES, hash_password, must_exist, set};
use crate::{
    api::ApiError,
    model::Kind,
    store::{Object, Store, StoreError},
};

/// A bundle's objects (`spec.resources` or `spec.manifests`) stored as content-addressed
/// chunks and named by `spec.content`; an update that gives none keeps the content it had. A
/// `spec.content` the caller wrote is never taken: only the hub names chunks.
async fn bundle_content(
    store: &dyn Store,
    spec: &mut Value,
    current: Option<&Object>,
) -> Result<(), ApiError> {
    use crate::delivery::content;
    let Value::Object(map) = spec else {
        return Ok(());
    };
    let objects = match (map.remove("resources"), map.remove("manifests")) {
        (Some(Value::Array(list)), _) => Some(content::check_objects(list)),
        (_, Some(Value::String(yaml))) => Some(content::parse_manifests(&yaml)),
        _ => None,
    };
    map.remove("content");
    let content = match objects {
        Some(objects) => {
            let objects = objects.map_err(ApiError::invalid)?;
            if objects.is_empty() {
                return Err(ApiError::invalid(
                    "spec.resources, spec.manifests: a bundle needs at least one object",
                ));
            }
            let stored = content::store_objects(store, &objects).await?;
            serde_json::to_value(stored).map_err(|e| ApiError::invalid(e.to_string()))?
        }
        None => match current.and_then(|c| c.spec.get("content")) {
            Some(kept) => kept.clone(),
            None => {
                return Err(ApiError::invalid(
                    "spec.resources or spec.manifests: a bundle needs its objects, as a list of Kubernetes objects or as YAML",
                ));
            }
        },
    };
    map.insert("content".into(), content);
    Ok(())
}

/// Kind-specific rules for a new or replaced spec: references must exist, passwords are hashed,
/// secret hashes are kept from `current`. Returns the spec to store.
pub(super) async fn checked_spec(
    store: &dyn Store,
    kind: Kind,
    name: &str,
    spec: Value,
    current: Option<&Object>,
) -> Result<Value, ApiError> {
    let mut spec = kind.validate_spec(&spec).map_err(ApiError::invalid)?;
    // What only the hub writes survives an update untouched.
    if let (Some(current), Value::Object(map)) = (current, &mut spec) {
        for field in HUB_WRITES {
            if let Some(v) = current.spec.get(field) {
                map.insert(field.to_owned(), v.clone());
            }
        }
    }
    // A secret the caller cannot read back is kept when an update leaves it out.
    if let Some(current) = current {
        crate::model::agentconfig::keep_env_passwords(&mut spec, &current.spec);
        crate::model::keep_plan_files(&mut spec, &current.spec);
        for pointer in crate::model::SECRET_FIELDS {
            let (parent, field) = pointer.rsplit_once('/').unwrap_or(("", pointer));
            if let (Some(kept), Some(Value::Object(map))) =
                (current.spec.pointer(pointer), spec.pointer_mut(parent))
            {
                map.entry(field).or_insert_with(|| kept.clone());
            }
        }
    }
    match kind {
        Kind::CloudCredential => {
            let parsed: crate::model::CloudCredentialSpec = serde_json::from_value(spec.clone())
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            if let Some(field) = crate::model::missing_secret(&parsed) {
                return Err(ApiError::invalid(format!(
                    "{field}: a {} credential needs it",
                    parsed.driver.label()
                )));
            }
        }
        Kind::MachineTemplate => {
            let parsed: crate::model::MachineTemplateSpec = serde_json::from_value(spec.clone())
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            match store
                .get(Kind::CloudCredential.name(), &parsed.credential)
                .await
            {
                Ok(found) => {
                    let driver = found.spec.get("driver").and_then(Value::as_str);
                    if driver != Some(parsed.driver.label()) {
                        return Err(ApiError::invalid(format!(
                            "spec.credential: {:?} is a credential for driver {}, not {}",
                            parsed.credential,
                            driver.unwrap_or("?"),
                            parsed.driver.label()
                        )));
                    }
                }
                Err(StoreError::NotFound { .. }) => {
                    return Err(ApiError::invalid(format!(
                        "spec.credential: no CloudCredential {:?}; create it first",
                        parsed.credential
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Kind::User => {
            let password = spec
                .get("password")
                .and_then(Value::as_str)
                .map(str::to_owned);
            if let Value::Object(map) = &mut spec {
                map.remove("password");
            }
            match password {
                Some(p) => set(
                    &mut spec,
                    "passwordHash",
                    Value::String(hash_password(p).await?),
                ),
                None if current.is_none() => {
                    return Err(ApiError::invalid(
                        "spec.password: a new user needs a password of at least 12 characters",
                    ));
                }
                None => {}
            }
        }
        Kind::Bundle => bundle_content(store, &mut spec, current).await?,
        Kind::Host | Kind::RegistrationToken => {
            let cluster = spec
                .get("cluster")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            must_exist(store, Kind::Cluster, &cluster, "spec.cluster").await?;
        }
        Kind::Plan => {
            // One plan per host and slot, named after them: the host's own plan as the host, its
            // task `task-<host>`.
            let (host, cluster) = (
                spec.get("host").and_then(Value::as_str).unwrap_or_default(),
                spec.get("cluster")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            );
            let task = spec.get("slot").and_then(Value::as_str) == Some(crate::plans::TASK);
            let expected = if task {
                crate::plans::task_plan_name(host)
            } else {
                host.to_owned()
            };
            if expected != name {
                return Err(ApiError::invalid(format!(
                    "metadata.name: a {} is named after its host; name it {expected:?}",
                    if task { "host's task" } else { "plan" }
                )));
            }
            must_exist(store, Kind::Cluster, cluster, "spec.cluster").await?;
            match store.get(Kind::Host.name(), host).await {
                Ok(h) if h.spec.get("cluster").and_then(Value::as_str) == Some(cluster) => {}
                Ok(_) => {
                    return Err(ApiError::invalid(format!(
                        "spec.host: host {host:?} is not in cluster {cluster:?}"
                    )));
                }
                Err(StoreError::NotFound { .. }) => {
                    return Err(ApiError::invalid(format!(
                        "spec.host: Host {host:?} does not exist; hosts register with the host command"
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Kind::RoleBinding => {
            if let Some(cluster) = spec.get("cluster").and_then(Value::as_str) {
                must_exist(store, Kind::Cluster, cluster, "spec.cluster").await?;
            }
            if let Some(user) = spec.get("user").and_then(Value::as_str) {
                must_exist(store, Kind::User, user, "spec.user").await?;
            }
            if let Some(project) = spec.get("project").and_then(Value::as_str) {
                in_project(store, &spec, project).await?;
            }
        }
        Kind::Project => {
            let cluster = spec.get("cluster").and_then(Value::as_str).unwrap_or("");
            must_exist(store, Kind::Cluster, cluster, "spec.cluster").await?;
        }
        Kind::ProjectSecret => {
            let project = spec.get("project").and_then(Value::as_str).unwrap_or("");
            in_project(store, &spec, project).await?;
        }
        Kind::EtcdSnapshot => {
            let cluster = spec.get("cluster").and_then(Value::as_str).unwrap_or("");
            must_exist(store, Kind::Cluster, cluster, "spec.cluster").await?;
            let found = store.get(Kind::Cluster.name(), cluster).await?;
            if found.spec.get("type").and_then(Value::as_str) != Some("custom") {
                return Err(ApiError::invalid(format!(
                    "spec.cluster: {cluster:?} is an imported cluster; Drover snapshots the etcd of clusters it provisioned (custom clusters) only"
                )));
            }
            if let Some(current) = current
                && current.spec != spec
            {
                return Err(ApiError::invalid(
                    "spec: a snapshot's spec cannot change; take a new snapshot instead",
                ));
            }
        }
        _ => {}
    }
    Ok(spec)
}

/// `project` exists and belongs to the cluster `spec` names.
async fn in_project(store: &dyn Store, spec: &Value, project: &str) -> Result<(), ApiError> {
    let cluster = spec.get("cluster").and_then(Value::as_str).unwrap_or("");
    match store.get(Kind::Project.name(), project).await {
        Ok(p) if p.spec.get("cluster").and_then(Value::as_str) == Some(cluster) => Ok(()),
        Ok(p) => Err(ApiError::invalid(format!(
            "spec.cluster: project {project:?} is in cluster {}, not {cluster:?}",
            p.spec.get("cluster").unwrap_or(&Value::Null)
        ))),
        Err(StoreError::NotFound { .. }) => Err(ApiError::invalid(format!(
            "spec.project: Project {project:?} does not exist; create it first"
        ))),
        Err(e) => Err(e.into()),
    }
}
