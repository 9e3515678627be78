//! Fuzz target: `pilot_agent::fuzzing::app_probers`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pilot_agent::fuzzing::app_probers(data));
