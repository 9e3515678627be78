//! Fuzz target: `pilot_agent::fuzzing::dns_message`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pilot_agent::fuzzing::dns_message(data));
