//! The push context: the immutable snapshot every proxy's configuration is
//! generated from (Istio's `PushContext`), the Sidecar scopes cut from it,
//! push requests and what they mean for each proxy, the proxy model, the
//! EnvoyFilter index, and the XDS cache of generated resources. It sits
//! between the model (below) and xDS (above): the generators and the ADS
//! transport read it through these types; nothing here knows them.

pub mod cache;
pub mod context;
pub(crate) mod envoyfilter;
pub(crate) mod locality;
pub(crate) mod named;
pub(crate) mod names;
pub(crate) mod proxy;
pub(crate) mod proxy_dependencies;
pub mod push_context;
pub(crate) mod push_request;
pub(crate) mod resource;
pub(crate) mod scope;

pub use proxy::Proxy;
pub use push_context::PushContext;
pub use push_request::{PushPlan, PushRequest, Types, Updates};
pub use resource::{Resource, name_hash};
