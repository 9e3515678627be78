//! The push context as the xDS transport sees it (Istio's `PushContext`):
//! a version, generation of a type for a proxy, and what a push means for
//! a proxy. [`IstioContext`](super::context::IstioContext) implements it
//! with the generators (`xds::generator`); the transport and push requests
//! hold it as this trait.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{Proxy, PushPlan, Resource, Updates, push_request};

/// Why a proxy's request could not be generated.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GenerateError {
    /// A type URL no generator serves (Istio answers these with nothing).
    #[error("no generator for {0}")]
    UnknownType(String),
}

/// An immutable snapshot of everything needed to generate configuration for
/// any proxy (Istio's `PushContext`).
pub trait PushContext: Send + Sync + 'static {
    /// The push version (`<RFC3339>/<counter>`).
    fn version(&self) -> &str;
    /// Generates `type_url` resources for `proxy`. For named types, `names`
    /// restricts the result; wildcard types ignore it.
    fn generate(
        &self,
        proxy: &Proxy,
        type_url: &str,
        names: &BTreeSet<String>,
    ) -> Result<Vec<Arc<Resource>>, GenerateError>;

    /// What `proxy` needs from a push with these updates (Istio's
    /// `ProxyNeedsPush`): the types to send, nothing when no change reaches
    /// it. Without scopes, every change reaches every proxy.
    fn plan_push(&self, _proxy: &Proxy, updates: &[Arc<Updates>]) -> PushPlan {
        push_request::plan_without_scopes(updates)
    }
}
