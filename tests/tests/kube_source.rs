//! istiod on Kubernetes: the real istiod binary with `--kubeconfig` against
//! the API server stand-in. What a proxy gets over ADS follows the cluster
//! (Services, EndpointSlices, Pods, Nodes, Istio's kinds, the `istio`
//! ConfigMap's mesh config), through broken watches and compacted history;
//! the CA reviews tokens with TokenReview; every watched namespace gets the
//! `istio-ca-root-cert` ConfigMap; istiod is not ready before its lists.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use istiod::xds::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE};
use prost::Message;
use proto::istio_ca::IstioCertificateRequest;
use proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;
use proto::pb::envoy::config::cluster::v3::Cluster as EnvoyCluster;
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::service::discovery::v3::DiscoveryRequest;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::pb::google::protobuf::{Any, Struct, Value as PbValue, value::Kind as PbKind};
use serde_json::{Value, json};
use tests::kube_api::{KubeApi, TokenReviewAnswer};
use tests::{ISTIOD_SAN, Proc, bin, free_port, http_get, wait_for};
use tokio_stream::wrappers::ReceiverStream;

const HTTPBIN_CLUSTER: &str = "outbound|8000||httpbin.demo.svc.cluster.local";
const WAIT: Duration = Duration::from_secs(30);

/// istiod running against a stand-in API server.
struct Cluster {
    api: KubeApi,
    istiod: Proc,
    dir: PathBuf,
    http: SocketAddr,
    xds: SocketAddr,
    secure: SocketAddr,
    rt: tokio::runtime::Runtime,
    _tmp: tempfile::TempDir,
}

/// How to start istiod.
#[derive(Default)]
struct Options<'a> {
    /// A `--meshConfig` file's content (none: the `istio` ConfigMap is used).
    mesh_file: Option<&'a str>,
    /// A `--configDir` directory.
    config_dir: Option<&'a Path>,
    /// Extra environment.
    env: &'a [(&'a str, &'a str)],
    /// Do not wait for `/ready`.
    no_wait: bool,
}

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

impl Cluster {
    /// A stand-in with the namespaces `istio-system` and `demo`.
    fn api() -> KubeApi {
        let api = KubeApi::start_local();
        api.create(namespace("istio-system", json!({}))).unwrap();
        api.create(namespace("demo", json!({}))).unwrap();
        api
    }

    fn start(api: KubeApi, opts: Options<'_>) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("istiod");
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = tmp.path().join("kubeconfig");
        api.kubeconfig(&kubeconfig);
        let mesh = dir.join("mesh");
        if let Some(m) = opts.mesh_file {
            std::fs::write(&mesh, m).unwrap();
        }
        let addr = || -> SocketAddr { format!("127.0.0.1:{}", free_port()).parse().unwrap() };
        let (http, xds, secure, monitoring) = (addr(), addr(), addr(), addr());
        let mut cmd = Command::new(bin("istiod"));
        cmd.current_dir(&dir)
            .arg("discovery")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--meshConfig={}", mesh.display()))
            .arg(format!("--httpAddr={http}"))
            .arg(format!("--grpcAddr={xds}"))
            .arg(format!("--secureGRPCAddr={secure}"))
            .arg(format!("--monitoringAddr={monitoring}"))
            .arg(format!("--httpsAddr=127.0.0.1:{}", free_port()))
            .args(
                opts.config_dir
                    .map(|d| format!("--configDir={}", d.display())),
            )
            .env("POD_NAMESPACE", "istio-system")
            .env("PILOT_DEBOUNCE_AFTER", "20ms")
            .envs(opts.env.iter().copied());
        let istiod = Proc::spawn("istiod", cmd, &tmp.path().join("istiod.log"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut c = Cluster {
            api,
            istiod,
            dir,
            http,
            xds,
            secure,
            rt,
            _tmp: tmp,
        };
        if !opts.no_wait {
            c.wait_ready();
        }
        c
    }

    fn ready_status(&self) -> Option<u16> {
        http_get(self.http, "/ready").ok().map(|(code, _)| code)
    }

    fn wait_ready(&mut self) {
        let (proc, http) = (&mut self.istiod, self.http);
        wait_for("istiod /ready", Duration::from_secs(60), || {
            assert!(proc.alive(), "istiod exited:\n{}", proc.log());
            matches!(http_get(http, "/ready"), Ok((200, _))).then_some(())
        });
    }

    fn configz(&self) -> Value {
        let (_, body) = http_get(self.http, "/debug/configz").unwrap();
        serde_json::from_str(&body).unwrap()
    }

    /// One SotW request on a new ADS stream (plaintext port) as the `sleep`
    /// proxy in `demo`; the first answer's resources, or none within 5 s.
    fn fetch(&self, type_url: &str, names: &[&str]) -> Vec<Any> {
        let meta = |v: &str| PbValue {
            kind: Some(PbKind::StringValue(v.into())),
        };
        let req = DiscoveryRequest {
            node: Some(Node {
                id: "sidecar~198.18.0.2~sleep-1.demo~demo.svc.cluster.local".into(),
                metadata: Some(Struct {
                    fields: [
                        ("NAMESPACE".to_string(), meta("demo")),
                        ("SERVICE_ACCOUNT".to_string(), meta("sleep")),
                    ]
                    .into_iter()
                    .collect(),
                }),
                ..Default::default()
            }),
            type_url: type_url.into(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        let addr = self.xds;
        self.rt.block_on(async move {
            let Ok(mut client) =
                AggregatedDiscoveryServiceClient::connect(format!("http://{addr}")).await
            else {
                return Vec::new();
            };
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.send(req).await.unwrap();
            let Ok(stream) = client
                .stream_aggregated_resources(ReceiverStream::new(rx))
                .await
            else {
                return Vec::new();
            };
            let mut stream = stream.into_inner();
            let answer = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
            drop(tx);
            match answer {
                Ok(Ok(Some(r))) => r.resources,
                _ => Vec::new(),
            }
        })
    }

    fn clusters(&self) -> Vec<String> {
        self.fetch(CLUSTER_TYPE, &[])
            .iter()
            .map(|a| EnvoyCluster::decode(a.value.as_slice()).unwrap().name)
            .collect()
    }

    /// (address, region/zone) of the endpoints of `cluster`.
    fn endpoints(&self, cluster: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for a in self.fetch(ENDPOINT_TYPE, &[cluster]) {
            let cla = ClusterLoadAssignment::decode(a.value.as_slice()).unwrap();
            for group in cla.endpoints {
                let locality = group
                    .locality
                    .map(|l| format!("{}/{}", l.region, l.zone))
                    .unwrap_or_default();
                for ep in group.lb_endpoints {
                    if let Some(lb_endpoint::HostIdentifier::Endpoint(e)) = ep.host_identifier
                        && let Some(
                            proto::pb::envoy::config::core::v3::address::Address::SocketAddress(s),
                        ) = e.address.and_then(|a| a.address)
                    {
                        out.push((s.address, locality.clone()));
                    }
                }
            }
        }
        out.sort();
        out
    }

    fn endpoint_ips(&self, cluster: &str) -> Vec<String> {
        self.endpoints(cluster)
            .into_iter()
            .map(|(a, _)| a)
            .collect()
    }

    /// Which cluster virtualOutbound sends unknown destinations to.
    fn catch_all(&self) -> Option<String> {
        let listener = self
            .fetch(LISTENER_TYPE, &[])
            .iter()
            .map(|a| Listener::decode(a.value.as_slice()).unwrap())
            .find(|l| l.name == "virtualOutbound")?;
        let chain = listener
            .filter_chains
            .iter()
            .find(|c| c.name == "virtualOutbound-catchall-tcp")?;
        let bytes = chain.encode_to_vec();
        ["PassthroughCluster", "BlackHoleCluster"]
            .into_iter()
            .find(|c| bytes.windows(c.len()).any(|w| w == c.as_bytes()))
            .map(String::from)
    }

    /// The CA root istiod created (in `istio-ca-secret`, on Kubernetes).
    fn root_pem(&self) -> String {
        use base64::Engine;
        let secret = self
            .api
            .get("v1", "Secret", "istio-system", "istio-ca-secret")
            .expect("istiod created istio-ca-secret");
        let b64 = secret["data"]["root-cert.pem"].as_str().unwrap();
        let pem = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        String::from_utf8(pem).unwrap()
    }

    /// A CSR for demo/sleep with `token`; the certificate's URI SANs or the error.
    fn csr(&self, token: &str) -> Result<Vec<String>, tonic::Status> {
        self.csr_trusting(&self.root_pem(), token)
            .map(|(sans, _)| sans)
    }

    /// A CSR for demo/sleep with `token` to istiod, trusted through `root`;
    /// the certificate's URI SANs and the chain's last element (the root).
    fn csr_trusting(
        &self,
        root: &str,
        token: &str,
    ) -> Result<(Vec<String>, String), tonic::Status> {
        common::tls::install_crypto_provider();
        let root = root.to_string();
        let source: common::tls::ClientConfigSource = Arc::new(move || {
            let store = common::tls::root_store("root", &root)?;
            Ok(Arc::new(common::tls::grpc_client_config(store, None)?))
        });
        let name = rustls::pki_types::ServerName::try_from(ISTIOD_SAN).unwrap();
        let addr = self.secure.to_string();
        let token = token.to_string();
        self.rt.block_on(async move {
            let channel =
                common::tls::grpc_channel(&addr, Some((source, name)), Duration::from_secs(5))
                    .unwrap();
            let mut client = IstioCertificateServiceClient::new(channel);
            let key = common::pki::generate_key(common::pki::KeyType::EcdsaP256).unwrap();
            let csr = common::pki::csr_pem(
                &common::Identity::new("cluster.local", "demo", "sleep"),
                &key,
            )
            .unwrap();
            let mut req = tonic::Request::new(IstioCertificateRequest {
                csr,
                validity_duration: 3600,
                metadata: None,
            });
            req.metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            let chain = client
                .create_certificate(req)
                .await?
                .into_inner()
                .cert_chain;
            let leaf = common::pki::pem_certs("leaf", &chain[0]).unwrap();
            let sans = common::pki::cert_info(&leaf[0]).unwrap().uri_sans;
            Ok((sans, chain.last().unwrap().clone()))
        })
    }
}

fn service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "httpbin", "namespace": "demo"},
        "spec": {"clusterIP": "198.19.0.10", "selector": {"app": "httpbin"},
                 "ports": [{"name": "http", "port": 8000, "targetPort": 80}]},
    })
}

fn pod(name: &str, ip: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "demo",
                     "labels": {"app": "httpbin", "version": "v1",
                                "security.istio.io/tlsMode": "istio"}},
        "spec": {"serviceAccountName": "httpbin", "nodeName": node,
                 "containers": [{"name": "httpbin", "image": "httpbin",
                                 "ports": [{"containerPort": 80}]}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    })
}

fn slice(name: &str, pods: &[(&str, &str, &str)]) -> Value {
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|(pod, ip, node)| {
            json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": node,
                   "targetRef": {"kind": "Pod", "namespace": "demo", "name": pod}})
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "demo",
                     "labels": {"kubernetes.io/service-name": "httpbin"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        "endpoints": endpoints,
    })
}

fn node(name: &str, region: &str, zone: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/region": region,
                                              "topology.kubernetes.io/zone": zone}},
    })
}

/// httpbin: a Service, two Pods on two Nodes, one EndpointSlice.
fn httpbin(api: &KubeApi) {
    api.create(node("node-a", "us-east1", "us-east1-b"))
        .unwrap();
    api.create(node("node-b", "us-east1", "us-east1-c"))
        .unwrap();
    api.create(service()).unwrap();
    api.create(pod("httpbin-1", "198.18.1.1", "node-a"))
        .unwrap();
    api.create(pod("httpbin-2", "198.18.1.2", "node-b"))
        .unwrap();
    api.create(slice(
        "httpbin-abc",
        &[
            ("httpbin-1", "198.18.1.1", "node-a"),
            ("httpbin-2", "198.18.1.2", "node-b"),
        ],
    ))
    .unwrap();
}

fn wait_endpoints(c: &Cluster, want: &[&str]) {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    let mut last = Vec::new();
    let found = (0..)
        .map(|_| {
            last = c.endpoint_ips(HTTPBIN_CLUSTER);
            if last == want {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
            false
        })
        .take(300)
        .any(|ok| ok);
    assert!(
        found,
        "endpoints of {HTTPBIN_CLUSTER}: {last:?}, want {want:?}"
    );
}

#[test]
fn services_endpoint_slices_pods_and_nodes_become_clusters_and_endpoints() {
    let api = Cluster::api();
    httpbin(&api);
    let c = Cluster::start(api, Options::default());

    assert!(
        c.clusters().contains(&HTTPBIN_CLUSTER.to_string()),
        "{:?}",
        c.clusters()
    );
    // Each endpoint carries its Node's region and zone.
    assert_eq!(
        c.endpoints(HTTPBIN_CLUSTER),
        vec![
            ("198.18.1.1".to_string(), "us-east1/us-east1-b".to_string()),
            ("198.18.1.2".to_string(), "us-east1/us-east1-c".to_string()),
        ]
    );

    // A new Pod and endpoint arrive through the watch.
    c.api
        .create(pod("httpbin-3", "198.18.1.3", "node-a"))
        .unwrap();
    c.api
        .update(slice(
            "httpbin-abc",
            &[
                ("httpbin-1", "198.18.1.1", "node-a"),
                ("httpbin-2", "198.18.1.2", "node-b"),
                ("httpbin-3", "198.18.1.3", "node-a"),
            ],
        ))
        .unwrap();
    wait_endpoints(&c, &["198.18.1.1", "198.18.1.2", "198.18.1.3"]);

    // A DestinationRule's subsets become clusters; an invalid edit is
    // rejected naming the object and field, and the last good one serves.
    let dr = |host: &str| {
        json!({
            "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": "httpbin", "namespace": "demo"},
            "spec": {"host": host, "subsets": [{"name": "v1", "labels": {"version": "v1"}}]},
        })
    };
    c.api.create(dr("httpbin")).unwrap();
    let subset = "outbound|8000|v1|httpbin.demo.svc.cluster.local";
    wait_for("the subset cluster", WAIT, || {
        c.clusters().contains(&subset.to_string()).then_some(())
    });
    c.api.update(dr("")).unwrap();
    let errors = wait_for("the rejected DestinationRule in configz", WAIT, || {
        let errors = c.configz()["errors"].clone();
        (!errors.as_array().unwrap().is_empty()).then_some(errors)
    });
    let first = errors[0].as_str().unwrap();
    assert!(
        first.contains("DestinationRule/demo/httpbin: spec.host"),
        "{errors}"
    );
    assert!(c.clusters().contains(&subset.to_string()));
    assert!(c.istiod.log().contains("DestinationRule/demo/httpbin"));
}

#[test]
fn a_broken_watch_loses_no_delete() {
    let api = Cluster::api();
    httpbin(&api);
    let mut c = Cluster::start(api, Options::default());
    wait_endpoints(&c, &["198.18.1.1", "198.18.1.2"]);

    // The API goes away mid-watch; meanwhile a Pod and its endpoint go.
    c.api.set_unreachable(true);
    c.api.break_watches();
    c.api
        .update(slice(
            "httpbin-abc",
            &[("httpbin-1", "198.18.1.1", "node-a")],
        ))
        .unwrap();
    c.api.delete("v1", "Pod", "demo", "httpbin-2").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    c.api.set_unreachable(false);
    // The watches resume from their resource versions and see the changes.
    wait_endpoints(&c, &["198.18.1.1"]);
    // Each kind's watch resumes on its own (after its backoff): the Pod's
    // delete arrives too, and istiod stayed ready throughout.
    wait_for("the deleted Pod gone from istiod's config", WAIT, || {
        let objects = c.configz()["objects"].clone();
        let pods: Vec<Value> = objects
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o.as_str().unwrap().starts_with("Pod/"))
            .cloned()
            .collect();
        (pods == vec![json!("Pod/demo/httpbin-1")]).then_some(())
    });
    assert!(c.istiod.alive());
    assert_eq!(c.ready_status(), Some(200));
}

#[test]
fn a_compacted_history_ends_in_a_relist_without_ghosts() {
    let api = Cluster::api();
    httpbin(&api);
    let c = Cluster::start(api, Options::default());
    wait_endpoints(&c, &["198.18.1.1", "198.18.1.2"]);

    c.api.set_unreachable(true);
    c.api.break_watches();
    // Deleted while istiod cannot see, and the history compacted away: only
    // a relist can tell istiod the slice is gone.
    c.api
        .delete(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            "demo",
            "httpbin-abc",
        )
        .unwrap();
    c.api
        .create(slice(
            "httpbin-new",
            &[("httpbin-2", "198.18.1.2", "node-b")],
        ))
        .unwrap();
    c.api.compact();
    c.api.clear_requests();
    c.api.set_unreachable(false);

    wait_endpoints(&c, &["198.18.1.2"]);
    let relisted = c
        .api
        .requests()
        .iter()
        .any(|r| r.is_list_of("endpointslices"));
    assert!(relisted, "EndpointSlices were not listed again");
    let objects = c.configz()["objects"].clone();
    let slices: Vec<&Value> = objects
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o.as_str().unwrap().starts_with("EndpointSlice/"))
        .collect();
    assert_eq!(slices, vec!["EndpointSlice/demo/httpbin-new"], "{objects}");
}

#[test]
fn token_review_grants_and_refuses_workload_certificates() {
    let api = Cluster::api();
    api.set_token_review(Arc::new(|token: &str, audiences: &[String]| match token {
        "good" => TokenReviewAnswer::service_account("demo", "sleep", audiences),
        // A valid token, but not for istio-ca.
        "other-audience" => TokenReviewAnswer::service_account("demo", "sleep", &[]),
        _ => TokenReviewAnswer::Unauthenticated("invalid bearer token".into()),
    }));
    let c = Cluster::start(api, Options::default());

    assert_eq!(
        c.csr("good").unwrap(),
        vec!["spiffe://cluster.local/ns/demo/sa/sleep"]
    );
    let review = c.api.token_reviews().remove(0);
    assert_eq!(review.token, "good");
    assert_eq!(review.audiences, vec!["istio-ca"]);

    for (token, why) in [
        ("forged", "invalid bearer token"),
        ("other-audience", "not for audience"),
    ] {
        let err = c.csr(token).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{token}: {err:?}");
        assert!(err.message().contains(why), "{token}: {}", err.message());
    }

    // The API server cannot be reached: refused, never granted.
    c.api.set_unreachable(true);
    let err = c.csr("good").unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("TokenReview"), "{}", err.message());
    c.api.set_unreachable(false);
    assert!(c.csr("good").is_ok());
}

fn root_configmap(api: &KubeApi, ns: &str) -> Option<Value> {
    api.get("v1", "ConfigMap", ns, "istio-ca-root-cert")
}

#[test]
fn every_watched_namespace_gets_the_root_and_keeps_it() {
    let api = Cluster::api();
    api.create(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "istio", "namespace": "istio-system"},
        "data": {"mesh": "discoverySelectors:\n- matchLabels: {istio-discovery: enabled}\n"},
    }))
    .unwrap();
    for ns in ["istio-system", "demo"] {
        api.apply(namespace(ns, json!({"istio-discovery": "enabled"})))
            .unwrap();
    }
    api.create(namespace("outside", json!({}))).unwrap();
    api.create(namespace(
        "kube-extra",
        json!({"istio-discovery": "enabled"}),
    ))
    .unwrap();
    let c = Cluster::start(api, Options::default());
    let root = c.root_pem();

    for ns in ["istio-system", "demo", "kube-extra"] {
        let cm = wait_for(&format!("istio-ca-root-cert in {ns}"), WAIT, || {
            root_configmap(&c.api, ns)
        });
        assert_eq!(cm["data"]["root-cert.pem"], root.as_str(), "{ns}");
        assert_eq!(cm["metadata"]["labels"]["istio.io/config"], "true");
    }
    // Kubernetes' own namespaces and unselected ones get none.
    for ns in ["outside", "kube-system", "default"] {
        assert!(root_configmap(&c.api, ns).is_none(), "{ns}");
    }

    // Deleted: put back. Edited: repaired, other keys kept.
    c.api
        .delete("v1", "ConfigMap", "demo", "istio-ca-root-cert")
        .unwrap();
    wait_for("istio-ca-root-cert back in demo", WAIT, || {
        root_configmap(&c.api, "demo")
    });
    let mut edited = root_configmap(&c.api, "demo").unwrap();
    edited["data"]["root-cert.pem"] = json!("tampered");
    edited["data"]["extra"] = json!("kept");
    c.api.update(edited).unwrap();
    wait_for("istio-ca-root-cert repaired in demo", WAIT, || {
        root_configmap(&c.api, "demo").filter(|cm| cm["data"]["root-cert.pem"] == root.as_str())
    });
    assert_eq!(
        root_configmap(&c.api, "demo").unwrap()["data"]["extra"],
        "kept"
    );

    // A namespace that joins the selection gets one; the excluded one still has none.
    c.api
        .apply(namespace("joining", json!({"istio-discovery": "enabled"})))
        .unwrap();
    wait_for("istio-ca-root-cert in joining", WAIT, || {
        root_configmap(&c.api, "joining")
    });
    assert!(root_configmap(&c.api, "outside").is_none());
}

#[test]
fn discovery_selectors_choose_the_namespaces_whose_objects_are_used() {
    let api = Cluster::api();
    api.create(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "istio", "namespace": "istio-system"},
        "data": {"mesh": "discoverySelectors:\n- matchLabels: {istio-discovery: enabled}\n"},
    }))
    .unwrap();
    httpbin(&api);
    let c = Cluster::start(api, Options::default());
    // demo is not selected: its Service is not used.
    assert!(!c.clusters().contains(&HTTPBIN_CLUSTER.to_string()));
    c.api
        .apply(namespace("demo", json!({"istio-discovery": "enabled"})))
        .unwrap();
    wait_endpoints(&c, &["198.18.1.1", "198.18.1.2"]);
}

#[test]
fn the_istio_configmap_changes_outbound_traffic_policy_without_a_restart() {
    let api = Cluster::api();
    let mesh = |mode: &str| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "istio", "namespace": "istio-system"},
            "data": {"mesh": format!("outboundTrafficPolicy:\n  mode: {mode}\n")},
        })
    };
    api.create(mesh("ALLOW_ANY")).unwrap();
    httpbin(&api);
    let mut c = Cluster::start(api, Options::default());
    let pid = c.istiod.pid();
    assert_eq!(c.catch_all().as_deref(), Some("PassthroughCluster"));

    c.api.update(mesh("REGISTRY_ONLY")).unwrap();
    wait_for("BlackHoleCluster for unknown destinations", WAIT, || {
        (c.catch_all().as_deref() == Some("BlackHoleCluster")).then_some(())
    });
    // A mesh config that does not parse is refused; the last good one stays.
    c.api.update(mesh("SOMETIMES")).unwrap();
    wait_for("the refusal in istiod's log", WAIT, || {
        c.istiod
            .log()
            .contains("\"SOMETIMES\" is not a mode")
            .then_some(())
    });
    assert_eq!(c.catch_all().as_deref(), Some("BlackHoleCluster"));
    // Deleted: Istio's default, ALLOW_ANY.
    c.api
        .delete("v1", "ConfigMap", "istio-system", "istio")
        .unwrap();
    wait_for("PassthroughCluster again", WAIT, || {
        (c.catch_all().as_deref() == Some("PassthroughCluster")).then_some(())
    });
    assert!(c.istiod.alive());
    assert_eq!(c.istiod.pid(), pid);
}

#[test]
fn istiod_is_not_ready_before_its_initial_lists() {
    // Unreachable at start: not ready, for as long as it lasts.
    let api = Cluster::api();
    httpbin(&api);
    api.set_unreachable(true);
    let mut c = Cluster::start(
        api,
        Options {
            no_wait: true,
            ..Default::default()
        },
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        assert_ne!(c.ready_status(), Some(200), "ready without the API");
        std::thread::sleep(Duration::from_millis(100));
    }
    c.api.set_unreachable(false);
    c.wait_ready();
    wait_endpoints(&c, &["198.18.1.1", "198.18.1.2"]);

    // Slow: /ready answers 503 while the lists are on their way, and is 200
    // only once every watched kind has been listed.
    let api = Cluster::api();
    httpbin(&api);
    api.set_latency(Duration::from_millis(1500));
    let c = Cluster::start(
        api,
        Options {
            no_wait: true,
            ..Default::default()
        },
    );
    let first = wait_for("an answer from /ready", Duration::from_secs(60), || {
        c.ready_status()
    });
    assert_eq!(first, 503, "ready before the lists");
    wait_for("ready", Duration::from_secs(60), || {
        (c.ready_status() == Some(200)).then_some(())
    });
    let requests = c.api.requests();
    for resource in [
        "services",
        "endpointslices",
        "pods",
        "namespaces",
        "nodes",
        "virtualservices",
        "destinationrules",
        "serviceentries",
        "workloadentries",
        "sidecars",
        "peerauthentications",
        "configmaps",
    ] {
        assert!(
            requests.iter().any(|r| r.is_list_of(resource)),
            "ready without listing {resource}"
        );
    }
    // The endpoints are there as soon as it is ready.
    assert_eq!(
        c.endpoint_ips(HTTPBIN_CLUSTER),
        vec!["198.18.1.1", "198.18.1.2"]
    );
}

#[test]
fn the_file_and_kubernetes_sources_share_the_store() {
    let api = Cluster::api();
    httpbin(&api);
    let tmp = tempfile::tempdir().unwrap();
    let se = |host: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: ext, namespace: demo}}\nspec:\n  hosts: [{host}]\n  ports: [{{number: 443, name: tls, protocol: TLS}}]\n  resolution: DNS\n"
        )
    };
    std::fs::write(tmp.path().join("se.yaml"), se("api.example.com")).unwrap();
    let c = Cluster::start(
        api,
        Options {
            config_dir: Some(tmp.path()),
            ..Default::default()
        },
    );
    let clusters = c.clusters();
    assert!(
        clusters.contains(&HTTPBIN_CLUSTER.to_string()),
        "{clusters:?}"
    );
    assert!(
        clusters.contains(&"outbound|443||api.example.com".to_string()),
        "{clusters:?}"
    );
    // A re-read directory replaces only the file's objects...
    std::fs::write(tmp.path().join("se.yaml"), se("api2.example.com")).unwrap();
    wait_for("the file's new ServiceEntry", WAIT, || {
        c.clusters()
            .contains(&"outbound|443||api2.example.com".to_string())
            .then_some(())
    });
    let clusters = c.clusters();
    assert!(!clusters.contains(&"outbound|443||api.example.com".to_string()));
    assert!(clusters.contains(&HTTPBIN_CLUSTER.to_string()));
    // ...and a relist only the API's.
    c.api.set_unreachable(true);
    c.api.break_watches();
    c.api.compact();
    c.api.set_unreachable(false);
    c.api
        .create(pod("httpbin-3", "198.18.1.3", "node-a"))
        .unwrap();
    wait_for("the Pod created after the relist", WAIT, || {
        c.configz()["objects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o == "Pod/demo/httpbin-3")
            .then_some(())
    });
    assert!(
        c.clusters()
            .contains(&"outbound|443||api2.example.com".to_string())
    );
}

#[test]
fn the_cacerts_secret_is_the_plug_in_ca() {
    use base64::Engine;
    // A CA made outside istiod, handed over as Istio's `cacerts` Secret.
    let ca = tempfile::tempdir().unwrap();
    istiod::ca::material::load_or_create_self_signed(
        ca.path(),
        &istiod::ca::material::SelfSignedOptions {
            trust_domain: "cluster.local".into(),
            ttl: Duration::from_secs(24 * 3600),
            rsa_key_size: 2048,
        },
    )
    .unwrap();
    let data: serde_json::Map<String, Value> = [
        "ca-cert.pem",
        "ca-key.pem",
        "cert-chain.pem",
        "root-cert.pem",
    ]
    .iter()
    .map(|f| {
        let bytes = std::fs::read(ca.path().join(f)).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
        (f.to_string(), json!(b64))
    })
    .collect();
    let root = std::fs::read_to_string(ca.path().join("root-cert.pem")).unwrap();
    let api = Cluster::api();
    api.create(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "cacerts", "namespace": "istio-system"},
        "data": data,
    }))
    .unwrap();
    api.set_token_review(Arc::new(|_: &str, audiences: &[String]| {
        TokenReviewAnswer::service_account("demo", "sleep", audiences)
    }));
    let c = Cluster::start(api, Options::default());

    // No self-signed root was made; certificates chain to the Secret's root,
    // and that root is what every namespace gets.
    assert!(!c.dir.join("etc/istio-ca-secret").exists());
    let (sans, last) = c.csr_trusting(&root, "t").unwrap();
    assert_eq!(sans, vec!["spiffe://cluster.local/ns/demo/sa/sleep"]);
    assert_eq!(last.trim(), root.trim());
    let cm = wait_for("istio-ca-root-cert in demo", WAIT, || {
        root_configmap(&c.api, "demo")
    });
    assert_eq!(cm["data"]["root-cert.pem"], root.as_str());
}

#[test]
fn secrets_are_read_redacted_and_a_bad_one_is_reported() {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["a.example.com".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let key_pem = key.serialize_pem();
    let api = Cluster::api();
    api.create(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "good", "namespace": "istio-system"},
        "data": {"tls.crt": b64(&cert.pem()), "tls.key": b64(&key_pem)},
    }))
    .unwrap();
    api.create(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "bad", "namespace": "istio-system"},
        "data": {"tls.crt": b64("SECRET-NOT-PEM"), "tls.key": b64(&key_pem)},
    }))
    .unwrap();
    let c = Cluster::start(api, Options::default());
    let configz = wait_for("the good Secret read", WAIT, || {
        let configz = c.configz();
        configz["objects"]
            .as_array()
            .unwrap()
            .contains(&json!("Secret/istio-system/good"))
            .then_some(configz)
    });
    let text = configz.to_string();
    assert!(
        text.contains("Secret/istio-system/bad: data.tls.crt"),
        "the bad Secret is reported by name and key: {}",
        configz["errors"]
    );
    assert!(
        !configz["objects"]
            .as_array()
            .unwrap()
            .contains(&json!("Secret/istio-system/bad"))
    );
    let key_body = key_pem.lines().nth(1).unwrap();
    for (what, shown) in [("configz", text), ("istiod's log", c.istiod.log())] {
        assert!(
            !shown.contains(key_body) && !shown.contains("SECRET-NOT-PEM"),
            "{what} shows Secret data"
        );
    }
}

#[test]
fn a_telemetry_is_read_from_the_api() {
    let c = Cluster::start(Cluster::api(), Options::default());
    c.api
        .create(json!({
            "apiVersion": "telemetry.istio.io/v1",
            "kind": "Telemetry",
            "metadata": {"name": "quiet", "namespace": "demo"},
            "spec": {"accessLogging": [{"disabled": true}]}
        }))
        .unwrap();
    wait_for("the Telemetry in istiod's store", WAIT, || {
        c.configz()["objects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o == "Telemetry/demo/quiet")
            .then_some(())
    });
}
