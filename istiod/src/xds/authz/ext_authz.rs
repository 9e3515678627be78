//! CUSTOM AuthorizationPolicies: Envoy's ext_authz filter calling the mesh
//! config's extension provider, as Istio's builder sets it up. An RBAC
//! filter in shadow mode ahead of it matches the CUSTOM policies' rules and
//! records the matching policy (`istio_ext_authz_shadow_effective_policy_id`
//! in its dynamic metadata); ext_authz runs only for requests with that
//! record (`filter_enabled_metadata`), so the provider is asked only about
//! requests the policies' rules select.
//!
//! A workload's CUSTOM policies must all name the same provider. When they
//! do not, or the provider is missing, is not an ext_authz provider, or its
//! service is not in the registry, Istio denies every request to the
//! workload rather than skip the check; so does this builder (and logs why).

use std::collections::BTreeSet;

use proto::pb::envoy::config::core::v3::{
    ApiVersion, GrpcService, HeaderValue, HttpUri, grpc_service, http_uri,
};
use proto::pb::envoy::config::rbac::v3::{Policy, rbac::Action};
use proto::pb::envoy::extensions::filters::http::ext_authz::v3 as http_authz;
use proto::pb::envoy::extensions::filters::network::ext_authz::v3 as net_authz;
use proto::pb::envoy::r#type::matcher::v3::{ListStringMatcher, MetadataMatcher};
use proto::pb::envoy::r#type::v3::HttpStatus;

use super::matcher as m;
use super::{Applied, NamedPolicy, RBAC_HTTP, RBAC_NETWORK};
use crate::mesh::{BodyInCheck, ExtAuthzGrpc, ExtAuthzHttp, ExtensionProviderKind};
use crate::pushctx::context::IstioContext;
use crate::pushctx::names::outbound_name;
use crate::xds::util::duration;

/// Istio's stat prefix of the CUSTOM shadow rules.
pub const SHADOW_STAT_PREFIX: &str = "istio_ext_authz_";
/// Prefix of the CUSTOM policies' names in the shadow rules.
pub const POLICY_PREFIX: &str = "istio-ext-authz-";
/// Istio's default check timeout (`timeout` unset): 600s.
const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Why CUSTOM policies cannot be applied (every request is then denied).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The policies name more than one provider.
    #[error("only one extension provider can be used per workload, the CUSTOM policies name {0:?}")]
    Several(BTreeSet<String>),
    /// A policy names no provider (validation refuses this).
    #[error("CUSTOM policy {0} names no provider")]
    Missing(String),
    /// The mesh config has no provider of that name.
    #[error("extension provider {0:?} is not in the mesh config's extensionProviders")]
    NotFound(String),
    /// The provider is not an ext_authz provider.
    #[error(
        "extension provider {0:?} is a {1} provider, not envoyExtAuthzHttp or envoyExtAuthzGrpc"
    )]
    NotExtAuthz(String, String),
    /// The provider's service is not in the registry.
    #[error("extension provider {0:?}: service {1:?} is not in the registry")]
    NoService(String, String),
}

/// A provider resolved to its cluster.
#[derive(Debug, Clone)]
pub(super) enum Resolved<'a> {
    /// `envoyExtAuthzHttp`.
    Http(&'a ExtAuthzHttp, String, String),
    /// `envoyExtAuthzGrpc`.
    Grpc(&'a ExtAuthzGrpc, String, String),
}

/// The host a provider's `service` names: `<ns>/<host>` (a short host is a
/// service of that namespace) or a host.
fn service_host(service: &str, domain: &str) -> String {
    match service.split_once('/') {
        Some((ns, host)) if !host.contains('.') => format!("{host}.{ns}.svc.{domain}"),
        Some((_, host)) => host.to_string(),
        None => service.to_string(),
    }
}

/// The one provider the CUSTOM policies use.
pub(super) fn resolve<'a>(
    ctx: &'a IstioContext,
    policies: &[NamedPolicy<'_>],
) -> Result<Resolved<'a>, ProviderError> {
    let mut names = BTreeSet::new();
    for p in policies {
        match &p.spec.provider {
            Some(pr) if !pr.name.is_empty() => names.insert(pr.name.clone()),
            _ => {
                return Err(ProviderError::Missing(format!(
                    "{}/{}",
                    p.namespace, p.name
                )));
            }
        };
    }
    if names.len() > 1 {
        return Err(ProviderError::Several(names));
    }
    let name = names.pop_first().unwrap_or_default();
    let provider = ctx
        .mesh
        .extension_providers
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| ProviderError::NotFound(name.clone()))?;
    let (service, port) = match &provider.kind {
        ExtensionProviderKind::ExtAuthzHttp(h) => (&h.service, h.port),
        ExtensionProviderKind::ExtAuthzGrpc(g) => (&g.service, g.port),
        other => {
            return Err(ProviderError::NotExtAuthz(name, other.key().to_string()));
        }
    };
    let host = service_host(service, &ctx.domain);
    if ctx.registry.by_hostname(&host).next().is_none() {
        return Err(ProviderError::NoService(name, service.clone()));
    }
    let cluster = outbound_name(port as u16, "", &host);
    Ok(match &provider.kind {
        ExtensionProviderKind::ExtAuthzHttp(h) => Resolved::Http(h, cluster, host),
        ExtensionProviderKind::ExtAuthzGrpc(g) => Resolved::Grpc(g, cluster, host),
        _ => unreachable!("refused above"),
    })
}

/// The ext_authz filter's trigger: the shadow RBAC filter's record of a
/// matching CUSTOM policy.
fn enabled_metadata(rbac_filter: &str) -> MetadataMatcher {
    m::metadata(
        rbac_filter,
        &[&format!("{SHADOW_STAT_PREFIX}shadow_effective_policy_id")],
        m::value_string(m::string(&format!(
            "{}*",
            POLICY_PREFIX.trim_end_matches('-')
        ))),
    )
}

fn status(code: &str) -> Option<HttpStatus> {
    code.parse().ok().map(|code| HttpStatus { code })
}

fn body(b: &Option<BodyInCheck>) -> Option<http_authz::BufferSettings> {
    b.map(|b| http_authz::BufferSettings {
        max_request_bytes: b.max_request_bytes,
        allow_partial_message: b.allow_partial_message,
        pack_as_bytes: b.pack_as_bytes,
    })
}

/// Header names as Istio matches them: case-insensitive, `*` syntax.
fn header_list(names: &[String]) -> Option<ListStringMatcher> {
    (!names.is_empty()).then(|| ListStringMatcher {
        patterns: names
            .iter()
            .map(|h| m::string_with_prefix(h, "", true))
            .collect(),
    })
}

fn grpc_service(g: &ExtAuthzGrpc, cluster: &str, host: &str) -> GrpcService {
    GrpcService {
        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
            grpc_service::EnvoyGrpc {
                cluster_name: cluster.to_string(),
                authority: host.to_string(),
                ..Default::default()
            },
        )),
        timeout: Some(duration(g.timeout.unwrap_or(DEFAULT_TIMEOUT))),
        ..Default::default()
    }
}

/// The HTTP ext_authz filter's config for the provider.
pub(super) fn http_config(r: &Resolved<'_>) -> http_authz::ExtAuthz {
    let mut out = http_authz::ExtAuthz {
        transport_api_version: ApiVersion::V3 as i32,
        include_peer_certificate: true,
        filter_enabled_metadata: Some(enabled_metadata(RBAC_HTTP)),
        ..Default::default()
    };
    match r {
        Resolved::Http(h, cluster, host) => {
            let port = if h.port == 80 {
                String::new()
            } else {
                format!(":{}", h.port)
            };
            let timeout = duration(h.timeout.unwrap_or(DEFAULT_TIMEOUT));
            out.services = Some(http_authz::ext_authz::Services::HttpService(
                http_authz::HttpService {
                    server_uri: Some(HttpUri {
                        uri: format!("http://{host}{port}{}", h.path_prefix),
                        timeout: Some(timeout),
                        http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(
                            cluster.clone(),
                        )),
                    }),
                    path_prefix: h.path_prefix.clone(),
                    authorization_request: Some(http_authz::AuthorizationRequest {
                        headers_to_add: h
                            .include_additional_headers_in_check
                            .iter()
                            .map(|(k, v)| HeaderValue {
                                key: k.clone(),
                                value: v.clone(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    }),
                    authorization_response: Some(http_authz::AuthorizationResponse {
                        allowed_upstream_headers: header_list(&h.headers_to_upstream_on_allow),
                        allowed_client_headers: header_list(&h.headers_to_downstream_on_deny),
                        allowed_client_headers_on_success: header_list(
                            &h.headers_to_downstream_on_allow,
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ));
            // The filter-level field replaces the deprecated one in
            // `authorization_request`.
            out.allowed_headers = header_list(&h.include_request_headers_in_check);
            out.failure_mode_allow = h.fail_open;
            out.status_on_error = status(&h.status_on_error);
            out.with_request_body = body(&h.include_request_body_in_check);
            out.clear_route_cache = h.clear_route_cache;
        }
        Resolved::Grpc(g, cluster, host) => {
            out.services = Some(http_authz::ext_authz::Services::GrpcService(grpc_service(
                g, cluster, host,
            )));
            out.failure_mode_allow = g.fail_open;
            out.status_on_error = status(&g.status_on_error);
            out.with_request_body = body(&g.include_request_body_in_check);
            out.clear_route_cache = g.clear_route_cache;
        }
    }
    out
}

/// The network ext_authz filter's config (gRPC providers only: Envoy's
/// network ext_authz speaks gRPC).
pub(super) fn network_config(g: &ExtAuthzGrpc, cluster: &str, host: &str) -> net_authz::ExtAuthz {
    net_authz::ExtAuthz {
        stat_prefix: "tcp.".into(),
        grpc_service: Some(grpc_service(g, cluster, host)),
        failure_mode_allow: g.fail_open,
        include_peer_certificate: true,
        transport_api_version: ApiVersion::V3 as i32,
        filter_enabled_metadata: Some(enabled_metadata(RBAC_NETWORK)),
        ..Default::default()
    }
}

/// The shadow policies' names: Istio's policy names with [`POLICY_PREFIX`].
pub(super) fn shadow_policies(applied: &Applied) -> Vec<(String, Policy)> {
    applied
        .iter()
        .map(|(name, p)| (format!("{POLICY_PREFIX}{name}"), p.clone()))
        .collect()
}

/// The deny-all policies standing in for CUSTOM policies that cannot be
/// applied.
pub(super) fn deny_all(policies: &[NamedPolicy<'_>]) -> (Action, Vec<(String, Policy)>) {
    let all = super::any_policy();
    let named = policies
        .iter()
        .map(|p| {
            (
                format!(
                    "{POLICY_PREFIX}ns[{}]-policy[{}]-deny-all",
                    p.namespace, p.name
                ),
                all.clone(),
            )
        })
        .collect();
    (Action::Deny, named)
}
