//! The CA client against the fake CA over TLS, as the agent dials istiod's
//! `:15012`.

use std::path::PathBuf;

use common::pki::{self, KeyType};
use common::testing::ca::FakeCa;
use common::testing::{SERVER_NAME, TestRoot, Transport};
use tonic::Code;

use super::*;

struct Harness {
    ca: FakeCa,
    client: CaClient,
    token: PathBuf,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

/// A client of a fresh fake CA; its mounted root is `root_pem` (the CA's
/// own serving root when `None`).
async fn harness(root_pem: Option<&str>) -> Harness {
    common::tls::install_crypto_provider();
    let ca = FakeCa::start(Transport::Tls).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("istio-token");
    std::fs::write(&token, "token-1\n").unwrap();
    let root = dir.path().join("root-cert.pem");
    std::fs::write(&root, root_pem.unwrap_or(ca.tls_root_pem().unwrap())).unwrap();
    let config = crate::test_support::config(|c| {
        c.identity.ca_addr = ca.addr().to_string();
        c.identity.ca_root_path = Some(root.clone());
        c.identity.ca_server_name = SERVER_NAME.into();
        c.identity.token_path = token.clone();
        c.pod.cluster_id = "Kubernetes".into();
    });
    let client = CaClient::new(&config).unwrap();
    Harness {
        ca,
        client,
        token,
        root,
        _dir: dir,
    }
}

fn csr() -> String {
    let key = pki::generate_key(KeyType::EcdsaP256).unwrap();
    pki::csr_pem(&common::Identity::new("cluster.local", "ns", "sa"), &key).unwrap()
}

#[tokio::test]
async fn the_token_file_is_read_again_for_every_csr() {
    let h = harness(None).await;
    h.client.sign(&csr()).await.unwrap();
    std::fs::write(&h.token, "token-2").unwrap();
    h.client.sign(&csr()).await.unwrap();
    // A missing token is a warning: the CSR goes without one, as in Istio.
    std::fs::remove_file(&h.token).unwrap();
    h.client.sign(&csr()).await.unwrap();
    assert_eq!(
        h.ca.tokens(),
        [
            Some("token-1".to_string()),
            Some("token-2".to_string()),
            None
        ]
    );
    let seen = h.ca.requests();
    assert_eq!(seen[0].cluster_id.as_deref(), Some("Kubernetes"));
    // Istio's request: the configured TTL and the CertSigner metadata field.
    assert_eq!(seen[0].request.validity_duration, 86400);
    let fields = &seen[0].request.metadata.as_ref().unwrap().fields;
    assert!(fields.contains_key("CertSigner"), "{fields:?}");
}

#[tokio::test]
async fn the_chain_comes_back_as_the_ca_sent_it_and_a_new_root_with_it() {
    let h = harness(None).await;
    let first_root = h.ca.root_pem();
    let chain = h.client.sign(&csr()).await.unwrap();
    assert_eq!(chain.len(), 2);
    assert_eq!(chain[1], first_root);

    // The CA moves to a new root: the client hands back the new chain as it
    // is (the secret manager takes its last element as the trust bundle).
    let new_root = h.ca.rotate_root().unwrap();
    let chain = h.client.sign(&csr()).await.unwrap();
    assert_eq!(chain.last().unwrap(), &new_root);
    let leaf = pki::pem_certs("leaf", &chain[0]).unwrap().remove(0);
    let new = pki::pem_certs("new root", &new_root).unwrap().remove(0);
    let old = pki::pem_certs("old root", &first_root).unwrap().remove(0);
    assert!(pki::signed_by(&leaf, &new));
    assert!(!pki::signed_by(&leaf, &old));
}

#[tokio::test]
async fn a_refused_csr_keeps_its_grpc_code_and_the_next_one_goes_through() {
    let h = harness(None).await;
    h.ca.fail_next(1, Code::Unauthenticated, "token expired");
    let err = h.client.sign(&csr()).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Unauthenticated), "{err}");
    assert!(err.to_string().contains("token expired"), "{err}");
    h.client.sign(&csr()).await.unwrap();
    assert_eq!(h.ca.calls(), 2);
}

#[tokio::test]
async fn the_mounted_root_is_read_again_when_the_client_reconnects() {
    let wrong = TestRoot::generate("elsewhere").unwrap();
    let h = harness(Some(&wrong.pem)).await;
    let err = h.client.sign(&csr()).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Unavailable), "{err}");
    assert_eq!(h.ca.calls(), 0, "the handshake fails before any CSR");
    std::fs::write(&h.root, h.ca.tls_root_pem().unwrap()).unwrap();
    h.client.sign(&csr()).await.unwrap();
    assert_eq!(h.ca.calls(), 1);
}
