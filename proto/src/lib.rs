//! Protobuf types shared by istiod and pilot-agent.
//!
//! Istio's own services are generated here at build time; Envoy's are
//! re-exported from `envoy-types` so every crate uses one copy of each type.

pub use envoy_types::pb;

/// `istio.v1.auth`: the CA service (`IstioCertificateService/CreateCertificate`).
pub mod istio_ca {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("istio.v1.auth");
}

/// `istio.networking.nds.v1`: the DNS name table istiod sends the agent.
pub mod nds {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("istio.networking.nds.v1");
}

/// Envoy's `google.protobuf` well-known types, as the generated code uses them.
pub use envoy_types::pb::google::protobuf;

pub mod envoy_json;
