//! The input boundaries the fuzz targets (`fuzz/`) drive, one function
//! each; the corpus regression test (`tests/fuzz_corpus.rs`) runs every
//! corpus file through the same functions on stable.

/// The config decoder and validator: a file's bytes as `--configDir` or
/// the validation webhook reads them, every kind (YAML or JSON, many
/// documents). Must never panic, whatever the input.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = crate::model::parse::parse_file("fuzz.yaml", text);
}
