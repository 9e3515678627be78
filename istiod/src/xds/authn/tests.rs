use std::time::Duration;

use prost::Message;

use super::*;
use crate::jwks::resolver::FAKE_JWKS;
use crate::model::ROOT_NAMESPACE;
use crate::model::istio::PolicySelector;
use crate::model::security::{ClaimToHeader, JwtHeader};

fn proxy(ns: &str, labels: &[(&str, &str)]) -> Proxy {
    Proxy {
        namespace: ns.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn policy(
    ns: &str,
    name: &str,
    selector: &[(&str, &str)],
    issuers: &[&str],
) -> Named<RequestAuthentication> {
    Named {
        namespace: ns.into(),
        name: name.into(),
        spec: RequestAuthentication {
            selector: (!selector.is_empty()).then(|| PolicySelector {
                match_labels: selector
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }),
            jwt_rules: issuers
                .iter()
                .map(|i| JwtRule {
                    issuer: i.to_string(),
                    jwks: r#"{"keys":[]}"#.into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
    }
}

fn issuers(policies: &[Named<RequestAuthentication>], p: &Proxy) -> Vec<String> {
    jwt_rules(&crate::pushctx::context::context_of_yaml(""), policies, p)
        .iter()
        .map(|r| r.issuer.clone())
        .collect()
}

#[test]
fn policies_of_the_workload_namespace_and_root_apply_merged_and_sorted_by_issuer() {
    let policies = vec![
        policy("demo", "ns-wide", &[], &["z-ns"]),
        policy("demo", "mine", &[("app", "httpbin")], &["m-workload"]),
        policy("demo", "other", &[("app", "sleep")], &["x-other"]),
        policy(ROOT_NAMESPACE, "mesh", &[], &["a-mesh"]),
        policy(
            ROOT_NAMESPACE,
            "mesh-selected",
            &[("app", "httpbin")],
            &["b-root-selected"],
        ),
        policy(
            ROOT_NAMESPACE,
            "mesh-other",
            &[("app", "sleep")],
            &["c-root-other"],
        ),
        policy("elsewhere", "no", &[], &["y-elsewhere"]),
    ];
    let httpbin = proxy("demo", &[("app", "httpbin")]);
    assert_eq!(
        issuers(&policies, &httpbin),
        ["a-mesh", "b-root-selected", "m-workload", "z-ns"]
    );
    let sleep = proxy("demo", &[("app", "sleep")]);
    assert_eq!(
        issuers(&policies, &sleep),
        ["a-mesh", "c-root-other", "x-other", "z-ns"]
    );
    assert!(issuers(&policies[2..3], &httpbin).is_empty());
}

#[test]
fn one_rule_is_provider_or_missing() {
    let rule = JwtRule {
        issuer: "iss".into(),
        jwks: r#"{"keys":[]}"#.into(),
        ..Default::default()
    };
    let config = jwt_authentication(&[&rule], &JwksResolver::new());
    assert_eq!(config.providers.keys().collect::<Vec<_>>(), ["origins-0"]);
    assert!(config.bypass_cors_preflight);
    let [rule] = config.rules.as_slice() else {
        panic!("one rule expected: {:?}", config.rules)
    };
    assert_eq!(
        rule.r#match.as_ref().unwrap().path_specifier,
        Some(route_match::PathSpecifier::Prefix("/".into()))
    );
    let Some(RequirementType::Requires(req)) = &rule.requirement_type else {
        panic!("{rule:?}")
    };
    assert_eq!(
        *req,
        any_of(vec![
            provider_requirement("origins-0"),
            JwtRequirement {
                requires_type: Some(RequiresType::AllowMissing(Empty {}))
            }
        ])
    );
}

#[test]
fn several_rules_any_provider_or_all_valid_or_missing() {
    let rules: Vec<JwtRule> = ["a", "b"]
        .iter()
        .map(|i| JwtRule {
            issuer: i.to_string(),
            jwks: r#"{"keys":[]}"#.into(),
            ..Default::default()
        })
        .collect();
    let refs: Vec<&JwtRule> = rules.iter().collect();
    let config = jwt_authentication(&refs, &JwksResolver::new());
    assert_eq!(config.providers["origins-0"].issuer, "a");
    assert_eq!(config.providers["origins-1"].issuer, "b");
    let missing = || JwtRequirement {
        requires_type: Some(RequiresType::AllowMissing(Empty {})),
    };
    let expected = any_of(vec![
        provider_requirement("origins-0"),
        provider_requirement("origins-1"),
        JwtRequirement {
            requires_type: Some(RequiresType::RequiresAll(JwtRequirementAndList {
                requirements: vec![
                    any_of(vec![provider_requirement("origins-0"), missing()]),
                    any_of(vec![provider_requirement("origins-1"), missing()]),
                ],
            })),
        },
    ]);
    assert_eq!(
        config.rules[0].requirement_type,
        Some(RequirementType::Requires(expected))
    );
}

fn inline(p: &JwtProvider) -> &str {
    match &p.jwks_source_specifier {
        Some(jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(data_source::Specifier::InlineString(s)),
            ..
        })) => s,
        other => panic!("not inline: {other:?}"),
    }
}

#[test]
fn every_field_of_a_rule_reaches_the_provider() {
    let rule = JwtRule {
        issuer: "https://issuer.example".into(),
        audiences: vec!["a1".into(), "a2".into()],
        jwks: r#"{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#.into(),
        jwks_uri: "https://ignored.example/jwks".into(),
        from_headers: vec![JwtHeader {
            name: "x-jwt".into(),
            prefix: "Token ".into(),
        }],
        from_params: vec!["tok".into()],
        from_cookies: vec!["session".into()],
        output_payload_to_header: "x-payload".into(),
        forward_original_token: true,
        output_claim_to_headers: vec![ClaimToHeader {
            header: "x-group".into(),
            claim: "group".into(),
        }],
        timeout: Some(Duration::from_secs(2)),
        space_delimited_claims: vec!["roles".into(), "scope".into()],
    };
    let p = provider(&rule, &JwksResolver::new());
    assert_eq!(p.issuer, "https://issuer.example");
    assert_eq!(p.audiences, ["a1", "a2"]);
    assert_eq!(inline(&p), rule.jwks, "inline jwks wins over jwksUri");
    assert_eq!(
        p.from_headers,
        [
            proto::pb::envoy::extensions::filters::http::jwt_authn::v3::JwtHeader {
                name: "x-jwt".into(),
                value_prefix: "Token ".into()
            }
        ]
    );
    assert_eq!(p.from_params, ["tok"]);
    assert_eq!(p.from_cookies, ["session"]);
    assert_eq!(p.forward_payload_header, "x-payload");
    assert!(p.forward);
    assert_eq!(p.claim_to_headers.len(), 1);
    assert_eq!(p.claim_to_headers[0].header_name, "x-group");
    assert_eq!(p.claim_to_headers[0].claim_name, "group");
    assert_eq!(p.payload_in_metadata, PAYLOAD_METADATA_KEY);
    assert_eq!(
        p.normalize_payload_in_metadata
            .unwrap()
            .space_delimited_claims,
        ["permission", "roles", "scope"]
    );
    assert!(!p.clear_route_cache);
}

#[test]
fn defaults_leave_token_locations_to_envoy_and_normalize_istios_claims() {
    let rule = JwtRule {
        issuer: "iss".into(),
        jwks: r#"{"keys":[]}"#.into(),
        ..Default::default()
    };
    let p = provider(&rule, &JwksResolver::new());
    assert!(p.from_headers.is_empty() && p.from_params.is_empty() && p.from_cookies.is_empty());
    assert!(!p.forward);
    assert_eq!(
        p.normalize_payload_in_metadata
            .unwrap()
            .space_delimited_claims,
        ["permission", "scope"]
    );
}

#[test]
fn unfetched_jwks_uri_inlines_the_fake_jwks() {
    let rule = JwtRule {
        issuer: "iss".into(),
        jwks_uri: "http://127.0.0.1:9/jwks".into(),
        ..Default::default()
    };
    let resolver = JwksResolver::new();
    assert_eq!(inline(&provider(&rule, &resolver)), FAKE_JWKS);
}

#[test]
fn http_filters_from_config() {
    use crate::model::{ConfigStore, RegistryOptions, Update, parse_file};
    let yaml = r#"
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: jwt, namespace: demo}
spec:
  selector: {matchLabels: {app: httpbin}}
  jwtRules:
  - issuer: iss
    jwks: '{"keys":[]}'
"#;
    let store = ConfigStore::new();
    let parsed = parse_file("t.yaml", yaml).unwrap();
    store.apply(
        parsed
            .objects
            .into_iter()
            .map(|o| Update::Upsert(std::sync::Arc::new(o))),
    );
    let ctx = IstioContext::new("t/1".into(), &store.snapshot(), &RegistryOptions::default());
    assert!(http_filters(&ctx, &proxy("demo", &[("app", "sleep")])).is_empty());
    let filters = http_filters(&ctx, &proxy("demo", &[("app", "httpbin")]));
    assert_eq!(filters.len(), 1);
    assert_eq!(filters[0].name, JWT_FILTER);
    let Some(http_filter::ConfigType::TypedConfig(any)) = &filters[0].config_type else {
        panic!("{:?}", filters[0])
    };
    assert!(
        any.type_url
            .ends_with("envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication")
    );
    let config = JwtAuthentication::decode(any.value.as_slice()).unwrap();
    assert_eq!(config.providers["origins-0"].issuer, "iss");
}
