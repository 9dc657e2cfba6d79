//! A Plan object's spec as the hub's API receives it (JSON): the spec checks and the parse into
//! the protocol's plan, which must then pass through protobuf unchanged.
#![no_main]

use hub::model::Kind;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(spec) = Kind::Plan.validate_spec(&value) {
        let plan = hub::model::parse_plan(&spec["plan"]).expect("a validated plan parses");
        let again = proto::plan::v1::Plan::decode(plan.encode_to_vec().as_slice())
            .expect("a plan we encoded decodes");
        assert_eq!(again, plan);
    }
    let _ = hub::model::parse_plan(&value);
});
