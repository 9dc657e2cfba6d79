//! A plan as the system-agent receives it (protobuf), then the agent's checks that run before
//! anything is touched, and the checksum both ends compute.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message as _;

fuzz_target!(|data: &[u8]| {
    if let Ok(plan) = proto::plan::v1::Plan::decode(data) {
        let _ = system_agent::applier::check_plan(&plan);
        let checksum = proto::plan::v1::checksum(&plan);
        // The encoding is canonical: what decodes re-encodes to the same checksum.
        let again = proto::plan::v1::Plan::decode(plan.encode_to_vec().as_slice())
            .expect("a plan we encoded decodes");
        assert_eq!(proto::plan::v1::checksum(&again), checksum);
    }
});
