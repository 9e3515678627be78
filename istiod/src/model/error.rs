//! Why a config file, or an object in it, was rejected. Every error names the
//! file, the object (`Kind/namespace/name`) and the field path (for example
//! `spec.http[0].route[1].weight`), and says what to do.

use std::fmt;

use super::meta::ObjectKey;

/// A problem with one field of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field path, e.g. `spec.http[0].route[1].weight` (`.` for the whole object).
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl FieldError {
    /// Builds a field error.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Why a config file (or part of it) was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read the file: {reason} (check that it exists and is readable)")]
    Read {
        /// The file.
        file: String,
        /// The I/O error.
        reason: String,
    },
    /// A document is not valid YAML.
    #[error(
        "{file}: document {document}: invalid YAML: {reason} (fix the syntax; documents are separated by lines of ---)"
    )]
    Yaml {
        /// The file.
        file: String,
        /// The document's position in the file, from 1.
        document: usize,
        /// The parser's message.
        reason: String,
    },
    /// A document is not a Kubernetes-style object.
    #[error("{file}: document {document}: {reason}")]
    Document {
        /// The file.
        file: String,
        /// The document's position in the file, from 1.
        document: usize,
        /// What is missing and what to do.
        reason: String,
    },
    /// An object has an invalid field.
    #[error("{file}: {object}: {field}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// The object.
        object: ObjectKey,
        /// The field path.
        field: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// An object is defined in two files; the first file (in path order) wins.
    #[error(
        "{file}: {object} is already defined in {first}; this definition is ignored (keep only one of them)"
    )]
    Duplicate {
        /// The file whose definition is ignored.
        file: String,
        /// The object.
        object: ObjectKey,
        /// The file whose definition is used.
        first: String,
    },
}

impl ConfigError {
    /// The file the error is about.
    pub fn file(&self) -> &str {
        match self {
            ConfigError::Read { file, .. }
            | ConfigError::Yaml { file, .. }
            | ConfigError::Document { file, .. }
            | ConfigError::Invalid { file, .. }
            | ConfigError::Duplicate { file, .. } => file,
        }
    }

    /// The object the error is about, when there is one.
    pub fn object(&self) -> Option<&ObjectKey> {
        match self {
            ConfigError::Invalid { object, .. } | ConfigError::Duplicate { object, .. } => {
                Some(object)
            }
            _ => None,
        }
    }

    /// The field path, for an invalid object.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}
