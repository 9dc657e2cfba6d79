//! Request bodies as the hub's API receives them for create and update, for every kind: the
//! checks that run before the store is touched (body, name, metadata, spec).
#![no_main]

use hub::model::Kind;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the kind, the rest is the body.
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let kind = Kind::ALL[usize::from(pick) % Kind::ALL.len()];
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return;
    };
    let name = value
        .pointer("/metadata/name")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("fuzzed");
    if let Ok((_, spec)) = hub::api::check_body(kind, &value, name) {
        let _ = kind.validate_spec(&spec);
    }
});
