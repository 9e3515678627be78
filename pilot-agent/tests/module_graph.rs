//! pilot-agent's top-level modules depend on each other one way: the config
//! feeds identity and the bootstrap, those feed Envoy and the servers, and
//! `app` wires them. The status server sits on top of the parts it reports
//! on: no part below it (the lifecycle, DNS, SDS, the xDS proxy, the secret
//! manager, Envoy's supervisor, the bootstrap) depends on it, so each can be
//! used and tested without HTTP. A reference that breaks this fails here,
//! naming the line.

use common::module_graph::{FileGraph, ModuleGraph};

fn graph() -> ModuleGraph {
    ModuleGraph::read_crate(
        env!("CARGO_MANIFEST_DIR"),
        &["app", "config", "status", "lifecycle", "xds_proxy", "sds"],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn top_level_modules_have_no_cycle() {
    if let Err(e) = graph().check_acyclic() {
        panic!("{e}");
    }
}

#[test]
fn only_app_depends_on_the_status_server() {
    let graph = graph();
    let below: Vec<&str> = graph
        .modules()
        // `fuzzing` is an entry point like `main`: the fuzz targets drive
        // the status server's inputs through it.
        .filter(|m| !matches!(*m, "app" | "status" | "main" | "fuzzing"))
        .collect();
    assert!(below.contains(&"lifecycle") && below.contains(&"dns"));
    for top in ["status", "app"] {
        if let Err(e) = graph.check_not_referenced_by(top, &below) {
            panic!("{e}");
        }
    }
}

#[test]
fn the_lifecycle_depends_on_no_other_part() {
    let graph = graph();
    let refs = graph.references("lifecycle");
    assert!(refs.is_empty(), "lifecycle references {refs:?}");
}

/// Inside every folder, files reference each other one way: when two files
/// need each other, the part both need is a file below them.
#[test]
fn no_file_level_circles() {
    let files = FileGraph::read_crate(env!("CARGO_MANIFEST_DIR")).unwrap_or_else(|e| panic!("{e}"));
    if let Err(e) = files.check_no_file_circles(&[]) {
        panic!("{e}");
    }
}
