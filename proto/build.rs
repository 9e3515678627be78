//! Compiles Istio's protos with `protox` (a pure-Rust protobuf compiler), so no
//! system `protoc` is needed, and shares the well-known types with `envoy-types`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/istio/v1/auth/ca.proto",
        "proto/istio/networking/nds/v1/nds.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_well_known_types(true)
        // Maps encode in key order, so the same name table is the same
        // bytes (the XDS cache and delta versions compare bytes).
        .btree_map(".")
        .extern_path(".google.protobuf", "::envoy_types::pb::google::protobuf")
        .compile_fds(fds)?;
    Ok(())
}
