//! Any bytes, as a sequence of events for the coordinator (`server::coordinator::drive`):
//! joins and resumes, gradients straight to it, worker frames through the session's decode and
//! checks, leaves, unread outboxes, time passing, rejected sessions, in every mode and with
//! `--replicate 2`. After every event the model must be finite and every accepted gradient
//! counted in exactly one round; any panic is a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (mode, ops) = server::coordinator::drive::from_bytes(data);
    server::coordinator::drive::run(mode, &ops);
});
