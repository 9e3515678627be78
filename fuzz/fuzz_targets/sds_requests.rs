//! Fuzz target: `pilot_agent::fuzzing::sds_requests`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pilot_agent::fuzzing::sds_requests(data));
