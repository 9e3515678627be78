#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use prost::Message;

use super::*;

fn pem_pair(cn: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![cn.to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

fn indent(pem: &str) -> String {
    pem.lines().map(|l| format!("    {l}\n")).collect()
}

/// `gw/tls-cred` (kubernetes.io/tls with ca.crt), `gw/generic` (generic),
/// `gw/generic-cacert` (CA only), `other/theirs`.
fn context() -> (IstioContext, String, String) {
    let (cert, key) = pem_pair("a.example.com");
    let (ca, _) = pem_pair("ca");
    let secret = |ns: &str, name: &str, data: &[(&str, &str)]| {
        let mut s = format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {ns}}}\nstringData:\n"
        );
        for (k, v) in data {
            s.push_str(&format!("  {k}: |\n{}", indent(v)));
        }
        s
    };
    let yaml = [
        secret(
            "gw",
            "tls-cred",
            &[("tls.crt", &cert), ("tls.key", &key), ("ca.crt", &ca)],
        ),
        secret("gw", "generic", &[("cert", &cert), ("key", &key)]),
        secret("gw", "generic-cacert", &[("cacert", &ca)]),
        secret("gw", "no-ca", &[("tls.crt", &cert), ("tls.key", &key)]),
        secret("other", "theirs", &[("tls.crt", &cert), ("tls.key", &key)]),
    ]
    .join("---\n");
    let ctx = crate::pushctx::context::context_of_yaml(&yaml);
    (ctx, cert, ca)
}

fn gateway(ns: &str) -> Proxy {
    Proxy {
        proxy_type: common::ProxyType::Router,
        id: format!("gw-1.{ns}"),
        namespace: ns.into(),
        verified: true,
        ..Default::default()
    }
}

fn names(n: &[&str]) -> BTreeSet<String> {
    n.iter().map(|s| s.to_string()).collect()
}

fn secrets(ctx: &IstioContext, proxy: &Proxy, n: &[&str]) -> Vec<EnvoySecret> {
    build(ctx, proxy, &names(n))
        .iter()
        .map(|r| {
            assert_eq!(r.resource.type_url, crate::xds::SECRET_TYPE);
            EnvoySecret::decode(r.resource.value.as_slice()).unwrap()
        })
        .collect()
}

fn inline_text(d: &Option<DataSource>) -> String {
    match d.as_ref().and_then(|d| d.specifier.as_ref()) {
        Some(data_source::Specifier::InlineBytes(b)) => String::from_utf8(b.clone()).unwrap(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn resource_names_as_istio_parses_them() {
    let sr = |n| parse_resource_name(n, "gw");
    assert_eq!(sr("kubernetes://a").unwrap().key(), "gw/a");
    assert_eq!(sr("kubernetes://ns/a").unwrap().key(), "ns/a");
    assert!(sr("kubernetes://a-cacert").unwrap().ca_only());
    for bad in [
        "a",
        "kubernetes://",
        "kubernetes://a/b/c",
        "file-cert:/x~/y",
    ] {
        assert!(matches!(sr(bad), Err(SdsError::InvalidName(_))), "{bad}");
    }
    assert_eq!(credential_resource("a"), "kubernetes://a");
    assert_eq!(credential_resource("ns/a"), "kubernetes://ns/a");
    assert_eq!(credential_resource("kubernetes://a"), "kubernetes://a");
    assert_eq!(ca_resource("a"), "kubernetes://a-cacert");
    // A CA resource reads the `-cacert` Secret, else the one without it.
    let ca = sr("kubernetes://a-cacert").unwrap();
    assert!(ca.depends_on("gw/a-cacert") && ca.depends_on("gw/a"));
    assert!(!ca.depends_on("other/a"));
}

#[test]
fn certificates_and_cas_from_both_layouts() {
    let (ctx, cert, ca) = context();
    let got = secrets(
        &ctx,
        &gateway("gw"),
        &[
            "kubernetes://tls-cred",
            "kubernetes://gw/generic",
            "kubernetes://tls-cred-cacert",
            "kubernetes://generic-cacert",
        ],
    );
    let by_name: std::collections::BTreeMap<&str, &EnvoySecret> =
        got.iter().map(|s| (s.name.as_str(), s)).collect();
    assert_eq!(by_name.len(), 4, "{:?}", by_name.keys());
    for name in ["kubernetes://tls-cred", "kubernetes://gw/generic"] {
        let Some(secret::Type::TlsCertificate(t)) = &by_name[name].r#type else {
            panic!("{name}");
        };
        assert_eq!(inline_text(&t.certificate_chain), cert);
        assert!(inline_text(&t.private_key).contains("PRIVATE KEY"));
    }
    // `tls-cred-cacert` has no Secret of its own: the CA of `tls-cred`.
    for name in [
        "kubernetes://tls-cred-cacert",
        "kubernetes://generic-cacert",
    ] {
        let Some(secret::Type::ValidationContext(v)) = &by_name[name].r#type else {
            panic!("{name}");
        };
        assert_eq!(inline_text(&v.trusted_ca), ca);
    }
}

#[test]
fn missing_secrets_and_cas_are_left_out() {
    let (ctx, _, _) = context();
    let p = gateway("gw");
    assert!(
        secrets(
            &ctx,
            &p,
            &["kubernetes://nothing", "kubernetes://no-ca-cacert"]
        )
        .is_empty()
    );
    // A CA-only Secret is no certificate.
    assert!(secrets(&ctx, &p, &["kubernetes://generic-cacert-x"]).is_empty());
    let err = generate(&ctx, &p, "kubernetes://no-ca-cacert").unwrap_err();
    assert!(
        err.to_string()
            .contains("expected \"ca.crt\" or \"cacert\""),
        "{err}"
    );
}

#[test]
fn only_verified_proxies_of_the_secret_namespace_get_it() {
    let (ctx, _, _) = context();
    // Another namespace, named explicitly or not.
    let other = gateway("other");
    assert!(secrets(&ctx, &other, &["kubernetes://gw/tls-cred"]).is_empty());
    assert!(matches!(
        generate(&ctx, &other, "kubernetes://gw/tls-cred"),
        Err(SdsError::OtherNamespace { .. })
    ));
    assert_eq!(secrets(&ctx, &other, &["kubernetes://theirs"]).len(), 1);
    assert!(secrets(&ctx, &gateway("gw"), &["kubernetes://other/theirs"]).is_empty());
    // A sidecar of the namespace too (a DestinationRule's
    // `credentialName`), not one of another namespace; and no connection
    // without a proven identity.
    let sidecar = |ns: &str| Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ..gateway(ns)
    };
    assert_eq!(
        secrets(&ctx, &sidecar("gw"), &["kubernetes://tls-cred"]).len(),
        1
    );
    assert!(matches!(
        generate(&ctx, &sidecar("other"), "kubernetes://gw/tls-cred"),
        Err(SdsError::OtherNamespace { .. })
    ));
    let plaintext = Proxy {
        verified: false,
        ..gateway("gw")
    };
    assert_eq!(
        generate(&ctx, &plaintext, "kubernetes://tls-cred").unwrap_err(),
        SdsError::NotVerified
    );
}

#[test]
fn a_changed_secret_reaches_only_the_resources_that_read_it() {
    let watched = names(&[
        "kubernetes://a",
        "kubernetes://a-cacert",
        "kubernetes://b",
        "kubernetes://gw/c",
    ]);
    assert_eq!(
        watching(&watched, "gw", &names(&["gw/a"])),
        names(&["kubernetes://a", "kubernetes://a-cacert"])
    );
    assert_eq!(
        watching(&watched, "gw", &names(&["gw/c", "other/b"])),
        names(&["kubernetes://gw/c"])
    );
    assert!(watching(&watched, "other", &names(&["gw/a"])).is_empty());
}

#[test]
fn gateway_api_secrets_of_another_namespace_need_a_reference_grant() {
    let (cert, key) = pem_pair("cert1.example.com");
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: cert, namespace: cert}}\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(&cert),
        indent(&key)
    );
    let grant = "apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: allow, namespace: cert}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: istio-system}]
  to: [{group: \"\", kind: Secret, name: cert}]
";
    let name = "kubernetes-gateway://cert/cert";
    let without = crate::pushctx::context::context_of_yaml(&secret);
    assert!(secrets(&without, &gateway("istio-system"), &[name]).is_empty());
    let with = crate::pushctx::context::context_of_yaml(&format!("{secret}---\n{grant}"));
    let got = secrets(&with, &gateway("istio-system"), &[name]);
    assert_eq!(got.len(), 1);
    match &got[0].r#type {
        Some(secret::Type::TlsCertificate(t)) => {
            assert_eq!(inline_text(&t.certificate_chain), cert);
        }
        other => panic!("{other:?}"),
    }
    // Only Gateways of the granted namespace, and only routers.
    assert!(secrets(&with, &gateway("default"), &[name]).is_empty());
    let sidecar = Proxy {
        proxy_type: common::ProxyType::Sidecar,
        ..gateway("istio-system")
    };
    assert!(secrets(&with, &sidecar, &[name]).is_empty());
    // The gateway of the Secret's own namespace needs no grant.
    assert_eq!(secrets(&without, &gateway("cert"), &[name]).len(), 1);
    // The namespace is required in a Gateway API name.
    assert!(parse_resource_name("kubernetes-gateway://cert", "cert").is_err());
}

#[test]
fn a_configmap_ca_is_served_to_any_verified_proxy_of_any_namespace() {
    let (ca, _) = pem_pair("backend ca");
    let yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: backend-ca, namespace: demo}}\ndata:\n  ca.crt: |\n{}  mesh: 'not read'\n",
        indent(&ca)
    );
    let ctx = crate::pushctx::context::context_of_yaml(&yaml);
    let sidecar = Proxy {
        proxy_type: common::ProxyType::Sidecar,
        id: "app-1.other".into(),
        namespace: "other".into(),
        verified: true,
        ..Default::default()
    };
    for proxy in [gateway("gw"), sidecar] {
        let got = secrets(
            &ctx,
            &proxy,
            &[
                "configmap://demo/backend-ca-cacert",
                "configmap://demo/backend-ca",
                "configmap://demo/missing-cacert",
                "invalid://-cacert",
            ],
        );
        assert_eq!(got.len(), 2, "only the ConfigMap's two names: {got:?}");
        for s in got {
            let Some(secret::Type::ValidationContext(v)) = s.r#type else {
                panic!("{s:?}");
            };
            assert_eq!(inline_text(&v.trusted_ca), ca);
        }
    }
    let unverified = Proxy {
        verified: false,
        ..gateway("gw")
    };
    assert!(secrets(&ctx, &unverified, &["configmap://demo/backend-ca-cacert"]).is_empty());
    assert_eq!(
        parse_resource_name("configmap://backend-ca", "demo"),
        Err(SdsError::InvalidName("configmap://backend-ca".into())),
        "a ConfigMap resource names its namespace"
    );
}
