#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use prost::Message;
use proto::pb::envoy::config::core::v3::transport_socket;
use proto::pb::envoy::config::listener::v3::filter;
use proto::pb::envoy::config::listener::v3::{FilterChain, Listener};
use proto::pb::envoy::config::route::v3::{RouteConfiguration, virtual_host};
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};

use super::*;
use crate::pushctx::Proxy;
use crate::pushctx::context::IstioContext;

const CONFIG: &str = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["demo/a.example.com"]
    tls: {httpsRedirect: true}
  - port: {number: 8080, name: http2, protocol: HTTP}
    hosts: ["b.example.com"]
  - port: {number: 443, name: https, protocol: HTTPS}
    hosts: ["demo/a.example.com", "*.example.org"]
    tls:
      mode: SIMPLE
      credentialName: a-cred
      minProtocolVersion: TLSV1_2
      maxProtocolVersion: TLSV1_3
      cipherSuites: [ECDHE-RSA-AES128-GCM-SHA256]
      ecdhCurves: [X25519]
  - port: {number: 443, name: mtls, protocol: HTTPS}
    hosts: ["m.example.com"]
    tls:
      mode: MUTUAL
      credentialNames: [rsa, ecdsa]
      caCertCredentialName: clients
      subjectAltNames: [client.example.com, "spiffe://td/ns/x/sa/y"]
      verifyCertificateHash: [AB]
  - port: {number: 443, name: optional, protocol: HTTPS}
    hosts: ["o.example.com"]
    tls: {mode: OPTIONAL_MUTUAL, credentialName: o}
  - port: {number: 443, name: files, protocol: HTTPS}
    hosts: ["f.example.com"]
    tls: {mode: MUTUAL, serverCertificate: /etc/c.pem, privateKey: /etc/k.pem, caCertificates: /etc/ca.pem}
  - port: {number: 443, name: istio, protocol: HTTPS}
    hosts: ["*"]
    tls: {mode: ISTIO_MUTUAL, subjectAltNames: ["spiffe://cluster.local/ns/x/sa/y"]}
  - port: {number: 443, name: dup, protocol: HTTPS}
    hosts: ["*"]
    tls: {mode: SIMPLE, credentialName: dup}
  - port: {number: 8443, name: https-alone, protocol: HTTPS}
    hosts: ["*"]
    tls: {mode: SIMPLE, credentialName: x}
  - port: {number: 8443, name: plain-on-tls, protocol: HTTP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: a, namespace: demo}
spec:
  hosts: [a.example.com, b.example.com]
  gateways: [istio-system/ingress]
  http:
  - route:
    - destination: {host: httpbin}
"#;

fn context() -> IstioContext {
    crate::pushctx::context::context_of_yaml(CONFIG)
}

fn router() -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Router,
        ip: "198.18.0.20".into(),
        ips: vec!["198.18.0.20".into()],
        namespace: "istio-system".into(),
        labels: [("istio".to_string(), "ingressgateway".to_string())].into(),
        ..Default::default()
    }
}

fn listeners(ctx: &IstioContext) -> Vec<Listener> {
    crate::xds::lds::build(ctx, &router())
        .iter()
        .map(|r| Listener::decode(r.resource.value.as_slice()).unwrap())
        .collect()
}

fn tls_of(chain: &FilterChain) -> DownstreamTlsContext {
    let Some(transport_socket::ConfigType::TypedConfig(any)) = chain
        .transport_socket
        .as_ref()
        .and_then(|t| t.config_type.clone())
    else {
        panic!("no TLS on {chain:?}");
    };
    DownstreamTlsContext::decode(any.value.as_slice()).unwrap()
}

fn route_of(chain: &FilterChain) -> String {
    let Some(filter::ConfigType::TypedConfig(any)) = chain.filters[0].config_type.clone() else {
        panic!();
    };
    let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    match hcm.route_specifier {
        Some(http_connection_manager::RouteSpecifier::Rds(r)) => r.route_config_name,
        other => panic!("{other:?}"),
    }
}

fn sds_names(configs: &[SdsSecretConfig]) -> Vec<&str> {
    configs.iter().map(|c| c.name.as_str()).collect()
}

fn combined_of(
    ctx: &CommonTlsContext,
) -> &common_tls_context::CombinedCertificateValidationContext {
    match &ctx.validation_context_type {
        Some(common_tls_context::ValidationContextType::CombinedValidationContext(c)) => c,
        other => panic!("{other:?}"),
    }
}

#[test]
fn https_ports_get_one_sni_chain_per_server_and_istio_route_names() {
    let ctx = context();
    let ls = listeners(&ctx);
    let names: Vec<&str> = ls.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["0.0.0.0_443", "0.0.0.0_8080", "0.0.0.0_8443"]);
    let https = &ls[0];
    assert_eq!(
        https
            .listener_filters
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        ["envoy.filters.listener.tls_inspector"]
    );
    let chains: Vec<(Vec<String>, String)> = https
        .filter_chains
        .iter()
        .map(|c| {
            (
                c.filter_chain_match
                    .clone()
                    .unwrap_or_default()
                    .server_names,
                route_of(c),
            )
        })
        .collect();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        chains,
        [
            (
                s(&["*.example.org", "a.example.com"]),
                "https.443.https.ingress.istio-system".into()
            ),
            (
                s(&["m.example.com"]),
                "https.443.mtls.ingress.istio-system".into()
            ),
            (
                s(&["o.example.com"]),
                "https.443.optional.ingress.istio-system".into()
            ),
            (
                s(&["f.example.com"]),
                "https.443.files.ingress.istio-system".into()
            ),
            // `*`: no SNI match; the second `*` server duplicates it and is left out.
            (s(&[]), "https.443.istio.ingress.istio-system".into()),
        ]
    );
    // Plain HTTP stays `http.<port>`, without a TLS inspector; a plain
    // server on a TLS port is left out.
    assert!(ls[1].listener_filters.is_empty());
    assert_eq!(route_of(&ls[1].filter_chains[0]), "http.8080");
    assert_eq!(ls[2].filter_chains.len(), 1);
    assert_eq!(
        route_of(&ls[2].filter_chains[0]),
        "https.8443.https-alone.ingress.istio-system"
    );
    let rds = crate::xds::lds::route_names(&ctx, &router());
    assert!(rds.contains("http.8080") && rds.contains("https.443.mtls.ingress.istio-system"));
    assert!(
        !rds.iter()
            .any(|n| n.contains("plain-on-tls") || n.contains("dup"))
    );
}

#[test]
fn tls_contexts_per_mode() {
    let ctx = context();
    let ls = listeners(&ctx);
    let chains = &ls[0].filter_chains;

    // SIMPLE with credentialName: SDS over ADS, parameters, no client check.
    let simple = tls_of(&chains[0]);
    let c = simple.common_tls_context.as_ref().unwrap();
    assert_eq!(
        sds_names(&c.tls_certificate_sds_secret_configs),
        ["kubernetes://a-cred"]
    );
    assert!(matches!(
        c.tls_certificate_sds_secret_configs[0]
            .sds_config
            .as_ref()
            .unwrap()
            .config_source_specifier,
        Some(proto::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier::Ads(_))
    ));
    assert!(c.validation_context_type.is_none());
    assert_eq!(c.alpn_protocols, ["h2", "http/1.1"]);
    let p = c.tls_params.as_ref().unwrap();
    assert_eq!(
        (
            p.tls_minimum_protocol_version,
            p.tls_maximum_protocol_version
        ),
        (TlsProtocol::TlSv12 as i32, TlsProtocol::TlSv13 as i32)
    );
    assert_eq!(p.cipher_suites, ["ECDHE-RSA-AES128-GCM-SHA256"]);
    assert_eq!(p.ecdh_curves, ["X25519"]);
    assert!(!simple.require_client_certificate.unwrap().value);

    // MUTUAL with two credentials and a separate CA Secret.
    let mutual = tls_of(&chains[1]);
    assert!(mutual.require_client_certificate.unwrap().value);
    let c = mutual.common_tls_context.as_ref().unwrap();
    assert_eq!(
        sds_names(&c.tls_certificate_sds_secret_configs),
        ["kubernetes://rsa", "kubernetes://ecdsa"]
    );
    let v = combined_of(c);
    assert_eq!(
        v.validation_context_sds_secret_config
            .as_ref()
            .unwrap()
            .name,
        "kubernetes://clients-cacert"
    );
    let d = v.default_validation_context.as_ref().unwrap();
    assert_eq!(d.match_typed_subject_alt_names.len(), 2);
    assert_eq!(
        d.match_typed_subject_alt_names[1].san_type,
        subject_alt_name_matcher::SanType::Uri as i32
    );
    assert_eq!(d.verify_certificate_hash, ["AB"]);
    assert!(c.tls_params.is_none());

    // OPTIONAL_MUTUAL: the CA from `<credential>-cacert`, a certificate not required.
    let optional = tls_of(&chains[2]);
    assert!(!optional.require_client_certificate.unwrap().value);
    let c = optional.common_tls_context.as_ref().unwrap();
    assert_eq!(
        combined_of(c)
            .validation_context_sds_secret_config
            .as_ref()
            .unwrap()
            .name,
        "kubernetes://o-cacert"
    );

    // Files: paths inline.
    let files = tls_of(&chains[3]);
    let c = files.common_tls_context.as_ref().unwrap();
    let file_of = |d: &Option<DataSource>| match d.as_ref().and_then(|d| d.specifier.clone()) {
        Some(data_source::Specifier::Filename(f)) => f,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        file_of(&c.tls_certificates[0].certificate_chain),
        "/etc/c.pem"
    );
    assert_eq!(file_of(&c.tls_certificates[0].private_key), "/etc/k.pem");
    let Some(common_tls_context::ValidationContextType::ValidationContext(v)) =
        &c.validation_context_type
    else {
        panic!()
    };
    assert_eq!(file_of(&v.trusted_ca), "/etc/ca.pem");

    // ISTIO_MUTUAL: the agent's workload certificate and root.
    let istio = tls_of(&chains[4]);
    assert!(istio.require_client_certificate.unwrap().value);
    let c = istio.common_tls_context.as_ref().unwrap();
    assert_eq!(
        sds_names(&c.tls_certificate_sds_secret_configs),
        ["default"]
    );
    let v = combined_of(c);
    assert_eq!(
        v.validation_context_sds_secret_config
            .as_ref()
            .unwrap()
            .name,
        "ROOTCA"
    );
    assert_eq!(
        v.default_validation_context
            .as_ref()
            .unwrap()
            .match_typed_subject_alt_names
            .len(),
        1
    );
}

#[test]
fn https_redirect_and_https_route_configs() {
    let ctx = context();
    let names: BTreeSet<String> = crate::xds::lds::route_names(&ctx, &router());
    let rcs: Vec<RouteConfiguration> = crate::xds::rds::build(&ctx, &router(), &names)
        .iter()
        .map(|r| RouteConfiguration::decode(r.resource.value.as_slice()).unwrap())
        .collect();
    let by_name = |n: &str| rcs.iter().find(|r| r.name == n).unwrap();
    let http = by_name("http.8080");
    let vh: Vec<(&str, i32)> = http
        .virtual_hosts
        .iter()
        .map(|v| (v.name.as_str(), v.require_tls))
        .collect();
    assert_eq!(
        vh,
        [
            (
                "a.example.com:8080",
                virtual_host::TlsRequirementType::All as i32
            ),
            (
                "b.example.com:8080",
                virtual_host::TlsRequirementType::None as i32
            ),
        ]
    );
    // The HTTPS server's own route configuration: only its hosts.
    let https = by_name("https.443.https.ingress.istio-system");
    let domains: Vec<&str> = https
        .virtual_hosts
        .iter()
        .flat_map(|v| v.domains.iter().map(String::as_str))
        .collect();
    assert_eq!(domains, ["a.example.com"]);
    // A server no VirtualService reaches answers 404.
    let m = by_name("https.443.mtls.ingress.istio-system");
    assert_eq!(m.virtual_hosts[0].name, "blackhole:443");
}

#[test]
fn a_ca_resource_named_by_the_gateway_api_is_used_as_it_is() {
    // frontendValidation with a ConfigMap CA: the translation names the CA
    // resource itself, `configmap://<ns>/<name>-cacert`, as Istio does.
    let ctx = crate::pushctx::context::context_of_yaml(
        r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 443, name: mtls, protocol: HTTPS}
    hosts: ["m.example.com"]
    tls: {mode: MUTUAL, credentialName: "kubernetes-gateway://istio-system/cert", caCertCredentialName: "configmap://demo/clients-cacert"}
"#,
    );
    let listeners = listeners(&ctx);
    let chain = &listeners
        .iter()
        .find(|l| l.name.contains("443"))
        .unwrap()
        .filter_chains[0];
    let tls = tls_of(chain);
    let v = combined_of(tls.common_tls_context.as_ref().unwrap());
    assert_eq!(
        v.validation_context_sds_secret_config
            .as_ref()
            .unwrap()
            .name,
        "configmap://demo/clients-cacert"
    );
}
