//! Workload identity end to end: istiod's CA signs, pilot-agent serves the
//! certificate to a real Envoy over SDS, Envoy presents it to a TLS client.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::pki;
use proto::istio_ca::IstioCertificateRequest;
use tests::netns::Netns;
use tests::{Istiod, Pod, PodDir, http_get, wait_for};
use tonic::Code;

const ISTIOD_ENV: &[(&str, &str)] = &[("ISTIOD_CUSTOM_HOST", "127.0.0.1")];

fn agent_env<'a>(istiod: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("POD_NAME", "test-1"),
        ("POD_NAMESPACE", "default"),
        ("SERVICE_ACCOUNT", "sleep"),
        ("CA_ADDR", istiod),
        ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
    ];
    env.extend_from_slice(extra);
    env
}

#[test]
fn envoy_serves_the_workload_certificate_istiod_signed() {
    let tmp = tempfile::tempdir().unwrap();
    let ns = Netns::new("pod");
    let istiod = Istiod::start_in(&ns, &tmp.path().join("istiod"), ISTIOD_ENV);
    let root = istiod.root_pem();
    let dir = PodDir::new(
        &tmp.path().join("pod"),
        &istiod.token("default", "sleep"),
        Some(&root),
    );
    let ca = istiod.grpc.to_string();
    let pod = Pod::start(ns, dir, &agent_env(&ca, &[("OUTPUT_CERTS", "./out")]));

    let (info, body) = wait_for("a TLS answer", Duration::from_secs(30), || {
        pod.probe(&root, None).ok()
    });
    // The probe verified the chain against istiod's root; check the identity.
    assert_eq!(
        info.uri_sans,
        vec![SLEEP_ID.to_string()],
        "the leaf's only URI SAN"
    );
    assert!(info.dns_sans.is_empty());
    assert!(!info.is_ca);
    assert!(body.ends_with("hello"), "{body}");
    // Istio's default lifetime (24h), back-dated two minutes.
    let lifetime = info.lifetime().as_secs();
    assert!(
        (86400..=86400 + 130).contains(&lifetime),
        "lifetime {lifetime}s"
    );
    // OUTPUT_CERTS holds the same certificate, the key private to the agent's user.
    let out = pod.dir.dir.join("out");
    let chain = std::fs::read_to_string(out.join("cert-chain.pem")).unwrap();
    let leaf = pki::pem_certs("cert-chain.pem", &chain).unwrap().remove(0);
    assert_eq!(pki::cert_info(&leaf).unwrap().serial, info.serial);
    assert_eq!(
        std::fs::read_to_string(out.join("root-cert.pem")).unwrap(),
        root
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(out.join("key.pem"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    // A different root does not accept it.
    let other = tempfile::tempdir().unwrap();
    let other_istiod = Istiod::start(other.path(), ISTIOD_ENV);
    let err = pod.probe(&other_istiod.root_pem(), None).unwrap_err();
    assert!(
        err.contains("UnknownIssuer") || err.contains("invalid peer certificate"),
        "{err}"
    );
}

#[test]
fn short_lived_certificates_rotate_while_envoy_keeps_running() {
    let tmp = tempfile::tempdir().unwrap();
    let ns = Netns::new("pod");
    let istiod = Istiod::start_in(&ns, &tmp.path().join("istiod"), ISTIOD_ENV);
    let root = istiod.root_pem();
    let dir = PodDir::new(
        &tmp.path().join("pod"),
        &istiod.token("default", "sleep"),
        Some(&root),
    );
    let ca = istiod.grpc.to_string();
    let mut pod = Pod::start(
        ns,
        dir,
        &agent_env(
            &ca,
            &[("SECRET_TTL", "4s"), ("ECC_SIGNATURE_ALGORITHM", "ECDSA")],
        ),
    );
    pod.wait_served(&root, SLEEP_ID, Duration::from_secs(30));
    let envoy_pid = pod.envoy_pid().expect("the agent started Envoy");

    // Requests for 9 s: a 4 s certificate rotates every ~2 s.
    let mut serials = BTreeSet::new();
    let (mut ok, mut failed) = (0, Vec::new());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(9) && ok + failed.len() < 2000 {
        match pod.probe(&root, Some(SLEEP_ID)) {
            Ok((info, body)) if body.ends_with("hello") => {
                ok += 1;
                serials.insert(info.serial);
            }
            Ok((_, body)) => failed.push(format!("bad body {body:?}")),
            Err(e) => failed.push(e),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        ok + failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(
        serials.len() >= 3,
        "expected several rotations, saw serials {serials:?}"
    );
    assert!(pod.agent.alive(), "the agent keeps running");
    assert_eq!(
        pod.envoy_pid(),
        Some(envoy_pid),
        "the same Envoy process serves every certificate"
    );
    let (_, stats) = pod
        .ns
        .run(|| {
            http_get(
                SocketAddr::from(([127, 0, 0, 1], 15000)),
                "/stats?filter=server.hot_restart_epoch",
            )
        })
        .unwrap();
    assert!(stats.contains("server.hot_restart_epoch: 0"), "{stats}");
}

#[test]
fn agent_waits_for_the_ca_and_envoy_gets_its_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let ns = Netns::new("pod");
    // Create istiod's root, then stop istiod: the Pod starts while the CA is down.
    let mut istiod = Istiod::start_in(&ns, &tmp.path().join("istiod"), ISTIOD_ENV);
    let root = istiod.root_pem();
    let token = istiod.token("default", "sleep");
    istiod.stop();
    let dir = PodDir::new(&tmp.path().join("pod"), &token, Some(&root));
    let ca = istiod.grpc.to_string();
    let mut pod = Pod::start(ns, dir, &agent_env(&ca, &[]));

    std::thread::sleep(Duration::from_secs(3));
    assert!(
        pod.agent.alive(),
        "the agent keeps retrying:\n{}",
        pod.agent.log()
    );
    assert!(
        pod.probe(&root, None).is_err(),
        "no certificate yet, so no TLS"
    );
    assert!(
        pod.agent
            .log()
            .contains("no workload certificate yet, retrying"),
        "{}",
        pod.agent.log()
    );

    istiod.restart();
    let info = pod.wait_served(&root, SLEEP_ID, Duration::from_secs(60));
    assert_eq!(info.uri_sans, vec![SLEEP_ID.to_string()]);
}

const SLEEP_ID: &str = "spiffe://cluster.local/ns/default/sa/sleep";

/// A valid CSR for `ns/sa` with a fresh key.
fn csr(ns: &str, sa: &str) -> String {
    let key = pki::generate_key(pki::KeyType::EcdsaP256).unwrap();
    pki::csr_pem(&common::Identity::new("cluster.local", ns, sa), &key).unwrap()
}

fn request(csr: String, ttl: i64, token: Option<&str>) -> tonic::Request<IstioCertificateRequest> {
    let mut r = tonic::Request::new(IstioCertificateRequest {
        csr,
        validity_duration: ttl,
        metadata: None,
    });
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

/// Sends one bad request and checks its gRPC code and message, then checks
/// that istiod still signs a good request.
fn rejected(
    make: impl FnOnce(&Istiod) -> tonic::Request<IstioCertificateRequest>,
    code: Code,
    message: &str,
) {
    let tmp = tempfile::tempdir().unwrap();
    let istiod = Istiod::start(tmp.path(), ISTIOD_ENV);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut client = istiod.ca_client();
        let err = client.create_certificate(make(&istiod)).await.unwrap_err();
        assert_eq!(err.code(), code, "{err:?}");
        assert!(
            err.message().contains(message),
            "{message:?} not in {:?}",
            err.message()
        );
        let token = istiod.token("default", "sleep");
        let ok = client
            .create_certificate(request(csr("default", "sleep"), 0, Some(&token)))
            .await;
        assert!(ok.is_ok(), "istiod must keep serving others: {ok:?}");
    });
}

/// A valid token whose claims are edited after signing, so its signature no longer matches.
fn token_with(istiod: &Istiod, f: impl FnOnce(&mut serde_json::Value)) -> String {
    let good = istiod.token("default", "sleep");
    let mut parts: Vec<String> = good.split('.').map(String::from).collect();
    let mut claims: serde_json::Value = serde_json::from_slice(&b64(&parts[1])).unwrap();
    f(&mut claims);
    parts[1] = b64e(&serde_json::to_vec(&claims).unwrap());
    parts.join(".")
}

fn b64(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .unwrap()
}

fn b64e(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// Mints a token with the issuer's own key through the library, with options.
fn mint(istiod: &Istiod, o: istiod::token::MintOptions) -> String {
    istiod::token::Issuer::load(&istiod.issuer_dir)
        .unwrap()
        .mint(&o)
        .unwrap()
}

fn opts() -> istiod::token::MintOptions {
    istiod::token::MintOptions {
        namespace: "default".into(),
        service_account: "sleep".into(),
        audience: "istio-ca".into(),
        ttl: Duration::from_secs(3600),
        issuer_override: None,
        expired: false,
    }
}

#[test]
fn ca_rejects_a_request_without_token() {
    rejected(
        |_| request(csr("default", "sleep"), 0, None),
        Code::Unauthenticated,
        "no HTTP authorization header",
    );
}

#[test]
fn ca_rejects_an_expired_token() {
    rejected(
        |i| {
            request(
                csr("default", "sleep"),
                0,
                Some(&mint(
                    i,
                    istiod::token::MintOptions {
                        expired: true,
                        ..opts()
                    },
                )),
            )
        },
        Code::Unauthenticated,
        "token has expired",
    );
}

#[test]
fn ca_rejects_a_token_for_another_audience() {
    rejected(
        |i| {
            let t = mint(
                i,
                istiod::token::MintOptions {
                    audience: "vault".into(),
                    ..opts()
                },
            );
            request(csr("default", "sleep"), 0, Some(&t))
        },
        Code::Unauthenticated,
        "audience",
    );
}

#[test]
fn ca_rejects_a_token_from_another_issuer() {
    rejected(
        |i| {
            let t = mint(
                i,
                istiod::token::MintOptions {
                    issuer_override: Some("https://evil.example".into()),
                    ..opts()
                },
            );
            request(csr("default", "sleep"), 0, Some(&t))
        },
        Code::Unauthenticated,
        "issuer",
    );
}

#[test]
fn ca_rejects_a_token_with_a_bad_signature() {
    rejected(
        |i| {
            // Claims edited after signing: namespace escalated to istio-system.
            let t = token_with(i, |c| {
                c["sub"] = "system:serviceaccount:istio-system:istiod".into()
            });
            request(csr("default", "sleep"), 0, Some(&t))
        },
        Code::Unauthenticated,
        "signature",
    );
}

#[test]
fn ca_rejects_a_malformed_csr() {
    rejected(
        |i| {
            request("-----BEGIN CERTIFICATE REQUEST-----\nnonsense\n-----END CERTIFICATE REQUEST-----\n".into(), 0, Some(&i.token("default", "sleep")))
        },
        Code::InvalidArgument,
        "CSR",
    );
}

#[test]
fn ca_rejects_a_csr_with_a_bad_signature() {
    rejected(
        |i| {
            let pem = csr("default", "sleep");
            let der = pki_types_csr_der(&pem);
            let mut bad = der.clone();
            let n = bad.len();
            bad[n - 5] ^= 0xff; // inside the signature
            request(to_csr_pem(&bad), 0, Some(&i.token("default", "sleep")))
        },
        Code::InvalidArgument,
        "CSR",
    );
}

#[test]
fn ca_rejects_a_validity_over_the_maximum() {
    rejected(
        |i| {
            request(
                csr("default", "sleep"),
                91 * 86400,
                Some(&i.token("default", "sleep")),
            )
        },
        Code::InvalidArgument,
        "max allowed TTL",
    );
}

fn pki_types_csr_der(pem: &str) -> Vec<u8> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

fn to_csr_pem(der: &[u8]) -> String {
    use base64::Engine;
    let b = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        lines.join("\n")
    )
}

#[test]
fn csr_for_another_identity_gets_the_callers_own() {
    let tmp = tempfile::tempdir().unwrap();
    let istiod = Istiod::start(tmp.path(), ISTIOD_ENV);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let chain = rt.block_on(async {
        let token = istiod.token("default", "sleep");
        istiod
            .ca_client()
            .create_certificate(request(csr("istio-system", "istiod"), 0, Some(&token)))
            .await
            .unwrap()
            .into_inner()
            .cert_chain
    });
    assert_eq!(chain.len(), 2, "[leaf, root]");
    assert_eq!(chain[1], istiod.root_pem(), "the root comes last");
    let leaf = pki::pem_certs("leaf", &chain[0]).unwrap().remove(0);
    let info = pki::cert_info(&leaf).unwrap();
    assert_eq!(info.uri_sans, vec![SLEEP_ID.to_string()]);
    assert!(!info.uri_sans.iter().any(|u| u.contains("istio-system")));
}

#[test]
fn istiod_restart_keeps_its_root() {
    let tmp = tempfile::tempdir().unwrap();
    let mut istiod = Istiod::start(tmp.path(), ISTIOD_ENV);
    let root_before = istiod.root_pem();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sign = |istiod: &Istiod| {
        rt.block_on(async {
            let token = istiod.token("default", "sleep");
            istiod
                .ca_client()
                .create_certificate(request(csr("default", "sleep"), 0, Some(&token)))
                .await
                .unwrap()
                .into_inner()
                .cert_chain
        })
    };
    let before = sign(&istiod);
    istiod.stop();
    istiod.restart();
    let after = sign(&istiod);
    assert_eq!(istiod.root_pem(), root_before);
    assert_eq!(after.last(), before.last(), "the same root is served");
    // A certificate issued before the restart verifies against the root served after.
    let old_leaf = pki::pem_certs("leaf", &before[0]).unwrap().remove(0);
    let new_root = pki::pem_certs("root", after.last().unwrap())
        .unwrap()
        .remove(0);
    assert!(pki::signed_by(&old_leaf, &new_root));
    common::tls::install_crypto_provider();
    let mut store = rustls::RootCertStore::empty();
    store.add(new_root).unwrap();
    let cert = rustls::server::ParsedCertificate::try_from(&old_leaf).unwrap();
    rustls::client::verify_server_cert_signed_by_trust_anchor(
        &cert,
        &store,
        &[],
        rustls::pki_types::UnixTime::now(),
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .all,
    )
    .unwrap();
}

#[test]
fn file_mounted_certificates_are_served_and_reloaded() {
    let tmp = tempfile::tempdir().unwrap();
    let istiod = Istiod::start(&tmp.path().join("istiod"), ISTIOD_ENV);
    let root = istiod.root_pem();
    let dir = PodDir::new(&tmp.path().join("pod"), "", None);
    let certs = dir.dir.join("etc/certs");
    std::fs::create_dir_all(&certs).unwrap();
    let write = |(chain, key, root): &(String, String, String)| {
        // Replace atomically, as a Secret volume update does.
        for (name, content) in [
            ("key.pem", key),
            ("cert-chain.pem", chain),
            ("root-cert.pem", root),
        ] {
            let tmp = certs.join(format!(".{name}.new"));
            std::fs::write(&tmp, content).unwrap();
            std::fs::rename(&tmp, certs.join(name)).unwrap();
        }
    };
    let first = issue(&istiod);
    write(&first);
    // No CA is reachable from the Pod: file mode must not need one.
    let pod = Pod::start(
        Netns::new("pod"),
        dir,
        &agent_env("127.0.0.1:1", &[("FILE_MOUNTED_CERTS", "true")]),
    );
    let served = pod.wait_served(&root, SLEEP_ID, Duration::from_secs(30));
    let first_serial = pki::cert_info(&pki::pem_certs("c", &first.0).unwrap()[0])
        .unwrap()
        .serial;
    assert_eq!(served.serial, first_serial);

    let second = issue(&istiod);
    write(&second);
    let second_serial = pki::cert_info(&pki::pem_certs("c", &second.0).unwrap()[0])
        .unwrap()
        .serial;
    wait_for(
        "Envoy to serve the replaced certificate",
        Duration::from_secs(15),
        || {
            let (info, _) = pod.probe(&root, Some(SLEEP_ID)).ok()?;
            (info.serial == second_serial).then_some(())
        },
    );
}

#[test]
fn incomplete_plugin_ca_stops_istiod_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let cacerts = tmp.path().join("etc/cacerts");
    std::fs::create_dir_all(&cacerts).unwrap();
    std::fs::write(cacerts.join("ca-cert.pem"), "not yet complete").unwrap();
    let out = std::process::Command::new(tests::bin("istiod"))
        .current_dir(tmp.path())
        .args([
            "discovery",
            "--secureGRPCAddr=127.0.0.1:0",
            "--httpAddr=",
            "--monitoringAddr=",
            "--grpcAddr=",
            "--httpsAddr=",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "istiod must refuse to start");
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(log.contains("ca-key.pem is missing"), "{log}");
}

/// Signs a certificate for default/sleep through the CA and returns (chain, key, root).
fn issue(istiod: &Istiod) -> (String, String, String) {
    let key = pki::generate_key(pki::KeyType::EcdsaP256).unwrap();
    let csr = pki::csr_pem(
        &common::Identity::new("cluster.local", "default", "sleep"),
        &key,
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let token = istiod.token("default", "sleep");
    let chain = rt.block_on(async {
        istiod
            .ca_client()
            .create_certificate(request(csr, 0, Some(&token)))
            .await
            .unwrap()
            .into_inner()
            .cert_chain
    });
    (chain[0].clone(), key.serialize_pem(), chain[1].clone())
}
