//! Fuzz target: `istiod::fuzzing::config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| istiod::fuzzing::config(data));
