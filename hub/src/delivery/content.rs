//! A bundle's content: its objects as one canonical JSON array, stored once in content-addressed
//! chunks (`BundleChunk` `sha256-HEX`), so a bundle given to a thousand clusters is stored once
//! and no stored value nears etcd's request limit.

use serde_json::{Value, json};

use crate::{
    model::{CHUNK_BYTES, CHUNK_KIND, ContentRef},
    store::{Object, Op, Store, StoreError},
};

/// `sha256-HEX` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    proto::content_digest(bytes)
}

/// The objects of multi-document YAML (a `List`'s items count one by one; empty documents
/// none). The message names the document and what is wrong with it.
pub fn parse_manifests(yaml: &str) -> Result<Vec<Value>, String> {
    let mut objects = Vec::new();
    let documents: Vec<Value> = serde_saphyr::from_multiple(yaml)
        .map_err(|e| format!("the manifests are not YAML: {e}"))?;
    for (i, document) in documents.into_iter().enumerate() {
        if document.is_null() {
            continue;
        }
        objects.extend(flatten(document, &format!("document {}", i + 1))?);
    }
    Ok(objects)
}

/// `object`, or a `List`'s items, each checked to be a Kubernetes object.
fn flatten(object: Value, at: &str) -> Result<Vec<Value>, String> {
    if object.get("kind").and_then(Value::as_str) == Some("List") {
        let items = object
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut out = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            out.extend(flatten(item, &format!("{at}, item {}", i + 1))?);
        }
        return Ok(out);
    }
    check_object(&object, at)?;
    Ok(vec![object])
}

/// Whether `object` is a Kubernetes object a cluster can be given.
pub fn check_object(object: &Value, at: &str) -> Result<(), String> {
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
    let Some(kind) = text("/kind").filter(|k| !k.is_empty()) else {
        return Err(format!("{at}: a Kubernetes object needs a kind"));
    };
    if text("/apiVersion").is_none_or(str::is_empty) {
        return Err(format!("{at} ({kind}): it needs an apiVersion"));
    }
    if text("/metadata/name").is_none_or(str::is_empty) {
        return Err(format!(
            "{at} ({kind}): it needs metadata.name (generateName cannot be applied again and again)"
        ));
    }
    Ok(())
}

/// The checked objects of `list` (a bundle's `spec.resources`).
pub fn check_objects(list: Vec<Value>) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for (i, object) in list.into_iter().enumerate() {
        out.extend(flatten(object, &format!("spec.resources[{i}]"))?);
    }
    Ok(out)
}

/// Splits `text` into pieces of at most [`CHUNK_BYTES`], on character boundaries.
fn split(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = rest.len().min(CHUNK_BYTES);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let (piece, tail) = rest.split_at(end);
        pieces.push(piece);
        rest = tail;
    }
    pieces
}

/// Stores `objects` (chunks that exist already are kept, being the same bytes) and returns
/// how the bundle names them.
pub async fn store_objects(store: &dyn Store, objects: &[Value]) -> Result<ContentRef, StoreError> {
    let text = serde_json::to_string(objects).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let mut chunks = Vec::new();
    for piece in split(&text) {
        let name = digest(piece.as_bytes());
        let chunk = Object::new(CHUNK_KIND, &name, json!({"data": piece}));
        match store.transact(vec![Op::Create(chunk)]).await {
            Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        }
        chunks.push(name);
    }
    Ok(ContentRef {
        digest: digest(text.as_bytes()),
        chunks,
        objects: u32::try_from(objects.len()).unwrap_or(u32::MAX),
        bytes: text.len() as u64,
    })
}

/// The objects `content` names, read back and checked against its digest.
pub async fn read_objects(store: &dyn Store, content: &ContentRef) -> Result<Vec<Value>, String> {
    let found = store
        .get_many(CHUNK_KIND, content.chunks.clone())
        .await
        .map_err(|e| e.to_string())?;
    let mut text = String::with_capacity(usize::try_from(content.bytes).unwrap_or(0));
    for (name, chunk) in content.chunks.iter().zip(found) {
        let chunk = chunk.ok_or_else(|| format!("chunk {name} of the content is missing"))?;
        text.push_str(chunk.spec["data"].as_str().unwrap_or_default());
    }
    if digest(text.as_bytes()) != content.digest {
        return Err(format!(
            "the content read back is not {}; it was changed or lost",
            content.digest
        ));
    }
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn manifests_read_document_by_document_and_say_which_is_wrong() {
        let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n---\n\
                    apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Secret, metadata: {name: b}}\n";
        let objects = parse_manifests(yaml).unwrap();
        let names: Vec<&str> = objects
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
        let err =
            parse_manifests("kind: ConfigMap\napiVersion: v1\nmetadata: {generateName: x-}\n")
                .unwrap_err();
        assert_eq!(
            err,
            "document 1 (ConfigMap): it needs metadata.name (generateName cannot be applied again and again)"
        );
        assert!(
            parse_manifests("a: [")
                .unwrap_err()
                .starts_with("the manifests are not YAML")
        );
    }

    #[test]
    fn content_splits_on_character_boundaries_into_bounded_chunks() {
        let text = "é".repeat(CHUNK_BYTES); // two bytes each
        let pieces = split(&text);
        assert_eq!(pieces.len(), 2);
        assert!(pieces.iter().all(|p| p.len() <= CHUNK_BYTES));
        assert_eq!(pieces.concat(), text);
    }
}
