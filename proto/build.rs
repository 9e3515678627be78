//! Compiles Istio's protos with `protox` (a pure-Rust protobuf compiler), so no
//! system `protoc` is needed, and shares the well-known types with `envoy-types`.
//!
//! Also compiles Envoy's own `.proto` files (shipped in the `envoy-types`
//! crate) into one descriptor set, so EnvoyFilter patches written in
//! proto-JSON can be read by type name at run time (`envoy_json`).

use std::path::{Path, PathBuf};

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
    envoy_descriptors()?;
    Ok(())
}

/// The top-level Envoy protos EnvoyFilter patches can name; every
/// `envoy/extensions/**/v3/*.proto` (filters, access loggers, tracers,
/// transport sockets, ...) is added to these.
const ENVOY_ROOTS: &[&str] = &[
    "envoy/config/bootstrap/v3/bootstrap.proto",
    "envoy/config/listener/v3/listener.proto",
    "envoy/config/cluster/v3/cluster.proto",
    "envoy/config/route/v3/route.proto",
    "envoy/config/endpoint/v3/endpoint.proto",
    "envoy/config/core/v3/base.proto",
];

/// Writes `envoy_descriptors.bin` (a `FileDescriptorSet`) into `OUT_DIR`.
fn envoy_descriptors() -> Result<(), Box<dyn std::error::Error>> {
    let root = envoy_types_dir()?.join("proto");
    let includes: Vec<PathBuf> = [
        "data-plane-api",
        "xds",
        "protoc-gen-validate",
        "googleapis",
        "cel-spec/proto",
        "opentelemetry-proto",
        "client_model",
        "ratelimit",
    ]
    .iter()
    .map(|d| root.join(d))
    .collect();
    let api = root.join("data-plane-api");
    let mut files: Vec<String> = ENVOY_ROOTS.iter().map(|s| s.to_string()).collect();
    let mut extensions = Vec::new();
    proto_files(&api.join("envoy/extensions"), &mut extensions)?;
    for path in extensions {
        let rel = path
            .strip_prefix(&api)?
            .to_string_lossy()
            .replace('\\', "/");
        // Stable v3 only (v3alpha packages come and go between releases).
        if rel.contains("/v3/") {
            files.push(rel);
        }
    }
    files.sort();
    files.dedup();
    // Two packages (`envoy.extensions.config`, `envoy.extensions.clusters.common`)
    // shadow the relative names other files use (`config.core.v3...`), so
    // they and their importers are compiled apart, and the sets joined.
    let (apart, main): (Vec<String>, Vec<String>) =
        files.into_iter().partition(|f| compiled_apart(&api, f));
    let mut fds = compile_leaving_out(main, &api, &includes)?;
    let mut known: std::collections::HashSet<String> =
        fds.file.iter().map(|f| f.name().to_string()).collect();
    for file in apart {
        let other = compile_leaving_out(vec![file], &api, &includes)?;
        for f in other.file {
            if known.insert(f.name().to_string()) {
                fds.file.push(f);
            }
        }
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("envoy_descriptors.bin");
    std::fs::write(out, prost::Message::encode_to_vec(&fds))?;
    Ok(())
}

/// Compiles `files`, leaving out (and naming in the build output) those of
/// this envoy-types release that do not resolve under protox's rules (the
/// dynamic forward proxy cluster's relative `common.` names).
fn compile_leaving_out(
    mut files: Vec<String>,
    api: &Path,
    includes: &[PathBuf],
) -> Result<protox::prost_reflect::prost_types::FileDescriptorSet, Box<dyn std::error::Error>> {
    for _ in 0..64 {
        match protox::compile(&files, includes) {
            Ok(fds) => return Ok(fds),
            Err(e) => {
                let file = e.file().unwrap_or_default().to_string();
                let import = format!("import \"{file}\"");
                // The file itself, or the files asked for that import it.
                let before = files.len();
                files.retain(|f| {
                    ENVOY_ROOTS.contains(&f.as_str())
                        || (*f != file
                            && !std::fs::read_to_string(api.join(f))
                                .is_ok_and(|t| t.contains(&import)))
                });
                if files.len() == before {
                    return Err(e.into());
                }
                println!("EnvoyFilter descriptors leave out {file} (and its importers): {e}");
            }
        }
    }
    Err("too many Envoy protos do not compile".into())
}

/// The packages that shadow others' relative names, by folder.
const SHADOWING: &[&str] = &[
    "envoy/extensions/config/",
    "envoy/extensions/clusters/common/",
];

/// Whether `file` defines or imports a shadowing package, or names a type
/// relative to `envoy.extensions.common` (which `filters.common` and
/// `clusters.common` shadow when compiled together): such files are
/// compiled one by one, with their own imports only, as protoc sees them.
fn compiled_apart(api: &Path, file: &str) -> bool {
    SHADOWING.iter().any(|p| file.starts_with(p))
        || std::fs::read_to_string(api.join(file)).is_ok_and(|text| {
            SHADOWING
                .iter()
                .any(|p| text.contains(&format!("import \"{p}")))
                || text.lines().any(|l| {
                    let l = l.trim_start();
                    let l = l.strip_prefix("repeated ").unwrap_or(l);
                    l.starts_with("common.")
                })
        })
}

fn proto_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            proto_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

/// Where cargo unpacked the `envoy-types` crate (its `.proto` files are
/// not exported any other way): asked of `cargo metadata`, offline.
fn envoy_types_dir() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("Cargo.toml");
    let output = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        // Only this platform's packages: others may not be downloaded.
        .arg("--filter-platform")
        .arg(std::env::var("TARGET")?)
        .arg("--manifest-path")
        .arg(&manifest)
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let meta: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let manifest_path = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("envoy-types is not among the packages cargo metadata lists")?;
    let dir = Path::new(manifest_path)
        .parent()
        .ok_or("envoy-types' manifest has no directory")?;
    println!("cargo:rerun-if-changed={}", dir.join("proto").display());
    Ok(dir.to_path_buf())
}
