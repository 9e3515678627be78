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

fn run(target: &str, f: fn(&[u8])) {
    for file in corpus(target) {
        let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let run = std::panic::catch_unwind(|| f(&data));
        assert!(run.is_ok(), "{} panicked", file.display());
    }
}

#[test]
fn dns_corpus_is_handled_without_panicking() {
    run("dns_message", pilot_agent::fuzzing::dns_message);
}

#[test]
fn iptables_corpus_is_parsed_without_panicking() {
    run("iptables_flags", pilot_agent::fuzzing::iptables_flags);
}

#[test]
fn the_dns_target_reaches_the_answering_code() {
    // A known name is answered here, an unknown one left to the upstream,
    // a malformed message answered with an error.
    let seed = |name: &str| {
        std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../fuzz/corpus/dns_message")
                .join(name),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let known = pilot_agent::fuzzing::dns_answer(&seed("a-httpbin-short"));
    assert!(known.is_some_and(|r| r.windows(4).any(|w| w == [10, 96, 0, 10])));
    assert!(pilot_agent::fuzzing::dns_answer(&seed("a-unknown")).is_none());
    assert!(pilot_agent::fuzzing::dns_answer(&seed("truncated-header")).is_some());
}
