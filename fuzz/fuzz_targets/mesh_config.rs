//! Fuzz target: `istiod::fuzzing::mesh_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| istiod::fuzzing::mesh_config(data));
