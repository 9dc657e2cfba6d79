//! Kubernetes protobuf bodies, read and written through Kubernetes' own schema.
//!
//! kubectl's typed clients (`kubectl create namespace|configmap|secret|deployment`, `auth can-i`,
//! `drain`) send built-in kinds as `application/vnd.kubernetes.protobuf` and prefer it in answers.
//! The simulator keeps objects as JSON, so a body is turned into the JSON object it stands for
//! (as kube-apiserver's JSON encoding would show it) and an answer back, field by field, from the
//! descriptors `build.rs` compiles out of the vendored `generated.proto` files. Only the few
//! types whose JSON is not their message (times, quantities, int-or-string, embedded JSON) are
//! named here.

use std::sync::LazyLock;

use base64::{Engine as _, engine::general_purpose::STANDARD};
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor,
    ReflectMessage, Value as Field,
};
use serde_json::{Map, Value};
use time::{OffsetDateTime, format_description::well_known::Rfc3339};

/// The media type of Kubernetes protobuf, in `Content-Type` and `Accept`.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// Every protobuf body starts with these four bytes, then a `runtime.Unknown`.
const MAGIC: &[u8] = b"k8s\0";

const META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";
const UNKNOWN: &str = "k8s.io.apimachinery.pkg.runtime.Unknown";

static SCHEMA: LazyLock<Result<DescriptorPool, String>> = LazyLock::new(|| {
    DescriptorPool::decode(include_bytes!(concat!(env!("OUT_DIR"), "/kubernetes.bin")).as_slice())
        .map_err(|e| format!("the Kubernetes protobuf schema did not load: {e}"))
});

fn schema() -> Result<&'static DescriptorPool, String> {
    SCHEMA.as_ref().map_err(Clone::clone)
}

/// The message that carries `kind` of `apiVersion`: `apps/v1` `Deployment` is
/// `k8s.io.api.apps.v1.Deployment`, the core group's package is `core`, and a `Status` is
/// meta's wherever it is answered.
fn message_for(api_version: &str, kind: &str) -> Option<MessageDescriptor> {
    let pool = schema().ok()?;
    if kind == "Status" {
        return pool.get_message_by_name(&format!("{META}.Status"));
    }
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let package = group
        .split('.')
        .next()
        .filter(|g| !g.is_empty())
        .unwrap_or("core");
    pool.get_message_by_name(&format!("k8s.io.api.{package}.{version}.{kind}"))
}

/// Reads a protobuf request body into the JSON object it stands for, `apiVersion` and `kind`
/// included (they travel in the envelope, not the message).
pub(crate) fn decode(body: &[u8]) -> Result<Value, String> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or("a Kubernetes protobuf body starts with the bytes k8s\\0")?;
    let unknown = schema()?
        .get_message_by_name(UNKNOWN)
        .ok_or("the schema has no runtime.Unknown")?;
    let unknown = DynamicMessage::decode(unknown, envelope)
        .map_err(|e| format!("the protobuf envelope does not decode: {e}"))?;
    let text = |name: &str| {
        unknown
            .get_field_by_name("typeMeta")
            .and_then(|meta| match meta.as_ref() {
                Field::Message(meta) => meta
                    .get_field_by_name(name)
                    .and_then(|v| v.as_str().map(str::to_owned)),
                _ => None,
            })
            .unwrap_or_default()
    };
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    let Some(descriptor) = message_for(&api_version, &kind) else {
        return Err(format!(
            "no protobuf schema for {kind} of {api_version:?}: send it as JSON or YAML"
        ));
    };
    let raw = unknown
        .get_field_by_name("raw")
        .and_then(|raw| raw.as_bytes().cloned())
        .unwrap_or_default();
    let message = DynamicMessage::decode(descriptor, raw)
        .map_err(|e| format!("the {kind} in the body does not decode: {e}"))?;
    let mut object = to_json(&message);
    if let Value::Object(fields) = &mut object {
        fields.insert("apiVersion".into(), Value::String(api_version));
        fields.insert("kind".into(), Value::String(kind));
    }
    Ok(object)
}

/// Writes a JSON object as kube-apiserver answers it in protobuf, or `None` when the schema has
/// no message for its kind (the caller answers JSON, which every client also accepts).
pub(crate) fn encode(object: &Value) -> Option<Result<Vec<u8>, String>> {
    let api_version = object.get("apiVersion")?.as_str()?;
    let kind = object.get("kind")?.as_str()?;
    let descriptor = message_for(api_version, kind)?;
    Some(encode_as(descriptor, object, api_version, kind))
}

fn encode_as(
    descriptor: MessageDescriptor,
    object: &Value,
    api_version: &str,
    kind: &str,
) -> Result<Vec<u8>, String> {
    use prost::Message as _;
    let message = from_json(&descriptor, object)?;
    let envelope = serde_json::json!({
        "typeMeta": {"apiVersion": api_version, "kind": kind},
    });
    let unknown = schema()?
        .get_message_by_name(UNKNOWN)
        .ok_or("the schema has no runtime.Unknown")?;
    let mut unknown = from_json(&unknown, &envelope)?;
    unknown.set_field_by_name("raw", Field::Bytes(message.encode_to_vec().into()));
    Ok([MAGIC, unknown.encode_to_vec().as_slice()].concat())
}

/// Whether a client asked for protobuf first (`Accept: application/vnd.kubernetes.protobuf,
/// application/json`), as kubectl's typed clients do; a watch stream stays JSON.
pub(crate) fn preferred(accept: Option<&str>) -> bool {
    accept
        .and_then(|a| a.split(',').next())
        .is_some_and(|first| {
            let mut parts = first.split(';').map(str::trim);
            parts.next() == Some(MEDIA_TYPE) && parts.all(|p| !p.starts_with("stream="))
        })
}

// --- protobuf to JSON ---

fn to_json(message: &DynamicMessage) -> Value {
    let descriptor = message.descriptor();
    let name = descriptor.full_name();
    let field = |n: &str| message.get_field_by_name(n).map(|v| v.into_owned());
    match special(name) {
        Some(Special::Time { micro }) => {
            let seconds = field("seconds").and_then(|v| v.as_i64()).unwrap_or(0);
            let nanos = field("nanos").and_then(|v| v.as_i32()).unwrap_or(0);
            if seconds == 0 && nanos == 0 {
                // Go's zero time, which its JSON writes as null.
                return Value::Null;
            }
            time_text(seconds, nanos, micro).map_or(Value::Null, Value::String)
        }
        Some(Special::Quantity) => field("string")
            .and_then(|v| v.as_str().map(|s| Value::String(s.to_owned())))
            .unwrap_or(Value::Null),
        Some(Special::IntOrString) => {
            if field("type").and_then(|v| v.as_i64()) == Some(1) {
                Value::String(
                    field("strVal")
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                )
            } else {
                Value::from(field("intVal").and_then(|v| v.as_i32()).unwrap_or(0))
            }
        }
        Some(Special::Raw(field_name)) => field(field_name)
            .and_then(|v| v.as_bytes().and_then(|b| serde_json::from_slice(b).ok()))
            .unwrap_or(Value::Null),
        Some(Special::Items) => field("items")
            .map(|v| value_json(&v))
            .unwrap_or(Value::Array(Vec::new())),
        None => {
            let mut object = Map::new();
            for (field, value) in message.fields() {
                let json = value_json(value);
                if inlined(&field) {
                    if let Value::Object(inner) = json {
                        object.extend(inner);
                    }
                    continue;
                }
                // Go's generated code writes every non-pointer field, empty or not; its JSON
                // leaves the empty strings and zero times out.
                if json.is_null() || json.as_str() == Some("") {
                    continue;
                }
                object.insert(field.name().to_owned(), json);
            }
            Value::Object(object)
        }
    }
}

fn value_json(value: &Field) -> Value {
    match value {
        Field::Bool(b) => Value::Bool(*b),
        Field::I32(n) => Value::from(*n),
        Field::I64(n) => Value::from(*n),
        Field::U32(n) => Value::from(*n),
        Field::U64(n) => Value::from(*n),
        Field::F32(n) => Value::from(f64::from(*n)),
        Field::F64(n) => Value::from(*n),
        Field::String(s) => Value::String(s.clone()),
        Field::Bytes(b) => Value::String(STANDARD.encode(b)),
        Field::EnumNumber(n) => Value::from(*n),
        Field::Message(m) => to_json(m),
        Field::List(items) => Value::Array(items.iter().map(value_json).collect()),
        Field::Map(entries) => Value::Object(
            entries
                .iter()
                .map(|(key, value)| (map_key_text(key), value_json(value)))
                .collect(),
        ),
    }
}

fn map_key_text(key: &MapKey) -> String {
    match key {
        MapKey::String(s) => s.clone(),
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
    }
}

/// `metav1.Time` is RFC 3339 to the second, `MicroTime` to the microsecond, both in UTC.
fn time_text(seconds: i64, nanos: i32, micro: bool) -> Option<String> {
    let at = OffsetDateTime::from_unix_timestamp(seconds).ok()?;
    let whole = at
        .format(time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second]"
        ))
        .ok()?;
    Some(if micro {
        format!("{whole}.{:06}Z", nanos / 1000)
    } else {
        format!("{whole}Z")
    })
}

// --- JSON to protobuf ---

fn from_json(descriptor: &MessageDescriptor, value: &Value) -> Result<DynamicMessage, String> {
    let mut message = DynamicMessage::new(descriptor.clone());
    match special(descriptor.full_name()) {
        Some(Special::Time { .. }) => {
            let text = value.as_str().ok_or("a time is an RFC 3339 string")?;
            let at = OffsetDateTime::parse(text, &Rfc3339)
                .map_err(|e| format!("{text:?} is not an RFC 3339 time: {e}"))?;
            message.set_field_by_name("seconds", Field::I64(at.unix_timestamp()));
            message.set_field_by_name(
                "nanos",
                Field::I32(i32::try_from(at.nanosecond()).unwrap_or(0)),
            );
        }
        Some(Special::Quantity) => {
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return Err(format!("a quantity is a string or a number, not {value}")),
            };
            message.set_field_by_name("string", Field::String(text));
        }
        Some(Special::IntOrString) => match value {
            Value::String(s) => {
                message.set_field_by_name("type", Field::I64(1));
                message.set_field_by_name("strVal", Field::String(s.clone()));
            }
            Value::Number(n) => {
                let n = n.as_i64().and_then(|n| i32::try_from(n).ok());
                message.set_field_by_name("type", Field::I64(0));
                message.set_field_by_name(
                    "intVal",
                    Field::I32(n.ok_or("an int-or-string's number is a 32-bit integer")?),
                );
            }
            _ => {
                return Err(format!(
                    "an int-or-string is a number or a string, not {value}"
                ));
            }
        },
        Some(Special::Raw(field_name)) => {
            message.set_field_by_name(
                field_name,
                Field::Bytes(value.to_string().into_bytes().into()),
            );
        }
        Some(Special::Items) => {
            let items = descriptor
                .get_field_by_name("items")
                .ok_or("a list wrapper without items")?;
            message.set_field_by_name("items", field_from_json(&items, value)?);
        }
        None => {
            let Value::Object(fields) = value else {
                return Err(format!("{} is an object, not {value}", descriptor.name()));
            };
            let inline: Vec<FieldDescriptor> = descriptor.fields().filter(inlined).collect();
            let mut inner: Vec<Map<String, Value>> = vec![Map::new(); inline.len()];
            for (name, value) in fields {
                if value.is_null() {
                    continue;
                }
                let field = match descriptor.get_field_by_name(name) {
                    Some(field) => field,
                    None => {
                        // A field of an embedded struct, written at this level in JSON.
                        let holder = inline.iter().position(|f| {
                            matches!(f.kind(), Kind::Message(m) if m.get_field_by_name(name).is_some())
                        });
                        if let Some(i) = holder {
                            inner[i].insert(name.clone(), value.clone());
                        }
                        // apiVersion and kind travel in the envelope; a field the schema does
                        // not know is dropped, as kube-apiserver's decoder drops it.
                        continue;
                    }
                };
                let converted = field_from_json(&field, value)
                    .map_err(|e| format!("{}.{name}: {e}", descriptor.name()))?;
                set(&mut message, &field, converted)?;
            }
            for (field, inner) in inline.iter().zip(inner) {
                if !inner.is_empty() {
                    let converted = field_from_json(field, &Value::Object(inner))?;
                    set(&mut message, field, converted)?;
                }
            }
        }
    }
    Ok(message)
}

fn set(message: &mut DynamicMessage, field: &FieldDescriptor, value: Field) -> Result<(), String> {
    message
        .try_set_field(field, value)
        .map_err(|e| format!("{}: {e}", field.name()))
}

/// Go's embedded structs (`json:""`), whose fields JSON writes into the struct that holds
/// them: in the vendored groups, the ones core/v1's types.go embeds. A group added to the
/// schema needs its types.go checked for more.
fn inlined(field: &FieldDescriptor) -> bool {
    match field.name() {
        "volumeSource"
        | "persistentVolumeSource"
        | "localObjectReference"
        | "ephemeralContainerCommon" => true,
        "handler" => field.parent_message().full_name() == "k8s.io.api.core.v1.Probe",
        _ => false,
    }
}

fn field_from_json(field: &FieldDescriptor, value: &Value) -> Result<Field, String> {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return Err("a map without an entry type".into());
        };
        let Value::Object(entries) = value else {
            return Err(format!("expected an object, not {value}"));
        };
        let value_kind = entry.map_entry_value_field().kind();
        return entries
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| Ok((MapKey::String(k.clone()), scalar(&value_kind, v)?)))
            .collect::<Result<_, String>>()
            .map(Field::Map);
    }
    if field.is_list() {
        let Value::Array(items) = value else {
            return Err(format!("expected a list, not {value}"));
        };
        let kind = field.kind();
        return items
            .iter()
            .map(|item| scalar(&kind, item))
            .collect::<Result<_, String>>()
            .map(Field::List);
    }
    scalar(&field.kind(), value)
}

fn scalar(kind: &Kind, value: &Value) -> Result<Field, String> {
    let wrong = || format!("expected {kind:?}, not {value}");
    let int = || value.as_i64().ok_or_else(wrong);
    Ok(match kind {
        Kind::Bool => Field::Bool(value.as_bool().ok_or_else(wrong)?),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            Field::I32(i32::try_from(int()?).map_err(|_| wrong())?)
        }
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Field::I64(int()?),
        Kind::Uint32 | Kind::Fixed32 => Field::U32(u32::try_from(int()?).map_err(|_| wrong())?),
        Kind::Uint64 | Kind::Fixed64 => Field::U64(value.as_u64().ok_or_else(wrong)?),
        Kind::Float => Field::F32(value.as_f64().ok_or_else(wrong)? as f32),
        Kind::Double => Field::F64(value.as_f64().ok_or_else(wrong)?),
        Kind::String => Field::String(value.as_str().ok_or_else(wrong)?.to_owned()),
        Kind::Bytes => {
            let text = value.as_str().ok_or_else(wrong)?;
            let bytes = STANDARD
                .decode(text)
                .map_err(|e| format!("{text:?} is not base64: {e}"))?;
            Field::Bytes(bytes.into())
        }
        Kind::Enum(_) => Field::EnumNumber(i32::try_from(int()?).map_err(|_| wrong())?),
        Kind::Message(descriptor) => Field::Message(from_json(descriptor, value)?),
    })
}

/// The messages whose JSON is not an object of their fields.
enum Special {
    /// `metav1.Time` and `MicroTime`: an RFC 3339 string.
    Time { micro: bool },
    /// `resource.Quantity`: its text, such as `"100m"`.
    Quantity,
    /// `intstr.IntOrString`: a bare number or string.
    IntOrString,
    /// `runtime.RawExtension` and `metav1.FieldsV1`: JSON carried as bytes in this field.
    Raw(&'static str),
    /// `metav1.Verbs` and the `ExtraValue`s: a bare list of strings.
    Items,
}

fn special(full_name: &str) -> Option<Special> {
    Some(match full_name {
        "k8s.io.apimachinery.pkg.apis.meta.v1.Time" => Special::Time { micro: false },
        "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime" => Special::Time { micro: true },
        "k8s.io.apimachinery.pkg.api.resource.Quantity" => Special::Quantity,
        "k8s.io.apimachinery.pkg.util.intstr.IntOrString" => Special::IntOrString,
        "k8s.io.apimachinery.pkg.runtime.RawExtension" => Special::Raw("raw"),
        "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1" => Special::Raw("Raw"),
        "k8s.io.apimachinery.pkg.apis.meta.v1.Verbs" => Special::Items,
        name if name.ends_with(".ExtraValue") => Special::Items,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
