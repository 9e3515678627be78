//! What the validation tests share: the errors a spec gets, as
//! `field: message` strings, and the assertion that one of them names a field.

use crate::model::parse_file;

/// The errors of the object `header` (apiVersion, kind, metadata) with
/// `spec: <spec>`, read as file `file`, as `field: message` strings.
pub(super) fn errors(file: &str, header: &str, spec: &str) -> Vec<String> {
    match parse_file(file, &format!("{header}spec: {spec}\n")) {
        Ok(_) => Vec::new(),
        Err(errors) => errors
            .iter()
            .map(|e| format!("{}: {e}", e.field().unwrap_or("")))
            .collect(),
    }
}

/// Asserts that one of `errs` is about `field` and contains `needle`.
#[track_caller]
pub(super) fn refused(errs: &[String], field: &str, needle: &str) {
    assert!(
        errs.iter()
            .any(|e| e.starts_with(&format!("{field}: ")) && e.contains(needle)),
        "expected {field}: ...{needle}...; got {errs:#?}"
    );
}
