//! The header at the start of every tunnel stream, as either side decodes it: any bytes give
//! a header or an error, and a decoded header encodes back to bytes that decode the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message as _;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = tunnel::decode_header(data) {
        let again = tunnel::decode_header(&header.encode_length_delimited_to_vec())
            .expect("a header we encoded decodes");
        assert_eq!(again, header);
    }
});
