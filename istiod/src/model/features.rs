//! Istio's feature flags (`pilot/pkg/features`) that change what istiod
//! accepts and what it builds. Istio reads them as process globals; here
//! they are read once with the config, handed to the push context
//! explicitly (see `RegistryOptions::features`), and published once for
//! validation, which checks one object at a time with no config at hand.

use std::sync::OnceLock;

/// The flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    /// `ENABLE_TLS_ON_SIDECAR_INGRESS`: a Sidecar's `ingress[].tls`
    /// terminates TLS on its port (when the port's PeerAuthentication mode
    /// is DISABLE).
    pub enable_tls_on_sidecar_ingress: bool,
}

static PUBLISHED: OnceLock<Features> = OnceLock::new();

/// Publishes the process's flags for validation (the first call wins: the
/// flags do not change while istiod runs).
pub fn publish(features: Features) {
    let _ = PUBLISHED.set(features);
}

/// The published flags; Istio's defaults before (and without) publishing.
pub fn published() -> Features {
    PUBLISHED.get().copied().unwrap_or_default()
}
