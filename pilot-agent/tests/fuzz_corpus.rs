//! The fuzz targets' corpora on stable: every file of
//! `fuzz/corpus/<target>/` (seeds, and inputs that once crashed) through the
//! function the target calls. A panic fails the test, naming the file.
//!
//! The SDS seeds are written by the ignored test at the end:
//! `cargo test -p pilot-agent --test fuzz_corpus -- --ignored write_seeds`.

#![allow(clippy::unwrap_used)]

use common::fuzz_corpus::run;
use prost::Message;

const CRATE: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn dns_corpus_is_handled_without_panicking() {
    run(CRATE, "dns_message", pilot_agent::fuzzing::dns_message);
}

#[test]
fn iptables_corpus_is_parsed_without_panicking() {
    run(
        CRATE,
        "iptables_flags",
        pilot_agent::fuzzing::iptables_flags,
    );
}

#[test]
fn sds_corpus_is_served_without_panicking_or_hanging() {
    run(CRATE, "sds_requests", pilot_agent::fuzzing::sds_requests);
}

#[test]
fn app_probers_corpus_is_read_without_panicking() {
    run(CRATE, "app_probers", pilot_agent::fuzzing::app_probers);
}

#[test]
fn proxy_config_corpus_is_read_without_panicking() {
    run(CRATE, "proxy_config", pilot_agent::fuzzing::proxy_config);
}

#[test]
fn the_dns_target_reaches_the_answering_code() {
    // A known name is answered here, an unknown one left to the upstream,
    // a malformed message answered with an error.
    let seed = |name| common::fuzz_corpus::seed(CRATE, "dns_message", name);
    let known = pilot_agent::fuzzing::dns_answer(&seed("a-httpbin-short"));
    assert!(known.is_some_and(|r| r.windows(4).any(|w| w == [10, 96, 0, 10])));
    assert!(pilot_agent::fuzzing::dns_answer(&seed("a-unknown")).is_none());
    assert!(pilot_agent::fuzzing::dns_answer(&seed("truncated-header")).is_some());
}

#[test]
fn the_sds_target_reaches_the_secrets() {
    let seed = |name| common::fuzz_corpus::seed(CRATE, "sds_requests", name);
    let contains = |bytes: &[u8], s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
    let (body, _) = pilot_agent::fuzzing::sds_response(&seed("default-then-ack-mode2")).unwrap();
    assert!(contains(&body, "BEGIN CERTIFICATE"), "{} bytes", body.len());
    let (_, status) = pilot_agent::fuzzing::sds_response(&seed("no-node-mode2")).unwrap();
    assert_eq!(
        status.as_deref(),
        Some("3"),
        "InvalidArgument without a node"
    );
    let (_, status) = pilot_agent::fuzzing::sds_response(&seed("delta-mode3")).unwrap();
    assert_eq!(
        status.as_deref(),
        Some("12"),
        "DeltaSecrets is Unimplemented"
    );
}

#[test]
fn the_config_targets_accept_istios_own_values() {
    let dir = std::path::Path::new(CRATE).join("../fuzz/corpus");
    let mut checked = 0;
    for (target, accepted) in [
        (
            "proxy_config",
            pilot_agent::fuzzing::proxy_config_accepted as fn(&[u8]) -> bool,
        ),
        ("app_probers", pilot_agent::fuzzing::app_probers_accepted),
    ] {
        for e in std::fs::read_dir(dir.join(target)).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            // Seeds from Istio's goldens, the chart and the injector.
            if [
                "inject-",
                "golden-",
                "mesh-",
                "annotations",
                "prometheus-",
                "location-",
            ]
            .iter()
            .any(|p| name.starts_with(p))
            {
                let data = std::fs::read(e.path()).unwrap();
                assert!(accepted(&data), "{target}/{name} is refused");
                checked += 1;
            }
        }
    }
    assert!(checked > 20, "{checked} seeds checked");
}

fn sds_seeds() -> Vec<(String, Vec<u8>)> {
    use proto::pb::envoy::config::core::v3::Node;
    use proto::pb::envoy::service::discovery::v3::DiscoveryRequest;
    const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
    let node = Node {
        id: "sidecar~198.18.0.2~sleep-1.demo~demo.svc.cluster.local".into(),
        ..Default::default()
    };
    let req = |node: Option<&Node>, names: &[&str], nonce: &str| {
        DiscoveryRequest {
            node: node.cloned(),
            type_url: SECRET.into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
        .encode_to_vec()
    };
    let frame = |mode: u8, messages: &[Vec<u8>]| {
        let mut out = vec![mode];
        if mode & 2 == 0 {
            out.extend(common::grpc_stream::frames(
                messages.iter().map(Vec::as_slice),
            ));
        } else {
            for m in messages {
                out.extend_from_slice(&(m.len() as u16).to_be_bytes());
                out.extend_from_slice(m);
            }
        }
        out
    };
    let n = Some(&node);
    let mut out = Vec::new();
    for mode in [0u8, 2] {
        out.push((
            format!("default-then-ack-mode{mode}"),
            frame(
                mode,
                &[
                    req(n, &["default"], ""),
                    req(None, &["default"], "stale"),
                    req(None, &["default", "ROOTCA"], "x"),
                ],
            ),
        ));
        out.push((
            format!("rootca-mode{mode}"),
            frame(mode, &[req(n, &["ROOTCA"], "")]),
        ));
        out.push((
            format!("unknown-name-mode{mode}"),
            frame(mode, &[req(n, &["file-cert:/etc/x"], "")]),
        ));
        out.push((
            format!("no-node-mode{mode}"),
            frame(mode, &[req(None, &["default"], "")]),
        ));
        out.push((
            format!("unsubscribe-mode{mode}"),
            frame(mode, &[req(n, &["default"], ""), req(None, &[], "")]),
        ));
    }
    out.push(("delta-mode3".into(), frame(3, &[req(n, &["default"], "")])));
    out
}

/// Writes the generated SDS seeds into `fuzz/corpus/sds_requests` (run by
/// hand when the request shapes change; the files are checked in).
#[test]
#[ignore]
fn write_seeds() {
    let dir = std::path::Path::new(CRATE).join("../fuzz/corpus/sds_requests");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in sds_seeds() {
        std::fs::write(dir.join(name), data).unwrap();
    }
}
