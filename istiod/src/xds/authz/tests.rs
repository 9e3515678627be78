//! The RBAC and ext_authz protos produced for representative policies.

use prost::Message;
use proto::pb::envoy::config::core::v3::http_uri;
use proto::pb::envoy::config::rbac::v3::{permission::Rule as P, principal::Identifier as I};
use proto::pb::envoy::extensions::filters::http::ext_authz::v3::{ExtAuthz, ext_authz::Services};
use proto::pb::envoy::r#type::matcher::v3::path_matcher;
use proto::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;

use super::*;
use crate::mesh::Mesh;
use crate::model::{ConfigStore, RegistryOptions, Update, parse_file};

fn ctx(yaml: &str, mesh: &str) -> IstioContext {
    let store = ConfigStore::new();
    let parsed = parse_file("t.yaml", yaml).unwrap();
    store.apply(
        parsed
            .objects
            .into_iter()
            .map(|o| Update::Upsert(std::sync::Arc::new(o))),
    );
    let options = RegistryOptions {
        domain: "cluster.local".into(),
        trust_domain: "cluster.local".into(),
        ..Default::default()
    };
    IstioContext::new("t/1".into(), &store.snapshot(), &options)
        .with_mesh(Mesh::parse(mesh).unwrap().config)
}

fn proxy(labels: &[(&str, &str)]) -> Proxy {
    Proxy {
        id: "httpbin-1.demo".into(),
        namespace: "demo".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn policy(ns: &str, name: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n{spec}\n"
    )
}

fn rbac_of(f: &HttpFilter) -> http_rbac::Rbac {
    let Some(http_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("{f:?}")
    };
    http_rbac::Rbac::decode(any.value.as_slice()).unwrap()
}

fn net_rbac_of(f: &Filter) -> net_rbac::Rbac {
    let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("{f:?}")
    };
    net_rbac::Rbac::decode(any.value.as_slice()).unwrap()
}

/// The inner `and` list of a principal or permission.
fn principal_ids(p: &Principal) -> &[Principal] {
    match &p.identifier {
        Some(I::AndIds(s)) => &s.ids,
        other => panic!("{other:?}"),
    }
}

fn permission_rules(p: &Permission) -> &[Permission] {
    match &p.rule {
        Some(P::AndRules(s)) => &s.rules,
        other => panic!("{other:?}"),
    }
}

#[test]
fn selection_root_namespace_and_own_namespace() {
    let yaml = [
        policy("istio-system", "mesh-wide", "  rules: [{}]"),
        policy(
            "istio-system",
            "root-selected",
            "  selector: {matchLabels: {app: httpbin}}\n  rules: [{}]",
        ),
        policy(
            "istio-system",
            "root-other",
            "  selector: {matchLabels: {app: other}}\n  rules: [{}]",
        ),
        policy("demo", "ns-wide", "  rules: [{}]"),
        policy(
            "demo",
            "selected",
            "  selector: {matchLabels: {app: httpbin}}\n  rules: [{}]",
        ),
        policy(
            "demo",
            "other",
            "  selector: {matchLabels: {app: other}}\n  rules: [{}]",
        ),
        policy("elsewhere", "ns-wide", "  rules: [{}]"),
    ]
    .concat();
    let c = ctx(&yaml, "");
    let names: Vec<String> = applicable(&c, &proxy(&[("app", "httpbin")]))
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    assert_eq!(
        names,
        [
            "demo/ns-wide",
            "demo/selected",
            "istio-system/mesh-wide",
            "istio-system/root-selected"
        ]
    );
}

#[test]
fn no_policies_no_filters_and_empty_allow_denies_everything() {
    let c = ctx("", "");
    assert!(http_filters(&c, &proxy(&[])).is_empty());
    assert!(network_filters(&c, &proxy(&[])).is_empty());

    let c = ctx(&policy("demo", "deny-all", "  {}"), "");
    let f = http_filters(&c, &proxy(&[]));
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].name, RBAC_HTTP);
    let rules = rbac_of(&f[0]).rules.unwrap();
    assert_eq!(rules.action, Action::Allow as i32);
    assert!(rules.policies.is_empty());
    let n = network_filters(&c, &proxy(&[]));
    let net = net_rbac_of(&n[0]);
    assert_eq!(net.stat_prefix, "tcp.");
    assert!(net.rules.unwrap().policies.is_empty());

    // `rules: [{}]` matches everything.
    let c = ctx(&policy("demo", "allow-all", "  rules: [{}]"), "");
    let rules = rbac_of(&http_filters(&c, &proxy(&[]))[0]).rules.unwrap();
    let p = &rules.policies["ns[demo]-policy[allow-all]-rule[0]"];
    assert_eq!(
        permission_rules(&p.permissions[0]),
        [any_policy().permissions[0].clone()]
    );
    assert_eq!(
        principal_ids(&p.principals[0]),
        [any_policy().principals[0].clone()]
    );
}

#[test]
fn actions_in_istio_order_with_names_and_matchers() {
    let yaml = [
        policy(
            "demo",
            "allow",
            r#"  rules:
  - from: [{source: {principals: ["cluster.local/ns/demo/sa/sleep"], namespaces: [demo], ipBlocks: [198.18.0.0/16]}}]
    to: [{operation: {methods: [GET], paths: ["/api/*", "/v1/{*}/x"], ports: ["8080"]}}]
    when: [{key: "request.headers[x-user]", values: [alice]}, {key: "request.auth.claims[groups]", values: [admin]}]"#,
        ),
        policy("demo", "deny", "  action: DENY\n  rules: [{to: [{operation: {paths: [\"/admin*\"]}}]}]"),
        policy("demo", "audit", "  action: AUDIT\n  rules: [{to: [{operation: {notMethods: [GET]}}]}]"),
    ]
    .concat();
    let c = ctx(&yaml, "");
    let f = http_filters(&c, &proxy(&[]));
    let actions: Vec<i32> = f.iter().map(|f| rbac_of(f).rules.unwrap().action).collect();
    assert_eq!(
        actions,
        [
            Action::Deny as i32,
            Action::Log as i32,
            Action::Allow as i32
        ]
    );

    let deny = rbac_of(&f[0]).rules.unwrap();
    let d = &deny.policies["ns[demo]-policy[deny]-rule[0]"];
    let [
        Permission {
            rule: Some(P::OrRules(or)),
        },
    ] = permission_rules(&d.permissions[0])
    else {
        panic!("{d:?}")
    };
    let Some(P::UrlPath(path)) = &or.rules[0].rule else {
        panic!("{or:?}")
    };
    let Some(path_matcher::Rule::Path(sm)) = &path.rule else {
        panic!()
    };
    assert_eq!(
        sm.match_pattern,
        Some(MatchPattern::Prefix("/admin".into()))
    );

    let audit = rbac_of(&f[1]).rules.unwrap();
    let a = &audit.policies["ns[demo]-policy[audit]-rule[0]"];
    assert!(matches!(
        permission_rules(&a.permissions[0])[0].rule,
        Some(P::NotRule(_))
    ));

    let allow = rbac_of(&f[2]).rules.unwrap();
    let p = &allow.policies["ns[demo]-policy[allow]-rule[0]"];
    // Principals: principals, namespaces, ipBlocks, then the `when` ones.
    let ids = principal_ids(&p.principals[0]);
    assert_eq!(ids.len(), 5, "{ids:?}");
    let or = |p: &Principal| match &p.identifier {
        Some(I::OrIds(s)) => s.ids[0].identifier.clone(),
        other => other.clone(),
    };
    let Some(I::Authenticated(a)) = or(&ids[0]) else {
        panic!("{ids:?}")
    };
    assert_eq!(
        a.principal_name.unwrap().match_pattern,
        Some(MatchPattern::Exact(
            "spiffe://cluster.local/ns/demo/sa/sleep".into()
        ))
    );
    let Some(I::Authenticated(a)) = or(&ids[1]) else {
        panic!()
    };
    assert!(
        matches!(a.principal_name.unwrap().match_pattern, Some(MatchPattern::SafeRegex(r)) if r.regex == ".*/ns/demo/.*")
    );
    assert!(matches!(or(&ids[2]), Some(I::DirectRemoteIp(c)) if c.address_prefix == "198.18.0.0"));
    assert!(matches!(or(&ids[3]), Some(I::Header(h)) if h.name == "x-user"));
    let Some(I::SourcedMetadata(md)) = or(&ids[4]) else {
        panic!()
    };
    let mm = md.metadata_matcher.unwrap();
    assert_eq!(mm.filter, "envoy.filters.http.jwt_authn");
    assert_eq!(mm.path.len(), 2);
    // Permissions: methods, paths (one exact-prefix, one template), ports.
    let rules = permission_rules(&p.permissions[0]);
    assert_eq!(rules.len(), 3);
    let Some(P::OrRules(paths)) = &rules[1].rule else {
        panic!()
    };
    assert!(
        matches!(&paths.rules[1].rule, Some(P::UriTemplate(t)) if t.name == "envoy.path.match.uri_template.uri_template_matcher")
    );
    assert!(
        matches!(&rules[2].rule, Some(P::OrRules(s)) if s.rules[0].rule == Some(P::DestinationPort(8080)))
    );
}

#[test]
fn tcp_drops_http_rules_in_allow_and_http_fields_in_deny() {
    let yaml = [
        policy(
            "demo",
            "allow",
            "  rules:\n  - to: [{operation: {methods: [GET]}}]\n  - from: [{source: {principals: [a/b]}}]",
        ),
        policy(
            "demo",
            "deny",
            "  action: DENY\n  rules:\n  - to: [{operation: {ports: [\"9000\"], methods: [GET]}}]",
        ),
    ]
    .concat();
    let c = ctx(&yaml, "");
    let n = network_filters(&c, &proxy(&[]));
    assert_eq!(n.len(), 2);
    let deny = net_rbac_of(&n[0]).rules.unwrap();
    assert_eq!(deny.action, Action::Deny as i32);
    // The methods are dropped, the port stays: every connection to 9000 is denied.
    let d = &deny.policies["ns[demo]-policy[deny]-rule[0]"];
    let rules = permission_rules(&d.permissions[0]);
    assert_eq!(rules.len(), 1);
    assert!(
        matches!(&rules[0].rule, Some(P::OrRules(s)) if s.rules[0].rule == Some(P::DestinationPort(9000)))
    );
    let allow = net_rbac_of(&n[1]).rules.unwrap();
    let names: Vec<&String> = allow.policies.keys().collect();
    assert_eq!(names, ["ns[demo]-policy[allow]-rule[1]"]);
    // On HTTP both rules stay.
    let h = http_filters(&c, &proxy(&[]));
    assert_eq!(rbac_of(&h[1]).rules.unwrap().policies.len(), 2);
}

#[test]
fn request_principals_split_issuer_and_subject() {
    let value_of = |p: &Principal| -> (String, String) {
        let Some(I::SourcedMetadata(md)) = &p.identifier else {
            panic!("{p:?}")
        };
        let mm = md.metadata_matcher.clone().unwrap();
        let key = |s: &proto::pb::envoy::r#type::matcher::v3::metadata_matcher::PathSegment| {
            match &s.segment {
                Some(proto::pb::envoy::r#type::matcher::v3::metadata_matcher::path_segment::Segment::Key(k)) => k.clone(),
                None => String::new(),
            }
        };
        (
            key(&mm.path[1]),
            format!("{:?}", mm.value.unwrap().match_pattern.unwrap()),
        )
    };
    let ids = |v: &str| -> Vec<(String, String)> {
        let p = model::rule_policy(
            &serde_yaml_ng::from_str(&format!(
                "from: [{{source: {{requestPrincipals: [\"{v}\"]}}}}]"
            ))
            .unwrap(),
            "demo",
            model::Mode {
                tcp: false,
                allow: true,
            },
        )
        .unwrap();
        let outer = principal_ids(&p.principals[0]);
        principal_ids(&outer[0]).iter().map(value_of).collect()
    };
    let exact = ids("https://issuer.example/x/user-1");
    assert_eq!(exact[0].0, "iss");
    assert!(
        exact[0].1.contains("Exact(\"https://issuer.example/x\")"),
        "{exact:?}"
    );
    assert!(exact[1].1.contains("Exact(\"user-1\")"), "{exact:?}");
    let star = ids("*");
    assert_eq!(star.len(), 1);
    assert!(star[0].1.contains("PresentMatch(true)"), "{star:?}");
    let sub_prefix = ids("iss/admin-*");
    assert!(
        sub_prefix[1].1.contains("Prefix(\"admin-\")"),
        "{sub_prefix:?}"
    );
}

const EXT_AUTHZ_SERVICE: &str = r#"---
apiVersion: v1
kind: Service
metadata: {name: ext-authz, namespace: demo}
spec:
  clusterIP: 10.96.0.50
  ports: [{name: http, port: 8000}]
"#;

const PROVIDERS: &str = r#"
extensionProviders:
- name: ext
  envoyExtAuthzHttp:
    service: ext-authz.demo.svc.cluster.local
    port: 8000
    includeRequestHeadersInCheck: [x-ext-authz]
    headersToDownstreamOnDeny: [x-ext-authz-check-result]
    failOpen: false
- name: tracing
  zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}
"#;

#[test]
fn custom_is_a_shadow_rbac_then_ext_authz_before_deny() {
    let yaml = [
        EXT_AUTHZ_SERVICE.to_string(),
        policy(
            "demo",
            "ext",
            "  action: CUSTOM\n  provider: {name: ext}\n  rules: [{to: [{operation: {paths: [\"/headers\"]}}]}]",
        ),
        policy("demo", "deny", "  action: DENY\n  rules: [{to: [{operation: {paths: [\"/admin\"]}}]}]"),
    ]
    .concat();
    let c = ctx(&yaml, PROVIDERS);
    let f = http_filters(&c, &proxy(&[]));
    let names: Vec<&str> = f.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, [RBAC_HTTP, EXT_AUTHZ_HTTP, RBAC_HTTP]);
    let shadow = rbac_of(&f[0]);
    assert!(shadow.rules.is_none());
    assert_eq!(shadow.shadow_rules_stat_prefix, "istio_ext_authz_");
    assert!(
        shadow
            .shadow_rules
            .unwrap()
            .policies
            .contains_key("istio-ext-authz-ns[demo]-policy[ext]-rule[0]")
    );
    let Some(http_filter::ConfigType::TypedConfig(any)) = &f[1].config_type else {
        panic!()
    };
    let ea = ExtAuthz::decode(any.value.as_slice()).unwrap();
    let Some(Services::HttpService(hs)) = &ea.services else {
        panic!("{ea:?}")
    };
    let uri = hs.server_uri.clone().unwrap();
    assert_eq!(uri.uri, "http://ext-authz.demo.svc.cluster.local:8000");
    assert_eq!(
        uri.http_upstream_type,
        Some(http_uri::HttpUpstreamType::Cluster(
            "outbound|8000||ext-authz.demo.svc.cluster.local".into()
        ))
    );
    assert_eq!(ea.allowed_headers.unwrap().patterns.len(), 1);
    let md = ea.filter_enabled_metadata.unwrap();
    assert_eq!(md.filter, RBAC_HTTP);
    assert!(!ea.failure_mode_allow);
}

#[test]
fn custom_with_a_missing_or_unusable_provider_denies_everything() {
    for provider in ["missing", "tracing"] {
        let yaml = [
            EXT_AUTHZ_SERVICE.to_string(),
            policy(
                "demo",
                "ext",
                &format!("  action: CUSTOM\n  provider: {{name: {provider}}}\n  rules: [{{}}]"),
            ),
        ]
        .concat();
        let c = ctx(&yaml, PROVIDERS);
        let f = http_filters(&c, &proxy(&[]));
        assert_eq!(f.len(), 1, "{provider}");
        let rules = rbac_of(&f[0]).rules.unwrap();
        assert_eq!(rules.action, Action::Deny as i32);
        assert_eq!(rules.policies.values().next(), Some(&any_policy()));
        let n = network_filters(&c, &proxy(&[]));
        assert_eq!(
            net_rbac_of(&n[0]).rules.unwrap().action,
            Action::Deny as i32
        );
    }
}

#[test]
fn encoding_is_stable() {
    let yaml: String = (0..20)
        .map(|i| policy("demo", &format!("p{i}"), "  rules: [{}]"))
        .collect();
    let c = ctx(&yaml, "");
    let a = http_filters(&c, &proxy(&[]));
    for _ in 0..5 {
        assert_eq!(http_filters(&c, &proxy(&[])), a);
    }
    assert_eq!(rbac_of(&a[0]).rules.unwrap().policies.len(), 20);
}
