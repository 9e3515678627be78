//! Fuzz target: `pilot_agent::fuzzing::proxy_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pilot_agent::fuzzing::proxy_config(data));
