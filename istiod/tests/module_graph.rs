//! istiod's top-level modules depend on each other one way: data flows from
//! the sources to the store, the push context, the generators and the
//! streams, and `config` (the flags and environment) and `app` (the wiring)
//! sit on top of every part. The push context (`pushctx`) is a floor of its
//! own between the model and xDS: the generators and the ADS transport read
//! it, and it reads neither them nor the debouncer (`push`) that builds it.
//! A module that reaches back up closes a cycle or breaks a floor and fails
//! here, naming the line that does it.

use common::module_graph::{FileGraph, ModuleGraph};

fn graph() -> ModuleGraph {
    ModuleGraph::read_crate(
        env!("CARGO_MANIFEST_DIR"),
        &[
            "app",
            "config",
            "model",
            "source",
            "push",
            "pushctx",
            "xds",
            "ca",
            "autoregistration",
        ],
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
fn nothing_below_config_and_app_depends_on_them() {
    let graph = graph();
    let below: Vec<&str> = graph
        .modules()
        .filter(|m| !matches!(*m, "app" | "config"))
        .collect();
    for top in ["config", "app"] {
        if let Err(e) = graph.check_not_referenced_by(top, &below) {
            panic!("{e}");
        }
    }
    if let Err(e) = graph.check_not_referenced_by("app", &["config"]) {
        panic!("{e}");
    }
}

#[test]
fn the_push_context_is_below_xds_and_push() {
    let graph = graph();
    for top in ["xds", "push"] {
        if let Err(e) = graph.check_not_referenced_by(top, &["pushctx", "model", "source"]) {
            panic!("{e}");
        }
    }
    if let Err(e) = graph.check_not_referenced_by("pushctx", &["model", "source"]) {
        panic!("{e}");
    }
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
