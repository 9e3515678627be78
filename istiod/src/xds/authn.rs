//! RequestAuthentication to Envoy's `jwt_authn` filter, as Istio's authn
//! builder (`pilot/pkg/security/authn`) makes it with istiod fetching the
//! keys (`PILOT_JWT_ENABLE_REMOTE_JWKS=false`).
//!
//! The jwtRules of every policy that applies to the workload are merged,
//! sorted by issuer, and become providers `origins-<i>`. A request carrying
//! a token must present one that one of the providers validates (else Envoy
//! answers 401); a request without a token passes, and it is
//! AuthorizationPolicy (`requestPrincipals`, `request.auth.*`) that may then
//! refuse it. Validated payloads land in the dynamic metadata of
//! [`JWT_FILTER`] under [`PAYLOAD_METADATA_KEY`], where the RBAC filter
//! reads them. Istio's own `istio_authn` filter, which copies them into
//! metadata of its own, is not an upstream Envoy extension and is left out.

use std::collections::HashMap;
use std::time::Duration;

use proto::pb::envoy::config::core::v3::{DataSource, data_source};
use proto::pb::envoy::config::route::v3::{RouteMatch, route_match};
use proto::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement,
    JwtRequirementAndList, JwtRequirementOrList, RequirementRule, jwt_provider,
    jwt_requirement::RequiresType, requirement_rule::RequirementType,
};
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use proto::pb::google::protobuf::Empty;

use super::policy_attachment::{PolicyScope, attaches};
use super::util::any;
use crate::jwks::JwksResolver;
use crate::jwks::resolver::DEFAULT_TIMEOUT;
use crate::model::security::{JwtRule, RequestAuthentication};
use crate::pushctx::Proxy;
use crate::pushctx::context::IstioContext;
use crate::pushctx::named::Named;

/// The filter's name, which is also its dynamic metadata namespace.
pub const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
/// The metadata key validated payloads are written under (Istio's
/// `EnvoyJwtFilterPayload`).
pub const PAYLOAD_METADATA_KEY: &str = "payload";
/// Claims Istio always reads as space-separated lists.
const DEFAULT_SPACE_DELIMITED_CLAIMS: [&str; 2] = ["permission", "scope"];

/// The HTTP authentication filters for `proxy`'s inbound chains: one
/// `jwt_authn` filter when any RequestAuthentication applies, else none.
pub fn http_filters(ctx: &IstioContext, proxy: &Proxy) -> Vec<HttpFilter> {
    let rules = jwt_rules(ctx, &ctx.request_authentications, proxy);
    if rules.is_empty() {
        return Vec::new();
    }
    let config = jwt_authentication(&rules, &ctx.jwks);
    vec![HttpFilter {
        name: JWT_FILTER.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&config))),
        ..Default::default()
    }]
}

/// The jwtRules of every policy that attaches to the workload (see
/// [`super::policy_attachment`]), the workload's namespace first, then
/// sorted by issuer (stable), as Istio's `newPolicyApplier` orders them.
/// Rules with the same issuer are all kept, as Istio keeps them.
pub fn jwt_rules<'a>(
    ctx: &IstioContext,
    policies: &'a [Named<RequestAuthentication>],
    proxy: &Proxy,
) -> Vec<&'a JwtRule> {
    let mut applicable: Vec<&Named<RequestAuthentication>> = policies
        .iter()
        .filter(|ra| {
            let scope = PolicyScope::new(
                &ra.namespace,
                ra.spec.selector.as_ref(),
                ra.spec.target_ref.as_ref(),
                &ra.spec.target_refs,
            );
            attaches(ctx, proxy, &scope)
        })
        .collect();
    applicable.sort_by_key(|ra| (ra.namespace != proxy.namespace, &ra.namespace, &ra.name));
    let mut rules: Vec<&JwtRule> = applicable
        .iter()
        .flat_map(|ra| ra.spec.jwt_rules.iter())
        .collect();
    rules.sort_by(|a, b| a.issuer.cmp(&b.issuer));
    rules
}

fn provider_requirement(name: &str) -> JwtRequirement {
    JwtRequirement {
        requires_type: Some(RequiresType::ProviderName(name.to_string())),
    }
}

fn any_of(requirements: Vec<JwtRequirement>) -> JwtRequirement {
    JwtRequirement {
        requires_type: Some(RequiresType::RequiresAny(JwtRequirementOrList {
            requirements,
        })),
    }
}

/// Istio's `convertToEnvoyJwtConfig`: one provider per rule; the
/// requirement is `{P or missing}` for one provider, and for several
/// `any of {P1, P2, .., all of {P1 or missing, P2 or missing, ..}}` (the
/// inner AND refuses any invalid token, the outer OR lets providers that
/// share a token location pass each other's tokens).
pub fn jwt_authentication(rules: &[&JwtRule], jwks: &JwksResolver) -> JwtAuthentication {
    let mut providers = HashMap::new();
    let mut each_or_missing = Vec::new();
    let mut any_provider = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let name = format!("origins-{i}");
        providers.insert(name.clone(), provider(rule, jwks));
        each_or_missing.push(any_of(vec![
            provider_requirement(&name),
            JwtRequirement {
                requires_type: Some(RequiresType::AllowMissing(Empty {})),
            },
        ]));
        any_provider.push(provider_requirement(&name));
    }
    let requires = if each_or_missing.len() == 1 {
        each_or_missing.remove(0)
    } else {
        any_provider.push(JwtRequirement {
            requires_type: Some(RequiresType::RequiresAll(JwtRequirementAndList {
                requirements: each_or_missing,
            })),
        });
        any_of(any_provider)
    };
    JwtAuthentication {
        providers,
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch {
                path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            requirement_type: Some(RequirementType::Requires(requires)),
        }],
        bypass_cors_preflight: true,
        ..Default::default()
    }
}

/// The spaceDelimitedClaims Envoy normalizes: the rule's, plus Istio's
/// defaults, sorted and deduplicated.
fn space_delimited_claims(rule: &JwtRule) -> Vec<String> {
    let mut claims: Vec<String> = rule
        .space_delimited_claims
        .iter()
        .cloned()
        .chain(DEFAULT_SPACE_DELIMITED_CLAIMS.iter().map(|c| c.to_string()))
        .collect();
    claims.sort();
    claims.dedup();
    claims
}

/// One rule as an Envoy provider. With no `fromHeaders`, `fromParams` or
/// `fromCookies`, Envoy's defaults apply: `Authorization: Bearer <token>`
/// and the `access_token` query parameter (Istio's documented defaults).
/// `timeout` bounds istiod's fetch of `jwksUri` (keys are inlined, so
/// Envoy fetches nothing).
fn provider(rule: &JwtRule, jwks: &JwksResolver) -> JwtProvider {
    // Inline keys win over the URI, as in Istio's `BuildLocalJwks`.
    let keys = if rule.jwks.is_empty() {
        let timeout: Duration = rule.timeout.unwrap_or(DEFAULT_TIMEOUT);
        jwks.local_jwks(&rule.issuer, &rule.jwks_uri, timeout)
    } else {
        rule.jwks.clone()
    };
    JwtProvider {
        issuer: rule.issuer.clone(),
        audiences: rule.audiences.clone(),
        forward: rule.forward_original_token,
        forward_payload_header: rule.output_payload_to_header.clone(),
        payload_in_metadata: PAYLOAD_METADATA_KEY.into(),
        normalize_payload_in_metadata: Some(jwt_provider::NormalizePayload {
            space_delimited_claims: space_delimited_claims(rule),
        }),
        claim_to_headers: rule
            .output_claim_to_headers
            .iter()
            .map(|c| JwtClaimToHeader {
                header_name: c.header.clone(),
                claim_name: c.claim.clone(),
                ..Default::default()
            })
            .collect(),
        from_headers: rule
            .from_headers
            .iter()
            .map(|h| JwtHeader {
                name: h.name.clone(),
                value_prefix: h.prefix.clone(),
            })
            .collect(),
        from_params: rule.from_params.clone(),
        from_cookies: rule.from_cookies.clone(),
        jwks_source_specifier: Some(jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(data_source::Specifier::InlineString(keys)),
            ..Default::default()
        })),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
