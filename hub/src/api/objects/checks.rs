//! What every write's body must be before anything is stored: the right kind and
//! apiVersion, a valid name, metadata the caller may set, a spec without the fields only the
//! hub writes; and the small helpers the kinds' rules share.

use serde_json::{Value, json};

use crate::{
    api::ApiError,
    model::{Kind, validate_name},
    store::{ObjectMeta, Store, StoreError},
};

/// What create and replace check of a body before anything else: the right kind, a valid
/// name, metadata the store can keep, and a spec without the fields only the hub writes.
/// Returns that metadata and spec. Needs no store, so the fuzzer calls it too
/// (`fuzz/fuzz_targets/api_body.rs`).
pub fn check_body(kind: Kind, value: &Value, name: &str) -> Result<(ObjectMeta, Value), ApiError> {
    kind_matches(value, kind)?;
    validate_name(kind, name).map_err(ApiError::invalid)?;
    let spec = spec_from(value)?;
    match kind {
        Kind::Setting => {
            crate::auth::lifetimes::validate_setting(name, &spec).map_err(ApiError::invalid)?;
            crate::model::agentconfig::validate_setting(name, &spec).map_err(ApiError::invalid)?;
            crate::recording::validate_setting(name, &spec).map_err(ApiError::invalid)?;
            if name == crate::auth::providers::REFRESH_SETTING {
                let value = spec.get("value").and_then(Value::as_str).unwrap_or("");
                crate::auth::providers::parse_interval(value).map_err(|e| {
                    ApiError::invalid(format!(
                        "spec.value: {e} (setting {name}: how often directory users' groups are read again)"
                    ))
                })?;
            }
        }
        Kind::AuthProvider => {
            crate::model::validate_provider_name(name).map_err(ApiError::invalid)?;
        }
        _ => {}
    }
    Ok((metadata_from(value, name)?, spec))
}

/// The metadata a caller may set: the name, labels, annotations and the resourceVersion read.
/// Everything else (uid, finalizers, owner references, timestamps, generation) is the hub's;
/// a body may carry it back as read, but a different value is refused (see
/// [`hub_owned_unchanged`]).
fn metadata_from(value: &Value, name: &str) -> Result<ObjectMeta, ApiError> {
    let mut meta = value.get("metadata").cloned().unwrap_or_else(|| json!({}));
    if let Value::Object(map) = &mut meta {
        map.insert("name".into(), Value::String(name.to_owned()));
    }
    let given: ObjectMeta = serde_json::from_value(meta)
        .map_err(|e| ApiError::bad_request(format!("metadata: {e}")))?;
    if !given.resource_version.chars().all(|c| c.is_ascii_digit()) {
        return Err(ApiError::invalid(format!(
            "metadata.resourceVersion {:?} is not a resourceVersion; send back the one you read, or none",
            given.resource_version
        )));
    }
    for (key, value) in &given.labels {
        kubeshape::selector::key_of(key).map_err(ApiError::invalid)?;
        kubeshape::selector::value_of(value).map_err(ApiError::invalid)?;
    }
    Ok(ObjectMeta {
        name: name.to_owned(),
        resource_version: given.resource_version,
        labels: given.labels,
        annotations: given.annotations,
        managed_fields: given.managed_fields,
        ..ObjectMeta::default()
    })
}

/// Refuses a body that sets the metadata only the hub writes to anything but what is stored
/// (`current`; nothing for a new object): finalizers are the hub's promise to clean up, and
/// owner references say which objects this one was made for.
pub(super) fn hub_owned_unchanged(
    value: &Value,
    current: Option<&ObjectMeta>,
) -> Result<(), ApiError> {
    let stored = current.cloned().unwrap_or_default();
    let sent = |field: &str| value.pointer(&format!("/metadata/{field}"));
    if let Some(finalizers) = sent("finalizers")
        && *finalizers != json!(stored.finalizers)
        && !(finalizers.is_null() && stored.finalizers.is_empty())
    {
        return Err(ApiError::invalid(
            "metadata.finalizers are the hub's: it adds them when it creates an object and removes them when its clean-up is done; leave them as read (or out)",
        ));
    }
    if let Some(refs) = sent("ownerReferences")
        && *refs != json!(stored.owner_references)
        && !(refs.is_null() && stored.owner_references.is_empty())
    {
        return Err(ApiError::invalid(
            "metadata.ownerReferences are the hub's: they name the objects this one was created for; leave them as read (or out)",
        ));
    }
    Ok(())
}

/// Spec fields only the hub writes: secret hashes, and a directory user's identity and groups
/// (an admin who could set them could make anyone anyone).
pub(super) const HUB_WRITES: [&str; 5] = [
    "secretHash",
    "passwordHash",
    "principal",
    "providerGroups",
    "groupsRefreshedAt",
];

/// The spec as given, minus anything only the hub may write.
fn spec_from(value: &Value) -> Result<Value, ApiError> {
    let mut spec = value
        .get("spec")
        .cloned()
        .ok_or_else(|| ApiError::invalid("spec: every object needs a spec (`{}` for defaults)"))?;
    if let Value::Object(map) = &mut spec {
        for field in HUB_WRITES {
            map.remove(field);
        }
    }
    Ok(spec)
}

fn kind_matches(value: &Value, kind: Kind) -> Result<(), ApiError> {
    if let Some(version) = value.get("apiVersion").and_then(Value::as_str)
        && ![crate::api::API_VERSION, crate::api::OLD_API_VERSION].contains(&version)
    {
        return Err(ApiError::bad_request(format!(
            "apiVersion {version:?}: the hub's {} objects are {}",
            kind.name(),
            crate::api::API_VERSION
        )));
    }
    match value.get("kind").and_then(Value::as_str) {
        Some(k) if k != kind.name() => Err(ApiError::bad_request(format!(
            "the body is a {k} but the URL is for {}; send it to /v1/{}",
            kind.name(),
            Kind::from_name(k).map_or("…", Kind::plural)
        ))),
        _ => Ok(()),
    }
}

pub(super) async fn must_exist(
    store: &dyn Store,
    kind: Kind,
    name: &str,
    field: &str,
) -> Result<(), ApiError> {
    match store.get(kind.name(), name).await {
        Ok(_) => Ok(()),
        Err(StoreError::NotFound { .. }) => Err(ApiError::invalid(format!(
            "{field}: {} {name:?} does not exist; create it first",
            kind.name()
        ))),
        Err(e) => Err(e.into()),
    }
}

pub(super) fn set(spec: &mut Value, field: &str, value: Value) {
    if let Value::Object(map) = spec {
        map.insert(field.to_owned(), value);
    }
}

pub(super) async fn hash_password(password: String) -> Result<String, ApiError> {
    tokio::task::spawn_blocking(move || crate::auth::secret::hash_password(&password))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))
}
