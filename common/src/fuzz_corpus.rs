//! The fuzz targets' corpora on stable: every file of
//! `fuzz/corpus/<target>/` (seeds, and inputs that once crashed) run
//! through the function the target calls, as the crates' `fuzz_corpus`
//! tests do. A panic names the file.

use std::path::{Path, PathBuf};

/// Runs every file of `<workspace>/fuzz/corpus/<target>` through `f`
/// (`crate_dir` is the calling crate's manifest directory); panics naming
/// each file that panicked, or when the corpus is empty.
pub fn run(crate_dir: &str, target: &str, f: fn(&[u8])) {
    let dir = Path::new(crate_dir).join("../fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} has no seeds", dir.display());
    let mut panicked = Vec::new();
    for file in files {
        let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if std::panic::catch_unwind(|| f(&data)).is_err() {
            panicked.push(file.display().to_string());
        }
    }
    assert!(panicked.is_empty(), "panicked on {panicked:?}");
}

/// The bytes of one corpus file.
pub fn seed(crate_dir: &str, target: &str, name: &str) -> Vec<u8> {
    let path = Path::new(crate_dir)
        .join("../fuzz/corpus")
        .join(target)
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
