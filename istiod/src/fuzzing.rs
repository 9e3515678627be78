//! The input boundaries the fuzz targets (`fuzz/`) drive, one function
//! each; the corpus regression test (`tests/fuzz_corpus.rs`) runs every
//! corpus file through the same functions on stable.

mod ca;
mod xds;

pub use ca::{ca_csr, ca_csr_issued};
pub use xds::{xds_requests, xds_response, xds_seed};

/// The config decoder and validator: a file's bytes as `--configDir` or
/// the validation webhook reads them, every kind (YAML or JSON, many
/// documents). Must never panic, whatever the input.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = crate::model::parse::parse_file("fuzz.yaml", text);
}

/// Mesh config (`--meshConfig`, the `istio` ConfigMap's `mesh` key): parsed
/// and validated, then handed to the telemetry and outbound settings that
/// read it. Must never panic.
pub fn mesh_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(mesh) = crate::mesh::Mesh::parse(text) {
        xds::listeners_under(mesh.config);
    }
}
