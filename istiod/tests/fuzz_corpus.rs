//! The fuzz targets' corpora on stable: every file of
//! `fuzz/corpus/<target>/` (seeds, and inputs that once crashed) through the
//! function the target calls. A panic fails the test, naming the file.

use std::path::{Path, PathBuf};

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} has no seeds", dir.display());
    files
}

#[test]
fn config_corpus_decodes_without_panicking() {
    for file in corpus("config") {
        let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let run = std::panic::catch_unwind(|| istiod::fuzzing::config(&data));
        assert!(run.is_ok(), "{} panicked", file.display());
    }
}
