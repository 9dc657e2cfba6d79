//! `SelfSubjectAccessReview` (`kubectl auth can-i`), answered by the hub's own authorisation:
//! the same decision the verb itself would get.

use axum::{
    Json,
    body::Bytes,
    extract::State,
    http::{HeaderMap, header},
};
use serde_json::{Value, json};

use super::GROUP;
use crate::{
    api::{Api, ApiError, allow},
    auth::{Principal, Verb},
    model::Kind,
    store::{Object, StoreError},
};

pub(super) async fn create(
    State(api): State<Api>,
    headers: HeaderMap,
    request: Bytes,
) -> Result<Json<Value>, ApiError> {
    let principal = api.principal(&headers).await?;
    let protobuf = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with(PROTOBUF));
    let mut review = if protobuf {
        from_protobuf(&request).map_err(|e| {
            ApiError::bad_request(format!("a SelfSubjectAccessReview in protobuf: {e}"))
        })?
    } else {
        serde_json::from_slice(&request)
            .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?
    };
    let attributes = review
        .pointer("/spec/resourceAttributes")
        .cloned()
        .unwrap_or(Value::Null);
    let (allowed, reason) = if attributes.is_null() {
        (
            false,
            "the hub answers for its own kinds (spec.resourceAttributes), not for paths".to_owned(),
        )
    } else {
        decide(&api, &principal, &attributes).await?
    };
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!("SelfSubjectAccessReview");
    review["status"] = json!({"allowed": allowed, "reason": reason});
    Ok(Json(review))
}

fn verb_of(verb: &str) -> Option<Verb> {
    Some(match verb {
        "get" => Verb::Get,
        "list" => Verb::List,
        "watch" => Verb::Watch,
        "create" => Verb::Create,
        "update" | "patch" => Verb::Update,
        "delete" => Verb::Delete,
        _ => return None,
    })
}

/// Whether the caller may do what `attributes` says, and why not.
async fn decide(
    api: &Api,
    principal: &Principal,
    attributes: &Value,
) -> Result<(bool, String), ApiError> {
    let text = |field: &str| attributes.get(field).and_then(Value::as_str).unwrap_or("");
    let (group, resource, name) = (text("group"), text("resource"), text("name"));
    if group != GROUP {
        return Ok((
            false,
            format!(
                "the hub serves {GROUP} only; ask a cluster about its own resources through /k8s/clusters/NAME"
            ),
        ));
    }
    let Some(kind) = Kind::from_plural(resource) else {
        return Ok((false, format!("{GROUP} has no resource {resource:?}")));
    };
    let Some(verb) = verb_of(text("verb")) else {
        return Ok((false, format!("the hub has no verb {:?}", text("verb"))));
    };
    if matches!(verb, Verb::List | Verb::Watch) {
        // A list is answered with the objects the caller may read, where the kind is listed
        // at all.
        return Ok(match crate::auth::may_list(principal, kind) {
            Ok(()) => (true, String::new()),
            Err(e) => (false, e.to_string()),
        });
    }
    // A named object is judged as it is; no name (or one that does not exist, for create)
    // as one no cluster's or project's role reaches.
    let object = if name.is_empty() {
        Object::new(kind.name(), "", json!({}))
    } else {
        match api.store.get(kind.name(), name).await {
            Ok(object) => object,
            Err(StoreError::NotFound { .. }) => Object::new(kind.name(), name, json!({})),
            Err(e) => return Err(e.into()),
        }
    };
    // Reading it first: a caller who may not see it learns nothing of what it is.
    if !name.is_empty()
        && verb != Verb::Create
        && allow(principal, Verb::Get, kind, &object).is_err()
    {
        return Ok((
            false,
            format!("no {} {name:?} the caller may see", kind.name()),
        ));
    }
    Ok(match allow(principal, verb, kind, &object) {
        Ok(()) => (true, String::new()),
        Err(_) if name.is_empty() => (
            false,
            format!(
                "no role {:?} holds allows {} {} on the hub (a role on a cluster reaches that cluster's objects: name one)",
                principal.user,
                text("verb"),
                kind.plural()
            ),
        ),
        Err(e) => (false, e.message),
    })
}

/// kubectl sends its access reviews in Kubernetes' protobuf encoding.
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// The fields of one protobuf message: (field number, wire type, varint or bytes).
fn fields(mut bytes: &[u8]) -> Result<Vec<(u64, Field<'_>)>, String> {
    fn varint(bytes: &mut &[u8]) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = bytes.split_first().ok_or("cut short")?;
            *bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a varint longer than 64 bits".into())
    }
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        let field = match key & 7 {
            0 => {
                varint(&mut bytes)?;
                Field::Varint
            }
            2 => {
                let len = usize::try_from(varint(&mut bytes)?).map_err(|e| e.to_string())?;
                if len > bytes.len() {
                    return Err("a field longer than the message".into());
                }
                let (value, rest) = bytes.split_at(len);
                bytes = rest;
                Field::Bytes(value)
            }
            wire => return Err(format!("wire type {wire} is not in an access review")),
        };
        out.push((key >> 3, field));
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy)]
enum Field<'a> {
    Varint,
    Bytes(&'a [u8]),
}

fn message<'a>(fields_of: &[(u64, Field<'a>)], number: u64) -> Option<&'a [u8]> {
    fields_of.iter().find_map(|(n, f)| match f {
        Field::Bytes(b) if *n == number => Some(*b),
        _ => None,
    })
}

/// A `SelfSubjectAccessReview` from Kubernetes' protobuf envelope (`k8s\0`, then a
/// `runtime.Unknown` whose `raw` is the review), as the JSON it stands for.
fn from_protobuf(body: &[u8]) -> Result<Value, String> {
    let unknown = body
        .strip_prefix(b"k8s\0")
        .ok_or("it does not start with the k8s envelope")?;
    let unknown = fields(unknown)?;
    let raw = message(&unknown, 2).ok_or("the envelope holds no object")?;
    let review = fields(raw)?;
    let spec = fields(message(&review, 2).unwrap_or_default())?;
    let Some(attributes) = message(&spec, 1) else {
        return Ok(json!({"spec": {"nonResourceAttributes": {}}}));
    };
    let mut out = serde_json::Map::new();
    for (number, field) in fields(attributes)? {
        let name = match number {
            1 => "namespace",
            2 => "verb",
            3 => "group",
            4 => "version",
            5 => "resource",
            6 => "subresource",
            7 => "name",
            _ => continue,
        };
        if let Field::Bytes(text) = field {
            let text = std::str::from_utf8(text).map_err(|e| e.to_string())?;
            out.insert(name.into(), json!(text));
        }
    }
    Ok(json!({"spec": {"resourceAttributes": out}}))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes kubectl 1.32 sends for `kubectl auth can-i create clusters`.
    fn can_i_create_clusters() -> Vec<u8> {
        fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
            let mut out = vec![number << 3 | 2, u8::try_from(bytes.len()).unwrap()];
            out.extend_from_slice(bytes);
            out
        }
        let attributes = [
            field(2, b"create"),
            field(3, b"management.drover.io"),
            field(5, b"clusters"),
        ]
        .concat();
        let review = [
            field(1, b""),
            field(2, &field(1, &attributes)),
            field(3, b""),
        ]
        .concat();
        let type_meta = [
            field(1, b"authorization.k8s.io/v1"),
            field(2, b"SelfSubjectAccessReview"),
        ]
        .concat();
        let unknown = [
            field(1, &type_meta),
            field(2, &review),
            field(3, b""),
            field(4, b""),
        ]
        .concat();
        [b"k8s\0".as_slice(), &unknown].concat()
    }

    #[test]
    fn a_protobuf_review_reads_as_its_json() {
        assert_eq!(
            from_protobuf(&can_i_create_clusters()).unwrap(),
            json!({"spec": {"resourceAttributes": {
                "verb": "create", "group": "management.drover.io", "resource": "clusters",
            }}})
        );
        assert!(from_protobuf(b"{}").is_err());
        assert!(from_protobuf(b"k8s\0\x12\x7f").is_err(), "cut short");
    }
}
