//! `drover-hub get|apply|host|setting`: any kind of the hub's objects, read as tables or
//! YAML, and applied from files as `kubectl apply` applies manifests: each object by its kind
//! and name, created when missing, else merged into (labels, annotations, spec).

use serde_json::{Value, json};

use super::{CliError, Request, Saved, connection::Client, refused};
use crate::model::Kind;

/// The kind a user means by `word`: its plural (`clusters`), its name in any case (`Cluster`,
/// `cluster`).
pub(super) fn kind_of(word: &str) -> Result<Kind, CliError> {
    let lower = word.to_ascii_lowercase();
    Kind::ALL
        .into_iter()
        .find(|k| k.plural() == lower || k.name().to_ascii_lowercase() == lower)
        .ok_or_else(|| {
            let kinds: Vec<&str> = Kind::ALL.iter().map(|k| k.plural()).collect();
            CliError::Usage(format!(
                "the hub keeps no kind {word:?}; its kinds: {}",
                kinds.join(", ")
            ))
        })
}

fn encoded(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// The path a reading request gets.
pub(super) fn read_path(request: &Request) -> Result<String, CliError> {
    Ok(match request {
        Request::Get {
            kind,
            name,
            selector,
        } => {
            let plural = kind_of(kind)?.plural();
            match (name, selector) {
                (Some(name), _) => format!("/v1/{plural}/{}", encoded(name)),
                (None, Some(selector)) => {
                    format!("/v1/{plural}?labelSelector={}", encoded(selector))
                }
                (None, None) => format!("/v1/{plural}"),
            }
        }
        Request::HostList { .. } => "/v1/hosts".to_owned(),
        Request::HostGet { name } => format!("/v1/hosts/{}", encoded(name)),
        Request::GitrepoList => "/v1/gitrepos".to_owned(),
        Request::GitrepoGet { name } => format!("/v1/gitrepos/{}", encoded(name)),
        Request::BundleList { cluster: None } => "/v1/bundles".to_owned(),
        Request::BundleList {
            cluster: Some(cluster),
        } => format!(
            "/v1/bundledeployments?labelSelector={}",
            encoded(&format!("{}={cluster}", crate::delivery::CLUSTER_LABEL))
        ),
        Request::BundleGet { name } => format!("/v1/bundles/{}", encoded(name)),
        Request::SettingList => "/v1/settings".to_owned(),
        Request::SettingGet { name } => format!("/v1/settings/{}", encoded(name)),
        other => unreachable!("not a read: {other:?}"),
    })
}

/// A GET of `path`: the object, `None` when the hub says there is none.
async fn read(client: &Client, saved: &Saved, path: &str) -> Result<Option<Value>, CliError> {
    let (status, bytes) = client.send("GET", path, Some(&saved.token), None).await?;
    match status {
        404 => Ok(None),
        200 => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| CliError::Refused(format!("unreadable answer: {e}"))),
        _ => Err(refused(status, &bytes)),
    }
}

/// Sends a write; the object the hub answers with.
async fn write(
    client: &Client,
    saved: &Saved,
    method: &str,
    path: &str,
    body: &Value,
) -> Result<Value, CliError> {
    let (status, bytes) = client
        .send(method, path, Some(&saved.token), Some(body))
        .await?;
    if !(200..300).contains(&status) {
        return Err(refused(status, &bytes));
    }
    serde_json::from_slice(&bytes).map_err(|e| CliError::Refused(format!("unreadable answer: {e}")))
}

/// Creates `object` at `plural` if the hub has none of its name, else merges its labels,
/// annotations and spec into the one there: what happened, as kubectl says it.
async fn create_or_merge(
    client: &Client,
    saved: &Saved,
    kind: Kind,
    object: &Value,
) -> Result<String, CliError> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let path = format!("/v1/{}/{}", kind.plural(), encoded(name));
    let what = format!("{}/{name}", kind.name().to_ascii_lowercase());
    let Some(current) = read(client, saved, &path).await? else {
        write(
            client,
            saved,
            "POST",
            &format!("/v1/{}", kind.plural()),
            object,
        )
        .await?;
        return Ok(format!("{what} created"));
    };
    let mut patch = json!({});
    for field in ["labels", "annotations"] {
        if let Some(value) = object["metadata"].get(field) {
            patch["metadata"][field] = value.clone();
        }
    }
    if let Some(spec) = object.get("spec") {
        patch["spec"] = spec.clone();
    }
    let after = write(client, saved, "PATCH", &path, &patch).await?;
    let moved = after["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"];
    Ok(format!(
        "{what} {}",
        if moved { "configured" } else { "unchanged" }
    ))
}

/// `apply -f FILE`: every object in the file, in order; stops at the first the hub refuses,
/// saying which (those before it are applied, as kubectl leaves them).
pub(super) async fn apply(
    client: &Client,
    saved: &Saved,
    file: &std::path::Path,
) -> Result<String, CliError> {
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(file)
    }
    .map_err(|e| CliError::Usage(format!("{}: {e}", file.display())))?;
    let objects = parse(&text).map_err(|e| CliError::Usage(format!("{}: {e}", file.display())))?;
    let mut said = String::new();
    for (i, object) in objects.iter().enumerate() {
        let kind = object["kind"].as_str().unwrap_or_default();
        let kind = kind_of(kind)
            .map_err(|e| CliError::Usage(format!("{}: object {}: {e}", file.display(), i + 1)))?;
        let line = create_or_merge(client, saved, kind, object)
            .await
            .map_err(|e| match e {
                CliError::Refused(why) => {
                    let before = if said.is_empty() {
                        "nothing before it was applied".to_owned()
                    } else {
                        format!("applied before it: {}", said.trim_end().replace('\n', ", "))
                    };
                    CliError::Refused(format!(
                        "{}/{}: {why} ({before})",
                        kind.name().to_ascii_lowercase(),
                        text_of(&object["metadata"]["name"])
                    ))
                }
                other => other,
            })?;
        said.push_str(&line);
        said.push('\n');
    }
    Ok(said)
}

fn text_of(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

/// The objects of a YAML (several documents) or JSON file, each with a kind and a name; a
/// `List` stands for its items.
fn parse(text: &str) -> Result<Vec<Value>, String> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    let mut objects = Vec::new();
    for document in documents.into_iter().filter(|d| !d.is_null()) {
        let is_list = document["kind"]
            .as_str()
            .is_some_and(|k| k.ends_with("List"));
        match document.get("items").and_then(Value::as_array) {
            Some(items) if is_list => objects.extend(items.iter().cloned()),
            _ => objects.push(document),
        }
    }
    for (i, object) in objects.iter().enumerate() {
        if !object["kind"].is_string() || !object["metadata"]["name"].is_string() {
            return Err(format!(
                "object {} has no kind or no metadata.name: each object needs both",
                i + 1
            ));
        }
    }
    if objects.is_empty() {
        return Err("no objects in it".into());
    }
    Ok(objects)
}

/// `setting set NAME VALUE`.
pub(super) async fn set_setting(
    client: &Client,
    saved: &Saved,
    name: &str,
    value: &str,
) -> Result<String, CliError> {
    let object = json!({
        "kind": Kind::Setting.name(),
        "metadata": {"name": name},
        "spec": {"value": value},
    });
    let line = create_or_merge(client, saved, Kind::Setting, &object).await?;
    Ok(format!("{line}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_named_as_kubectl_users_name_kinds() {
        for word in ["clusters", "cluster", "Cluster", "CLUSTERS"] {
            assert_eq!(kind_of(word).unwrap(), Kind::Cluster, "{word}");
        }
        assert_eq!(kind_of("rolebinding").unwrap(), Kind::RoleBinding);
        let error = kind_of("pods").unwrap_err().to_string();
        assert!(
            error.starts_with("the hub keeps no kind \"pods\"; its kinds: clusters, "),
            "{error}"
        );
    }

    #[test]
    fn a_file_holds_documents_and_lists_each_with_a_kind_and_a_name() {
        let objects = parse(
            "kind: Setting\nmetadata: {name: a}\nspec: {value: '1'}\n---\n\
             kind: List\nitems:\n- {kind: Project, metadata: {name: p}}\n- {kind: Project, metadata: {name: q}}\n",
        )
        .unwrap();
        let names: Vec<&str> = objects
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "p", "q"]);
        assert_eq!(
            parse("kind: Setting\nspec: {}\n").unwrap_err(),
            "object 1 has no kind or no metadata.name: each object needs both"
        );
        assert_eq!(parse("").unwrap_err(), "no objects in it");
        assert!(parse("{\"kind\": \"Setting\", \"metadata\": {\"name\": \"x\"}}").is_ok());
    }
}
