//! Fuzz target: `pilot_agent::fuzzing::iptables_flags`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pilot_agent::fuzzing::iptables_flags(data));
