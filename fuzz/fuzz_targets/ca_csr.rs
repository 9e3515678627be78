//! Fuzz target: `istiod::fuzzing::ca_csr`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| istiod::fuzzing::ca_csr(data));
