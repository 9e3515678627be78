//! The CA root on Kubernetes: replicas share `istio-ca-secret`, restarts
//! keep it, and a root in its grace period is rotated with the old and new
//! roots both handed out.
//!
//! End to end (istiod processes on the Kubernetes API stand-in): run under
//! the machine-wide lock,
//! `flock /tmp/mesh-e2e.lock cargo test -p tests --test ca_rotation -- --test-threads=1`.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::fault::control_plane::sleep_traffic;
use tests::fault::{Outcome, failures};
use tests::kube_api::KubeApi;
use tests::{ISTIOD_SAN, Istiod, wait_for};

const SECRETS: &str = "/api/v1/namespaces/istio-system/secrets";
/// The longest the background traffic is waited for.
const TRAFFIC_WAIT: Duration = Duration::from_secs(60);

/// `(successful, failed)` requests, each failure printed.
fn tally(outcomes: &[Outcome]) -> (usize, usize) {
    let failed = failures(outcomes);
    for f in &failed {
        eprintln!("failed request: {f}");
    }
    (outcomes.len() - failed.len(), failed.len())
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

/// A stand-in with `istio-system` and `demo`, and its kubeconfig.
fn cluster(dir: &Path) -> (KubeApi, std::path::PathBuf) {
    let api = KubeApi::start_local();
    api.create(namespace("istio-system")).unwrap();
    api.create(namespace("demo")).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    api.kubeconfig(&kubeconfig);
    (api, kubeconfig)
}

fn start(dir: &Path, kubeconfig: &Path, extra: &[(&str, &str)]) -> Istiod {
    let kc = kubeconfig.display().to_string();
    let mut env = vec![
        ("TEST_ISTIOD_KUBECONFIG", kc.as_str()),
        ("POD_NAMESPACE", "istio-system"),
    ];
    env.extend_from_slice(extra);
    Istiod::start(dir, &env)
}

/// The CSR response chain istiod at `istiod` gives `demo/sleep`, trusting
/// `root` for istiod's own certificate.
fn sign(istiod: &Istiod, root: &str) -> Vec<String> {
    common::tls::install_crypto_provider();
    let token = istiod.token("demo", "sleep");
    let grpc = istiod.grpc;
    let root = root.to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let source: common::tls::ClientConfigSource = Arc::new(move || {
            let store = common::tls::root_store("root", &root)?;
            Ok(Arc::new(common::tls::grpc_client_config(store, None)?))
        });
        let name = rustls_pki_types::ServerName::try_from(ISTIOD_SAN).unwrap();
        let channel = common::tls::grpc_channel(
            &grpc.to_string(),
            Some((source, name)),
            Duration::from_secs(5),
        )
        .unwrap();
        let key = common::pki::generate_key(common::pki::KeyType::EcdsaP256).unwrap();
        let id = common::Identity::new("cluster.local", "demo", "sleep");
        let mut req = tonic::Request::new(proto::istio_ca::IstioCertificateRequest {
            csr: common::pki::csr_pem(&id, &key).unwrap(),
            validity_duration: 3600,
            metadata: None,
        });
        req.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let mut ca =
            proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient::new(
                channel,
            );
        ca.create_certificate(req)
            .await
            .expect("istiod signs the CSR")
            .into_inner()
            .cert_chain
    })
}

fn secret(api: &KubeApi) -> Value {
    api.get("v1", "Secret", "istio-system", "istio-ca-secret")
        .expect("istio-ca-secret exists")
}

fn secret_key(secret: &Value, key: &str) -> String {
    use base64::Engine;
    let b64 = secret["data"][key].as_str().unwrap_or_default();
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
    .unwrap()
}

/// The leaf of `chain` is signed by the first certificate of `root_pem`.
fn chains_to(chain: &[String], root_pem: &str) -> bool {
    let leaf = common::pki::pem_certs("leaf", &chain[0]).unwrap().remove(0);
    let root = common::pki::pem_certs("root", root_pem).unwrap().remove(0);
    common::pki::signed_by(&leaf, &root)
}

#[test]
fn two_istiods_create_the_root_once_and_keep_it_across_restarts() {
    let _mesh = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let (api, kubeconfig) = cluster(tmp);

    // Both start at once: they race to create istio-ca-secret. Each is
    // spawned by a thread that lives until the test ends (a child dies with
    // the thread that spawned it).
    let (hold, held) = std::sync::mpsc::channel::<()>();
    let held = Arc::new(std::sync::Mutex::new(held));
    let spawn = |name: &str| {
        let (dir, kc, held) = (tmp.join(name), kubeconfig.clone(), held.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            tx.send(start(&dir, &kc, &[])).unwrap();
            let _ = held.lock().map(|h| h.recv());
        });
        rx
    };
    let (a, b) = (spawn("a"), spawn("b"));
    let (mut a, mut b) = (a.recv().unwrap(), b.recv().unwrap());

    let stored = secret(&api);
    assert_eq!(stored["type"], "istio.io/ca-root");
    let keys: Vec<&str> = stored["data"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "ca-cert.pem",
            "ca-key.pem",
            "cert-chain.pem",
            "key.pem",
            "root-cert.pem"
        ]
    );
    let root = secret_key(&stored, "root-cert.pem");
    let uid = stored["metadata"]["uid"].clone();
    let version = stored["metadata"]["resourceVersion"].clone();
    let writes = |api: &KubeApi| {
        api.requests()
            .into_iter()
            .filter(|r| r.path.starts_with(SECRETS) && r.method != "GET")
            .map(|r| format!("{} {} {}", r.method, r.path, r.status.unwrap_or(0)))
            .collect::<Vec<_>>()
    };
    // One create won (201); a loser's create, if it came, got 409
    // AlreadyExists; nothing else was written.
    let first = writes(&api);
    assert!(
        first
            .iter()
            .all(|w| w.starts_with(&format!("POST {SECRETS} "))),
        "{first:?}"
    );
    assert_eq!(
        first.iter().filter(|w| w.ends_with(" 201")).count(),
        1,
        "exactly one create of istio-ca-secret succeeds: {first:?}"
    );
    assert!(
        first
            .iter()
            .filter(|w| !w.ends_with(" 201"))
            .all(|w| w.ends_with(" 409")),
        "a losing create gets 409 AlreadyExists: {first:?}"
    );

    // Certificates from either istiod chain to that one root, and both hand it out.
    for istiod in [&a, &b] {
        let chain = sign(istiod, &root);
        assert_eq!(
            chain.last().unwrap(),
            &root,
            "the CSR response ends with the root"
        );
        assert!(chains_to(&chain, &root));
    }

    // Both restart: the root and the Secret are unchanged, nothing is written.
    a.restart();
    b.restart();
    for istiod in [&mut a, &mut b] {
        assert!(istiod.proc.alive(), "istiod exited:\n{}", istiod.proc.log());
    }
    for istiod in [&a, &b] {
        let chain = sign(istiod, &root);
        assert!(chains_to(&chain, &root));
        assert_eq!(chain.last().unwrap(), &root);
    }
    let after = secret(&api);
    assert_eq!(
        after["metadata"]["uid"], uid,
        "the Secret was not re-created"
    );
    assert_eq!(
        after["metadata"]["resourceVersion"], version,
        "the Secret was not rewritten"
    );
    assert_eq!(writes(&api), first, "restarts write no Secret");
    drop(hold);
}

/// A root with most of its life gone, as `istio-ca-secret` holds it.
fn aging_root(lifetime: Duration, gone: Duration) -> (String, String) {
    let key = common::pki::generate_key(common::pki::KeyType::Rsa(2048)).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let start = now - gone;
    let mut params = common::pki::root_ca_params("cluster.local", start, start + lifetime);
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&[0x11, 0x22, 0x33]));
    (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
}

#[test]
fn a_root_in_its_grace_period_is_rotated_and_both_roots_are_handed_out() {
    use base64::Engine;
    let _mesh = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let (api, kubeconfig) = cluster(tmp.path());
    // 9 of 10 days gone: inside Istio's default 20% grace period.
    let (old_root, key) = aging_root(
        Duration::from_secs(10 * 86400),
        Duration::from_secs(9 * 86400),
    );
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    api.create(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "istio.io/ca-root",
        "metadata": {"name": "istio-ca-secret", "namespace": "istio-system"},
        "data": {
            "ca-cert.pem": b64(&old_root), "ca-key.pem": b64(&key), "cert-chain.pem": "",
            "key.pem": "", "root-cert.pem": b64(&old_root),
        }
    }))
    .unwrap();
    let istiod = start(
        &tmp.path().join("istiod"),
        &kubeconfig,
        &[
            ("CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL", "1s"),
            ("CITADEL_ENABLE_JITTER_FOR_ROOT_CERT_ROTATOR", "false"),
        ],
    );
    let started = std::time::Instant::now();
    let new_root = wait_for("istiod rotates the root", Duration::from_secs(30), || {
        let ca_cert = secret_key(&secret(&api), "ca-cert.pem");
        (ca_cert != old_root).then_some(ca_cert)
    });
    let listed = secret_key(&secret(&api), "root-cert.pem");
    assert_eq!(
        listed,
        format!("{new_root}{old_root}"),
        "root-cert.pem lists the new root, then the old"
    );
    assert_eq!(
        secret_key(&secret(&api), "ca-key.pem"),
        key,
        "the key is kept"
    );

    // The CSR response carries both roots; the leaf verifies under either
    // (same key and subject), so workloads holding only the old root keep talking.
    let chain = wait_for(
        "CSR responses carry both roots",
        Duration::from_secs(10),
        || {
            let chain = sign(&istiod, &old_root);
            (chain.last() == Some(&listed)).then_some(chain)
        },
    );
    assert!(chains_to(&chain, &new_root) && chains_to(&chain, &old_root));

    // The namespace controller publishes both roots.
    wait_for(
        "istio-ca-root-cert carries both roots",
        Duration::from_secs(10),
        || {
            let cm = api.get("v1", "ConfigMap", "demo", "istio-ca-root-cert")?;
            (cm["data"]["root-cert.pem"].as_str() == Some(listed.as_str())).then_some(())
        },
    );
    println!(
        "CA root rotation: new root in the Secret, the CSR responses and istio-ca-root-cert within {:?}",
        started.elapsed()
    );
}

/// The trust bundle Envoy of Pod `pod` holds as `ROOTCA` (from its config dump).
fn envoy_rootca(mesh: &tests::mesh::LocalMesh, pod: &str) -> String {
    use base64::Engine;
    let dump = mesh.pod(pod).ns.run(|| {
        tests::http_get(
            std::net::SocketAddr::from(([127, 0, 0, 1], 15000)),
            "/config_dump?resource=dynamic_active_secrets",
        )
        .map(|(_, body)| body)
        .unwrap_or_default()
    });
    let dump: Value = serde_json::from_str(&dump).unwrap_or(Value::Null);
    let empty = vec![];
    dump["configs"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .find(|c| c["name"] == "ROOTCA")
        .and_then(|c| c["secret"]["validation_context"]["trusted_ca"]["inline_bytes"].as_str())
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .map(|pem| String::from_utf8_lossy(&pem).into_owned())
        .unwrap_or_default()
}

#[test]
fn a_root_rotation_reaches_every_proxy_with_no_failed_request() {
    use base64::Engine;
    let _mesh = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    // A root whose grace period (the last 20% of 1000 s) starts in 45 s.
    let (old_root, key) = aging_root(Duration::from_secs(1000), Duration::from_secs(755));
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let secret_obj = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "istio.io/ca-root",
        "metadata": {"name": "istio-ca-secret", "namespace": "istio-system"},
        "data": {
            "ca-cert.pem": b64(&old_root), "ca-key.pem": b64(&key), "cert-chain.pem": "",
            "key.pem": "", "root-cert.pem": b64(&old_root),
        }
    });
    let mesh = tests::mesh::LocalMesh::start_kube_with(
        tmp.path(),
        // Short workload certificates: the agents renew, and take up the
        // CA's new bundle, within seconds.
        &[("SECRET_TTL", "20s")],
        &[
            ("CITADEL_SELF_SIGNED_ROOT_CERT_CHECK_INTERVAL", "1s"),
            ("CITADEL_ENABLE_JITTER_FOR_ROOT_CERT_ROTATOR", "false"),
        ],
        &[secret_obj],
    );
    let api = mesh.kube_api.as_ref().unwrap();
    let (code, body) = mesh
        .app_curl("sleep-1", "http://httpbin:8000/headers")
        .unwrap();
    assert_eq!(code, 200, "{body}");

    // Steady traffic sleep → httpbin across the rotation.
    let traffic = sleep_traffic(&mesh);
    traffic.wait_successes(10, Instant::now(), TRAFFIC_WAIT);
    let new_root = wait_for("istiod rotates the root", Duration::from_secs(120), || {
        let ca_cert = secret_key(&secret(api), "ca-cert.pem");
        (ca_cert != old_root).then_some(ca_cert)
    });
    let rotated = Instant::now();
    for (pod, ..) in &mesh.pods {
        wait_for(
            &format!("{pod}'s Envoy trusts both roots"),
            Duration::from_secs(90),
            || {
                let bundle = envoy_rootca(&mesh, pod);
                (bundle.contains(new_root.trim()) && bundle.contains(old_root.trim())).then_some(())
            },
        );
    }
    println!(
        "CA root rotation time to the last proxy ({} proxies): {:?}",
        mesh.pods.len(),
        rotated.elapsed()
    );
    // More requests once every proxy has the new bundle.
    traffic.wait_successes(20, Instant::now(), TRAFFIC_WAIT);
    let (ok, failed) = tally(&traffic.stop());
    println!("requests across the rotation: {ok} ok, {failed} failed");
    assert!(ok > 10, "traffic flowed ({ok})");
    assert_eq!(failed, 0, "no request failed across the rotation");
}

/// A plug-in bundle: `(ca-cert, ca-key, cert-chain, root-cert)` for a new
/// intermediate under `root` (its PEM and key).
fn intermediate(root_pem: &str, root_key: &rcgen::KeyPair) -> [String; 4] {
    let root = common::pki::pem_certs("root", root_pem).unwrap().remove(0);
    let issuer = rcgen::Issuer::from_ca_cert_der(&root, root_key).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let mut params = common::pki::root_ca_params(
        "cluster.local",
        now - time::Duration::minutes(5),
        now + time::Duration::days(30),
    );
    let serial = rand_serial();
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
    // A subject of its own: a chain whose intermediate is named like the
    // root does not build in Envoy.
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("intermediate {:x}", u64::from_be_bytes(serial)),
    );
    let key = common::pki::generate_key(common::pki::KeyType::EcdsaP256).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap().pem();
    [
        cert.clone(),
        key.serialize_pem(),
        format!("{cert}{root_pem}"),
        root_pem.to_string(),
    ]
}

fn rand_serial() -> [u8; 8] {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    (nanos | 1 << 62).to_be_bytes()
}

fn cacerts(bundle: &[String; 4]) -> Value {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cacerts", "namespace": "istio-system"},
        "data": {
            "ca-cert.pem": b64(&bundle[0]), "ca-key.pem": b64(&bundle[1]),
            "cert-chain.pem": b64(&bundle[2]), "root-cert.pem": b64(&bundle[3]),
        }
    })
}

/// The certificate chain Envoy of Pod `pod` holds as `default`.
fn envoy_chain(mesh: &tests::mesh::LocalMesh, pod: &str) -> String {
    use base64::Engine;
    let dump = mesh.pod(pod).ns.run(|| {
        tests::http_get(
            std::net::SocketAddr::from(([127, 0, 0, 1], 15000)),
            "/config_dump?resource=dynamic_active_secrets",
        )
        .map(|(_, body)| body)
        .unwrap_or_default()
    });
    let dump: Value = serde_json::from_str(&dump).unwrap_or(Value::Null);
    let empty = vec![];
    dump["configs"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .find(|c| c["name"] == "default")
        .and_then(|c| c["secret"]["tls_certificate"]["certificate_chain"]["inline_bytes"].as_str())
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .map(|pem| String::from_utf8_lossy(&pem).into_owned())
        .unwrap_or_default()
}

#[test]
fn a_changed_cacerts_secret_reaches_every_proxy_with_no_failed_request() {
    let _mesh = tests::mesh::one_mesh_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let root_key = common::pki::generate_key(common::pki::KeyType::EcdsaP256).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let root = common::pki::root_ca_params(
        "cluster.local",
        now - time::Duration::minutes(5),
        now + time::Duration::days(365),
    )
    .self_signed(&root_key)
    .unwrap()
    .pem();
    let first = intermediate(&root, &root_key);
    let mesh = tests::mesh::LocalMesh::start_kube_with(
        tmp.path(),
        &[("SECRET_TTL", "20s")],
        &[],
        &[cacerts(&first)],
    );
    let api = mesh.kube_api.as_ref().unwrap();
    wait_for(
        "sleep-1's Envoy holds the first intermediate",
        Duration::from_secs(30),
        || {
            envoy_chain(&mesh, "sleep-1")
                .contains(first[0].trim())
                .then_some(())
        },
    );
    let traffic = sleep_traffic(&mesh);
    traffic.wait_successes(10, Instant::now(), TRAFFIC_WAIT);
    let second = intermediate(&root, &root_key);
    let mut secret = api.get("v1", "Secret", "istio-system", "cacerts").unwrap();
    secret["data"] = cacerts(&second)["data"].clone();
    api.update(secret).unwrap();
    for (pod, ..) in &mesh.pods {
        wait_for(
            &format!("{pod}'s Envoy holds the new intermediate"),
            Duration::from_secs(90),
            || {
                envoy_chain(&mesh, pod)
                    .contains(second[0].trim())
                    .then_some(())
            },
        );
    }
    // More requests once every proxy has the new chain.
    traffic.wait_successes(20, Instant::now(), TRAFFIC_WAIT);
    let (ok, failed) = tally(&traffic.stop());
    println!("requests across the cacerts change: {ok} ok, {failed} failed");
    assert!(ok > 10, "traffic flowed ({ok})");
    assert_eq!(failed, 0, "no request failed across the cacerts change");
}
