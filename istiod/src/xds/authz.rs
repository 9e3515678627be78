//! AuthorizationPolicy to Envoy's RBAC and ext_authz filters (Istio's
//! `authz` builder).
//!
//! The policies that apply to a workload are those that attach to it (see
//! [`super::policy_attachment`]: by selector, or by `targetRef(s)` on
//! gateways). They become,
//! in this order on every inbound chain: CUSTOM (a shadow RBAC filter, then
//! ext_authz; see [`ext_authz`]), DENY (RBAC `DENY`), AUDIT (RBAC `LOG`),
//! ALLOW (RBAC `ALLOW`). A filter is generated only for an action some
//! policy has; once an ALLOW policy applies, a request none of the ALLOW
//! rules match is denied (a policy with no rules matches nothing, so it
//! denies everything; `rules: [{}]` matches everything). Envoy answers a
//! denied request with `403 RBAC: access denied` and closes a denied TCP
//! connection.
//!
//! Envoy policy names are Istio's: `ns[<ns>]-policy[<name>]-rule[<i>]`.

use std::collections::HashMap;

use prost::Message;
use proto::pb::envoy::config::listener::v3::{Filter, filter};
use proto::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, Rbac, permission, principal, rbac::Action,
};
use proto::pb::envoy::extensions::filters::http::rbac::v3 as http_rbac;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use proto::pb::envoy::extensions::filters::network::rbac::v3 as net_rbac;
use proto::pb::google::protobuf::Any;

use super::policy_attachment::{PolicyScope, attaches};
use crate::model::security::{AuthorizationAction, AuthorizationPolicy};
use crate::pushctx::Proxy;
use crate::pushctx::context::IstioContext;
use crate::pushctx::named::Named;

mod ext_authz;
mod matcher;
pub mod model;
#[cfg(test)]
mod tests;

/// The HTTP RBAC filter's name (also its dynamic metadata namespace).
pub const RBAC_HTTP: &str = "envoy.filters.http.rbac";
/// The network RBAC filter's name.
pub const RBAC_NETWORK: &str = "envoy.filters.network.rbac";
/// The HTTP ext_authz filter's name.
pub const EXT_AUTHZ_HTTP: &str = "envoy.filters.http.ext_authz";
/// The network ext_authz filter's name.
pub const EXT_AUTHZ_NETWORK: &str = "envoy.filters.network.ext_authz";
/// Istio's network RBAC stat prefix.
pub const TCP_STAT_PREFIX: &str = "tcp.";

type NamedPolicy<'a> = &'a Named<AuthorizationPolicy>;
/// Envoy policies by name, in a stable order.
type Applied = Vec<(String, Policy)>;

/// The policies that attach to `proxy` (see [`super::policy_attachment`]),
/// by namespace and name.
pub fn applicable<'a>(ctx: &'a IstioContext, proxy: &Proxy) -> Vec<NamedPolicy<'a>> {
    let mut out: Vec<NamedPolicy<'a>> = ctx
        .authorization_policies
        .iter()
        .filter(|p| {
            let scope = PolicyScope::new(
                &p.namespace,
                p.spec.selector.as_ref(),
                p.spec.target_ref.as_ref(),
                &p.spec.target_refs,
            );
            attaches(ctx, proxy, &scope)
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// A policy that matches every request.
fn any_policy() -> Policy {
    Policy {
        permissions: vec![Permission {
            rule: Some(permission::Rule::Any(true)),
        }],
        principals: vec![Principal {
            identifier: Some(principal::Identifier::Any(true)),
        }],
        ..Default::default()
    }
}

/// The Envoy policies of `policies`' rules; a rule that cannot be generated
/// is dropped (see [`model`] for when that happens) and logged.
fn generate(policies: &[NamedPolicy<'_>], tcp: bool, allow: bool) -> Applied {
    let mode = model::Mode { tcp, allow };
    let mut out = Vec::new();
    for p in policies {
        for (i, rule) in p.spec.rules.iter().enumerate() {
            let name = format!("ns[{}]-policy[{}]-rule[{i}]", p.namespace, p.name);
            match model::rule_policy(rule, &p.namespace, mode) {
                Ok(policy) => out.push((name, policy)),
                Err(err) => {
                    tracing::debug!(policy = %name, tcp, %err, "authorization rule skipped")
                }
            }
        }
    }
    out
}

/// Encodes `wrap(policies)` with the map entries in name order: prost
/// encodes a `HashMap` in its random iteration order, and an unchanged
/// policy must give unchanged bytes (else every push would look like a new
/// listener). Concatenated encodings of one message merge, and map entries
/// accumulate.
fn encode_sorted<M: Message + prost::Name>(
    policies: &Applied,
    wrap: impl Fn(HashMap<String, Policy>) -> M,
) -> Any {
    let mut value = wrap(HashMap::new()).encode_to_vec();
    for (name, p) in policies {
        value.extend(wrap(HashMap::from([(name.clone(), p.clone())])).encode_to_vec());
    }
    Any {
        type_url: M::type_url(),
        value,
    }
}

fn rbac(action: Action, policies: HashMap<String, Policy>) -> Rbac {
    Rbac {
        action: action as i32,
        policies,
        ..Default::default()
    }
}

fn http_rbac_filter(action: Action, policies: &Applied, shadow: bool) -> HttpFilter {
    let config = encode_sorted(policies, |map| {
        if shadow {
            http_rbac::Rbac {
                shadow_rules: Some(rbac(action, map)),
                shadow_rules_stat_prefix: ext_authz::SHADOW_STAT_PREFIX.into(),
                ..Default::default()
            }
        } else {
            http_rbac::Rbac {
                rules: Some(rbac(action, map)),
                ..Default::default()
            }
        }
    });
    HttpFilter {
        name: RBAC_HTTP.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(config)),
        ..Default::default()
    }
}

fn network_rbac_filter(action: Action, policies: &Applied, shadow: bool) -> Filter {
    let config = encode_sorted(policies, |map| {
        if shadow {
            net_rbac::Rbac {
                shadow_rules: Some(rbac(action, map)),
                shadow_rules_stat_prefix: ext_authz::SHADOW_STAT_PREFIX.into(),
                stat_prefix: TCP_STAT_PREFIX.into(),
                ..Default::default()
            }
        } else {
            net_rbac::Rbac {
                rules: Some(rbac(action, map)),
                stat_prefix: TCP_STAT_PREFIX.into(),
                ..Default::default()
            }
        }
    });
    Filter {
        name: RBAC_NETWORK.into(),
        config_type: Some(filter::ConfigType::TypedConfig(config)),
    }
}

/// The applicable policies split by action.
struct ByAction<'a> {
    custom: Vec<NamedPolicy<'a>>,
    deny: Vec<NamedPolicy<'a>>,
    audit: Vec<NamedPolicy<'a>>,
    allow: Vec<NamedPolicy<'a>>,
}

impl<'a> ByAction<'a> {
    fn of(ctx: &'a IstioContext, proxy: &Proxy) -> Self {
        let mut out = ByAction {
            custom: Vec::new(),
            deny: Vec::new(),
            audit: Vec::new(),
            allow: Vec::new(),
        };
        for p in applicable(ctx, proxy) {
            match p.spec.action {
                AuthorizationAction::Custom => out.custom.push(p),
                AuthorizationAction::Deny => out.deny.push(p),
                AuthorizationAction::Audit => out.audit.push(p),
                AuthorizationAction::Allow => out.allow.push(p),
            }
        }
        out
    }
}

/// The HTTP authorization filters for `proxy`'s inbound chains.
pub fn http_filters(ctx: &IstioContext, proxy: &Proxy) -> Vec<HttpFilter> {
    let by = ByAction::of(ctx, proxy);
    let mut out = Vec::new();
    if !by.custom.is_empty() {
        match ext_authz::resolve(ctx, &by.custom) {
            Ok(resolved) => {
                let shadow = ext_authz::shadow_policies(&generate(&by.custom, false, false));
                if !shadow.is_empty() {
                    out.push(http_rbac_filter(Action::Allow, &shadow, true));
                    out.push(HttpFilter {
                        name: EXT_AUTHZ_HTTP.into(),
                        config_type: Some(http_filter::ConfigType::TypedConfig(super::util::any(
                            &ext_authz::http_config(&resolved),
                        ))),
                        ..Default::default()
                    });
                }
            }
            Err(err) => {
                tracing::warn!(proxy = %proxy.id, %err, "CUSTOM authorization cannot be applied: denying every request");
                let (action, all) = ext_authz::deny_all(&by.custom);
                out.push(http_rbac_filter(action, &all, false));
            }
        }
    }
    for (policies, action) in [(&by.deny, Action::Deny), (&by.audit, Action::Log)] {
        let applied = generate(policies, false, false);
        if !applied.is_empty() {
            out.push(http_rbac_filter(action, &applied, false));
        }
    }
    if !by.allow.is_empty() {
        out.push(http_rbac_filter(
            Action::Allow,
            &generate(&by.allow, false, true),
            false,
        ));
    }
    out
}

/// The network authorization filters for `proxy`'s inbound TCP chains.
pub fn network_filters(ctx: &IstioContext, proxy: &Proxy) -> Vec<Filter> {
    let by = ByAction::of(ctx, proxy);
    let mut out = Vec::new();
    if !by.custom.is_empty() {
        match ext_authz::resolve(ctx, &by.custom) {
            Ok(ext_authz::Resolved::Grpc(g, cluster, host)) => {
                let shadow = ext_authz::shadow_policies(&generate(&by.custom, true, false));
                if !shadow.is_empty() {
                    out.push(network_rbac_filter(Action::Allow, &shadow, true));
                    out.push(Filter {
                        name: EXT_AUTHZ_NETWORK.into(),
                        config_type: Some(filter::ConfigType::TypedConfig(super::util::any(
                            &ext_authz::network_config(g, &cluster, &host),
                        ))),
                    });
                }
            }
            Ok(ext_authz::Resolved::Http(..)) => {
                // Envoy's network ext_authz speaks gRPC only. Istio skips an
                // HTTP provider on TCP chains, which lets through what the
                // policy meant to check; here the connections the CUSTOM
                // rules select are denied instead (never allow more).
                tracing::debug!(proxy = %proxy.id, "CUSTOM policy with an HTTP provider on a TCP chain: denying the connections its rules match");
                let applied = generate(&by.custom, true, false);
                if !applied.is_empty() {
                    out.push(network_rbac_filter(Action::Deny, &applied, false));
                }
            }
            Err(err) => {
                tracing::warn!(proxy = %proxy.id, %err, "CUSTOM authorization cannot be applied: denying every connection");
                let (action, all) = ext_authz::deny_all(&by.custom);
                out.push(network_rbac_filter(action, &all, false));
            }
        }
    }
    for (policies, action) in [(&by.deny, Action::Deny), (&by.audit, Action::Log)] {
        let applied = generate(policies, true, false);
        if !applied.is_empty() {
            out.push(network_rbac_filter(action, &applied, false));
        }
    }
    if !by.allow.is_empty() {
        out.push(network_rbac_filter(
            Action::Allow,
            &generate(&by.allow, true, true),
            false,
        ));
    }
    out
}
