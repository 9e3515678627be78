//! A namespaced config object with its spec, as the push context holds it.

/// A named, namespaced config object.
#[derive(Debug, Clone)]
pub struct Named<T> {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The spec.
    pub spec: T,
}
