//! The fuzz targets' corpora on stable: every file of
//! `fuzz/corpus/<target>/` (seeds, and inputs that once crashed) through
//! the function the target calls. A panic fails the test, naming the file.
//!
//! The generated seeds are written by the ignored test at the end:
//! `cargo test -p istiod --test fuzz_corpus -- --ignored write_seeds`.

#![allow(clippy::unwrap_used)]

use common::fuzz_corpus::run;
use prost::Message;

const CRATE: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn config_corpus_decodes_without_panicking() {
    run(CRATE, "config", istiod::fuzzing::config);
}

#[test]
fn mesh_config_corpus_is_read_without_panicking() {
    run(CRATE, "mesh_config", istiod::fuzzing::mesh_config);
}

#[test]
fn xds_requests_corpus_is_served_without_panicking_or_hanging() {
    run(CRATE, "xds_requests", istiod::fuzzing::xds_requests);
}

#[test]
fn ca_csr_corpus_is_handled_without_panicking() {
    run(CRATE, "ca_csr", istiod::fuzzing::ca_csr);
}

mod seeds {
    use super::*;
    use proto::pb::envoy::config::core::v3::Node;
    use proto::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
    use proto::pb::google::rpc::Status;

    const T: &str = "type.googleapis.com/envoy.config";

    /// The node of the sample's sleep sidecar, and of Istio's bootstrap golden.
    fn nodes() -> Vec<Node> {
        let golden: serde_json::Value = serde_json::from_str(include_str!(
            "../../pilot-agent/tests/testdata/bootstrap/running_golden.json"
        ))
        .unwrap();
        let node = |id: &str, metadata: serde_json::Value| Node {
            id: id.into(),
            cluster: "sleep.demo".into(),
            metadata: Some(common::node_metadata::json_to_struct(
                metadata.as_object().unwrap().clone(),
            )),
            ..Default::default()
        };
        vec![
            node(
                "sidecar~198.18.0.2~sleep-1.demo~demo.svc.cluster.local",
                serde_json::json!({"NAMESPACE": "demo", "INSTANCE_IPS": "198.18.0.2",
                    "LABELS": {"app": "sleep"}, "DNS_CAPTURE": "true", "PROXY_CONFIG": {"statusPort": 15020}}),
            ),
            node(
                golden["node"]["id"].as_str().unwrap(),
                golden["node"]["metadata"].clone(),
            ),
            node(
                "router~198.18.0.9~ingress-1.istio-system~istio-system.svc.cluster.local",
                serde_json::json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}}),
            ),
        ]
    }

    fn sotw(node: Option<&Node>, t: &str, names: &[&str], nonce: &str) -> Vec<u8> {
        DiscoveryRequest {
            node: node.cloned(),
            type_url: t.into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    pub fn xds() -> Vec<(String, Vec<u8>)> {
        let cds = format!("{T}.cluster.v3.Cluster");
        let lds = format!("{T}.listener.v3.Listener");
        let eds = format!("{T}.endpoint.v3.ClusterLoadAssignment");
        let rds = format!("{T}.route.v3.RouteConfiguration");
        let nds = "type.googleapis.com/istio.networking.nds.v1.NameTable";
        let mut out = Vec::new();
        for (i, node) in nodes().iter().enumerate() {
            let n = Some(node);
            let sequence = vec![
                sotw(n, &cds, &[], ""),
                sotw(
                    None,
                    &eds,
                    &["outbound|8000||httpbin.demo.svc.cluster.local"],
                    "",
                ),
                sotw(None, &lds, &[], ""),
                sotw(
                    None,
                    &rds,
                    &["8000", "httpbin.demo.svc.cluster.local:8000"],
                    "",
                ),
                sotw(None, nds, &[], ""),
                sotw(None, &cds, &[], "stale-nonce"),
                DiscoveryRequest {
                    type_url: lds.clone(),
                    response_nonce: "n".into(),
                    error_detail: Some(Status {
                        code: 13,
                        message: "rejected".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
                .encode_to_vec(),
                sotw(None, &eds, &[], "n"),
            ];
            for mode in [0, 2] {
                out.push((
                    format!("sotw-{i}-mode{mode}"),
                    istiod::fuzzing::xds_seed(mode, &sequence),
                ));
            }
            let debug = vec![
                sotw(n, "istio.io/debug/syncz", &[], ""),
                sotw(None, "istio.io/debug/config_dump", &[&node.id], ""),
            ];
            out.push((format!("debug-{i}"), istiod::fuzzing::xds_seed(2, &debug)));
            let delta = vec![
                DeltaDiscoveryRequest {
                    node: Some(node.clone()),
                    type_url: cds.clone(),
                    ..Default::default()
                }
                .encode_to_vec(),
                DeltaDiscoveryRequest {
                    type_url: eds.clone(),
                    resource_names_subscribe: vec![
                        "outbound|8000||httpbin.demo.svc.cluster.local".into(),
                    ],
                    ..Default::default()
                }
                .encode_to_vec(),
                DeltaDiscoveryRequest {
                    type_url: eds.clone(),
                    resource_names_unsubscribe: vec![
                        "outbound|8000||httpbin.demo.svc.cluster.local".into(),
                    ],
                    response_nonce: "n".into(),
                    ..Default::default()
                }
                .encode_to_vec(),
                DeltaDiscoveryRequest {
                    type_url: lds.clone(),
                    initial_resource_versions: [("virtualOutbound".to_string(), "v1".to_string())]
                        .into_iter()
                        .collect(),
                    ..Default::default()
                }
                .encode_to_vec(),
            ];
            for mode in [1, 3] {
                out.push((
                    format!("delta-{i}-mode{mode}"),
                    istiod::fuzzing::xds_seed(mode, &delta),
                ));
            }
        }
        out.push((
            "no-node".into(),
            istiod::fuzzing::xds_seed(0, &[sotw(None, &cds, &[], "")]),
        ));
        out.push(("truncated-frame".into(), vec![0, 0, 0, 0, 0, 200, 1, 2, 3]));
        out.push(("compressed-flag".into(), vec![0, 1, 0, 0, 0, 1, 0]));
        out
    }

    pub fn ca() -> Vec<(String, Vec<u8>)> {
        use common::pki::{KeyType, csr_pem, generate_key};
        let mut out = Vec::new();
        let asked = common::Identity::new("cluster.local", "other", "admin");
        for (name, kind) in [("ec", KeyType::EcdsaP256), ("rsa", KeyType::Rsa(2048))] {
            let pem = csr_pem(&asked, &generate_key(kind).unwrap()).unwrap();
            let der = rustls_pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
                .map(|d: rustls_pki_types::CertificateSigningRequestDer<'_>| d.as_ref().to_vec())
                .unwrap();
            out.push((
                format!("csr-pem-{name}"),
                [&[0u8][..], pem.as_bytes()].concat(),
            ));
            out.push((format!("csr-der-{name}"), [&[1u8][..], &der].concat()));
        }
        let dir = tempfile::tempdir().unwrap();
        let issuer = istiod::token::Issuer::create(dir.path(), "https://issuer.fuzz").unwrap();
        let token = issuer
            .mint(&istiod::token::MintOptions {
                namespace: "demo".into(),
                service_account: "sleep".into(),
                audience: "istio-ca".into(),
                ttl: std::time::Duration::from_secs(10 * 365 * 86400),
                issuer_override: None,
                expired: false,
            })
            .unwrap();
        out.push((
            "jwt-other-key".into(),
            [&[2u8][..], token.as_bytes()].concat(),
        ));
        out.push((
            "jwt-garbage".into(),
            b"\x02eyJhbGciOiJFUzI1NiJ9.e30.sig".to_vec(),
        ));
        let key = generate_key(KeyType::EcdsaP256).unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = vec![rcgen::SanType::URI(
            "spiffe://cluster.local/ns/demo/sa/sleep"
                .try_into()
                .unwrap(),
        )];
        let cert = params.self_signed(&key).unwrap();
        out.push((
            "client-cert".into(),
            [&[3u8][..], cert.der().as_ref()].concat(),
        ));
        out.push((
            "jwt-rule".into(),
            br#"{"issuer":"https://issuer.fuzz","jwks_uri":"file:///nonexistent/jwks.json","audiences":["istio-ca"]}"#
                .iter()
                .fold(vec![4u8], |mut v, b| {
                    v.push(*b);
                    v
                }),
        ));
        out.push((
            "token-review".into(),
            [&[5u8][..], br#"{"authenticated":true,"audiences":["istio-ca"],"user":{"username":"system:serviceaccount:demo:sleep","groups":["system:serviceaccounts"]}}"#].concat(),
        ));
        out
    }
}

/// Writes the generated seeds into `fuzz/corpus/` (run by hand when the
/// request shapes change; the files are checked in).
#[test]
#[ignore]
fn write_seeds() {
    for (target, seeds) in [("xds_requests", seeds::xds()), ("ca_csr", seeds::ca())] {
        let dir = std::path::Path::new(CRATE)
            .join("../fuzz/corpus")
            .join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, data) in seeds {
            std::fs::write(dir.join(name), data).unwrap();
        }
    }
}

#[test]
fn the_xds_target_reaches_generation_on_both_protocols() {
    let seed = |name| common::fuzz_corpus::seed(CRATE, "xds_requests", name);
    let contains = |bytes: &[u8], s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
    for name in [
        "sotw-0-mode0",
        "sotw-0-mode2",
        "delta-0-mode1",
        "delta-1-mode3",
    ] {
        let (body, _) = istiod::fuzzing::xds_response(&seed(name)).unwrap();
        assert!(
            contains(&body, "outbound|8000||httpbin.demo.svc.cluster.local"),
            "{name}: no httpbin cluster in the {} response bytes",
            body.len()
        );
    }
    // A stream without a node is refused with InvalidArgument (3).
    let (_, status) = istiod::fuzzing::xds_response(&seed("no-node")).unwrap();
    assert_eq!(status.as_deref(), Some("3"));
}

#[test]
fn the_ca_target_issues_for_good_csrs_only() {
    let seed = |name| common::fuzz_corpus::seed(CRATE, "ca_csr", name);
    for name in ["csr-pem-ec", "csr-pem-rsa", "csr-der-ec", "csr-der-rsa"] {
        assert!(istiod::fuzzing::ca_csr_issued(&seed(name)), "{name}");
    }
    let mut cut = seed("csr-der-ec");
    cut.truncate(cut.len() / 2);
    assert!(!istiod::fuzzing::ca_csr_issued(&cut));
}
