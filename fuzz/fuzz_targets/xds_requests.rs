//! Fuzz target: `istiod::fuzzing::xds_requests`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| istiod::fuzzing::xds_requests(data));
