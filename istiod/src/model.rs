//! istiod's config model: typed Istio and Kubernetes objects, their
//! validation, the store that holds the last good objects and publishes
//! snapshots and change events, and the service registry derived from a
//! snapshot for the generators.
//!
//! ```text
//! YAML/JSON --parse::decode--> Object (validated) --ConfigStore--> Arc<Snapshot>
//!                                                       |             |
//!                                            ConfigBatch events   ServiceRegistry::build
//! ```

/// Istio's mesh root namespace: a Sidecar, PeerAuthentication,
/// AuthorizationPolicy or RequestAuthentication here applies mesh-wide.
/// This istiod's root namespace is fixed: the mesh config's `rootNamespace`
/// may only name it.
pub const ROOT_NAMESPACE: &str = "istio-system";

pub(crate) mod config_map;
pub(crate) mod delegate;
pub(crate) mod envoy_filter;
pub(crate) mod error;
pub mod features;
pub(crate) mod gateway;
pub mod gateway_api;
pub(crate) mod ingress;
pub(crate) mod ip_allocate;
pub mod istio;
pub(crate) mod kube;
pub mod meta;
pub(crate) mod parse;
pub(crate) mod proxy_config;
pub mod revision;
pub(crate) mod route;
pub(crate) mod secret;
pub(crate) mod security;
pub(crate) mod service;
pub(crate) mod store;
pub(crate) mod telemetry;
pub(crate) mod validate;

pub use error::{ConfigError, FieldError};
pub use meta::{Kind, KindSpec, Object, ObjectKey, ObjectMeta, Spec};
pub use parse::{DecodeError, Decoded, IgnoredKind, ParsedFile, decode, parse_file};
pub use service::{
    Endpoint, EndpointTlsMode, ExportTo, Protocol, RegistryOptions, Service, ServicePort,
    ServiceRegistry, ServiceResolution, ServiceSource, egress_host_matches, host_matches,
    is_exported_to,
};
pub use store::{Change, ConfigBatch, ConfigEvent, ConfigStore, Snapshot, Typed, Update};
