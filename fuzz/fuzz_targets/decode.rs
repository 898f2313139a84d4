//! Any bytes, as a frame from a worker or from the coordinator: decoding never panics (the
//! decoder checks every length before it allocates), and whatever decodes re-encodes into a
//! frame that decodes again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::{
    decode_from_coordinator, decode_from_worker, encode_from_coordinator, encode_from_worker,
};

fuzz_target!(|frame: &[u8]| {
    if let Ok(msg) = decode_from_worker(frame) {
        let again = encode_from_worker(&msg);
        decode_from_worker(&again).expect("what the codec encodes, it decodes");
    }
    if let Ok(msg) = decode_from_coordinator(frame) {
        let again = encode_from_coordinator(&msg);
        decode_from_coordinator(&again).expect("what the codec encodes, it decodes");
    }
});
