//! Offline validation of the install manifests in `manifests/` (the repository's, nothing
//! outside it): what `kubectl apply` would reject, and what would only show in a cluster.
//!
//! - Schema: every document of every `manifests/**/*.yaml` is deserialized into the
//!   k8s-openapi type of its `apiVersion`/`kind`, serialized back and compared with the
//!   original. k8s-openapi drops fields it does not know and fails on wrong types, so an
//!   unknown or misspelled key, or a wrong type, shows as a difference. A kind with no type
//!   here fails. CRDs must give every served version an `openAPIV3Schema`.
//! - Cross-references: the Deployment's service account, the Service's selector and target
//!   ports, the webhooks' Service, port and paths, the ConfigMaps the Deployment mounts,
//!   the RBAC bindings, and the container arguments, parsed by istiod's own
//!   `DiscoveryArgs` and `Config::from_args`.
//! - Istio's chart: the container and Service ports it declares, its webhook names and
//!   selectors, the token audience.
//! - istiod itself: every kind the Kubernetes source watches has a CRD (Istio kinds) and a
//!   ClusterRole rule; the mesh ConfigMap parses with istiod's mesh parser; the injector's
//!   values parse as injection values and name this project's images.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::{Args, FromArgMatches};
use istiod::config::{Config, DiscoveryArgs};
use istiod::model::meta::Kind;
use k8s_openapi::api::admissionregistration::v1 as admission;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// One YAML document of a manifest file.
struct Doc {
    /// `file#index`, for messages.
    origin: String,
    value: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }

    fn namespace(&self) -> &str {
        self.value["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
    }

    fn typed<T: DeserializeOwned>(&self) -> T {
        serde_json::from_value(self.value.clone())
            .unwrap_or_else(|e| panic!("{}: {e}", self.origin))
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("istiod sits in the workspace")
        .to_path_buf()
}

/// Every document of every `*.yaml` under `dir` (relative to the repository), in file order.
fn documents_under(dir: &str) -> Vec<Doc> {
    let root = repo_root();
    let mut files: Vec<PathBuf> = walkdir::WalkDir::new(root.join(dir))
        .follow_links(true)
        .into_iter()
        .map(|e| e.expect("walking manifests").into_path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        // kustomize's inputs, not objects: the overlays are rendered and
        // validated by manifests_revisions.rs.
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name != "kustomization.yaml" && !name.ends_with(".patch.yaml")
        })
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("reading a manifest");
        let rel = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (i, de) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
            let value: Value = serde::Deserialize::deserialize(de)
                .unwrap_or_else(|e| panic!("{rel} document {i}: not YAML: {e}"));
            if value.is_null() {
                continue;
            }
            docs.push(Doc {
                origin: format!("{rel}#{i}"),
                value,
            });
        }
    }
    docs
}

fn all_documents() -> Vec<Doc> {
    let docs = documents_under("manifests");
    assert!(!docs.is_empty(), "no manifests found");
    docs
}

fn istiod_documents() -> Vec<Doc> {
    documents_under("manifests/istiod")
}

/// Deserializes `v` as `T` and serializes it back.
fn roundtrip<T: DeserializeOwned + Serialize>(v: &Value) -> Result<Value, String> {
    let typed: T = serde_path_to_error::deserialize(v.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

/// The round trip through the typed struct of the document's kind.
fn typed_roundtrip(doc: &Doc) -> Result<Value, String> {
    let api_version = doc.value["apiVersion"].as_str().unwrap_or_default();
    match (api_version, doc.kind()) {
        ("v1", "Namespace") => roundtrip::<Namespace>(&doc.value),
        ("v1", "ServiceAccount") => roundtrip::<ServiceAccount>(&doc.value),
        ("v1", "ConfigMap") => roundtrip::<ConfigMap>(&doc.value),
        ("v1", "Secret") => roundtrip::<Secret>(&doc.value),
        ("v1", "Service") => roundtrip::<Service>(&doc.value),
        ("apps/v1", "Deployment") => roundtrip::<Deployment>(&doc.value),
        ("policy/v1", "PodDisruptionBudget") => {
            roundtrip::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(&doc.value)
        }
        ("autoscaling/v2", "HorizontalPodAutoscaler") => {
            roundtrip::<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>(&doc.value)
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => roundtrip::<ClusterRole>(&doc.value),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            roundtrip::<ClusterRoleBinding>(&doc.value)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => roundtrip::<Role>(&doc.value),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => roundtrip::<RoleBinding>(&doc.value),
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            roundtrip::<admission::MutatingWebhookConfiguration>(&doc.value)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            roundtrip::<admission::ValidatingWebhookConfiguration>(&doc.value)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            roundtrip::<admission::ValidatingAdmissionPolicy>(&doc.value)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            roundtrip::<admission::ValidatingAdmissionPolicyBinding>(&doc.value)
        }
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            roundtrip::<CustomResourceDefinition>(&doc.value)
        }
        (v, k) => Err(format!(
            "no schema for {v}/{k} here: add its k8s-openapi type to typed_roundtrip"
        )),
    }
}

/// Up to `limit` paths where `a` and `b` differ, with both sides. Numbers compare by value:
/// JSON Schema bounds (`minimum: 1`) are float64 in the API (`JSONSchemaProps`), so they
/// come back as `1.0`, as the API server itself would store them.
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>, limit: usize) {
    if out.len() >= limit || a == b {
        return;
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (xa, yb) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                differences(xa, yb, &format!("{path}.{k}"), out, limit);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (xa, yb)) in x.iter().zip(y).enumerate() {
                differences(xa, yb, &format!("{path}[{i}]"), out, limit);
            }
        }
        _ => {
            let show = |v: &Value| match v {
                Value::Null => "(absent)".to_string(),
                v => v.to_string(),
            };
            out.push(format!(
                "{path}: manifest {} / after the typed round trip {}",
                show(a),
                show(b)
            ))
        }
    }
}

#[test]
fn every_document_survives_the_typed_round_trip() {
    let mut failures = Vec::new();
    for doc in all_documents() {
        match typed_roundtrip(&doc) {
            Ok(back) => {
                let mut diffs = Vec::new();
                differences(&doc.value, &back, "", &mut diffs, 8);
                if diffs.is_empty() {
                    continue;
                }
                failures.push(format!(
                    "{} ({} {}): unknown, misspelled or mistyped fields:\n    {}",
                    doc.origin,
                    doc.kind(),
                    doc.name(),
                    diffs.join("\n    ")
                ));
            }
            Err(e) => failures.push(format!(
                "{} ({} {}): {e}",
                doc.origin,
                doc.kind(),
                doc.name()
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_served_crd_version_has_a_schema() {
    let mut crds = 0;
    for doc in all_documents()
        .into_iter()
        .filter(|d| d.kind() == "CustomResourceDefinition")
    {
        crds += 1;
        let crd: CustomResourceDefinition = doc.typed();
        assert!(!crd.spec.versions.is_empty(), "{}: no versions", doc.origin);
        for v in crd.spec.versions.iter().filter(|v| v.served) {
            assert!(
                v.schema
                    .as_ref()
                    .is_some_and(|s| s.open_api_v3_schema.is_some()),
                "{} ({}): served version {} has no openAPIV3Schema",
                doc.origin,
                doc.name(),
                v.name
            );
        }
    }
    assert!(crds > 0, "no CRDs under manifests/");
}

/// Every Istio kind istiod's Kubernetes source watches has a CRD serving one of the versions
/// istiod asks for; without it istiod treats the kind as empty.
#[test]
fn the_crds_serve_every_istio_kind_istiod_watches() {
    let crds: Vec<CustomResourceDefinition> = all_documents()
        .iter()
        .filter(|d| d.kind() == "CustomResourceDefinition")
        .map(Doc::typed)
        .collect();
    for kind in Kind::ALL.into_iter().filter(|k| k.is_istio()) {
        let plural = istiod::source::kube::plural(kind);
        let crd = crds
            .iter()
            .find(|c| c.spec.group == kind.group() && c.spec.names.plural == plural)
            .unwrap_or_else(|| panic!("no CRD for {plural}.{}", kind.group()));
        assert_eq!(crd.spec.names.kind, kind.as_str());
        assert!(
            crd.spec
                .versions
                .iter()
                .any(|v| v.served && kind.versions().contains(&v.name.as_str())),
            "{plural}.{}: serves none of {:?}",
            kind.group(),
            kind.versions()
        );
    }
}

/// The one document of `kind` named `name`.
fn find<'a>(docs: &'a [Doc], kind: &str, name: &str) -> &'a Doc {
    let found: Vec<&Doc> = docs
        .iter()
        .filter(|d| d.kind() == kind && d.name() == name)
        .collect();
    assert_eq!(found.len(), 1, "expected exactly one {kind} {name}");
    found[0]
}

fn deployment(docs: &[Doc]) -> (&Doc, Deployment) {
    let doc = find(docs, "Deployment", "istiod");
    (doc, doc.typed())
}

fn service(docs: &[Doc]) -> Service {
    find(docs, "Service", "istiod").typed()
}

fn discovery_container(d: &Deployment) -> k8s_openapi::api::core::v1::Container {
    let spec = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
    let containers = &spec.expect("a pod spec").containers;
    assert_eq!(containers.len(), 1, "istiod's pod runs one container");
    assert_eq!(containers[0].name, "discovery", "Istio's container name");
    containers[0].clone()
}

#[test]
fn everything_lives_in_istio_system_which_is_created() {
    let docs = istiod_documents();
    find(&docs, "Namespace", "istio-system");
    for d in &docs {
        let cluster_scoped = matches!(
            d.kind(),
            "Namespace"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "MutatingWebhookConfiguration"
                | "ValidatingWebhookConfiguration"
        );
        let want = if cluster_scoped { "" } else { "istio-system" };
        assert_eq!(d.namespace(), want, "{}: namespace", d.origin);
    }
}

#[test]
fn the_deployment_runs_as_the_service_account() {
    let docs = istiod_documents();
    let (doc, d) = deployment(&docs);
    let pod = d.spec.unwrap().template.spec.unwrap();
    let sa = pod.service_account_name.expect("serviceAccountName");
    assert_eq!(sa, "istiod");
    assert_eq!(
        find(&docs, "ServiceAccount", &sa).namespace(),
        doc.namespace()
    );
}

#[test]
fn the_selectors_select_the_pod() {
    let docs = istiod_documents();
    let (_, d) = deployment(&docs);
    let spec = d.spec.unwrap();
    let labels = spec.template.metadata.unwrap().labels.unwrap();
    let selects =
        |sel: &BTreeMap<String, String>| sel.iter().all(|(k, v)| labels.get(k) == Some(v));
    let match_labels = spec.selector.match_labels.unwrap_or_default();
    assert!(!match_labels.is_empty() && selects(&match_labels));
    assert!(spec.selector.match_expressions.is_none());
    let svc_selector = service(&docs).spec.unwrap().selector.unwrap();
    assert!(
        selects(&svc_selector),
        "the Service's selector {svc_selector:?} does not select the pod labels {labels:?}"
    );
    assert_eq!(
        labels.get("sidecar.istio.io/inject").map(String::as_str),
        Some("false"),
        "istiod is never injected"
    );
}

fn container_ports(c: &k8s_openapi::api::core::v1::Container) -> BTreeMap<String, i32> {
    c.ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap_or_default(), p.container_port))
        .collect()
}

#[test]
fn the_ports_are_istio_charts_and_the_service_reaches_them() {
    let docs = istiod_documents();
    let (_, d) = deployment(&docs);
    let ports = container_ports(&discovery_container(&d));
    // istio-discovery templates/deployment.yaml.
    let chart: BTreeMap<String, i32> = [
        ("http-debug", 8080),
        ("grpc-xds", 15010),
        ("tls-xds", 15012),
        ("https-webhooks", 15017),
        ("http-monitoring", 15014),
    ]
    .into_iter()
    .map(|(n, p)| (n.to_string(), p))
    .collect();
    assert_eq!(ports, chart, "the container ports of Istio's chart");

    let svc = service(&docs).spec.unwrap();
    let svc_ports: BTreeMap<String, (i32, i32)> = svc
        .ports
        .iter()
        .flatten()
        .map(|p| {
            let target = match &p.target_port {
                None => p.port,
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(t)) => *t,
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(n)) => {
                    *ports
                        .get(n)
                        .unwrap_or_else(|| panic!("no container port {n}"))
                }
            };
            (p.name.clone().unwrap_or_default(), (p.port, target))
        })
        .collect();
    // istio-discovery templates/service.yaml.
    let chart_svc: BTreeMap<String, (i32, i32)> = [
        ("grpc-xds", (15010, 15010)),
        ("https-dns", (15012, 15012)),
        ("https-webhook", (443, 15017)),
        ("http-monitoring", (15014, 15014)),
    ]
    .into_iter()
    .map(|(n, p)| (n.to_string(), p))
    .collect();
    assert_eq!(svc_ports, chart_svc, "the Service ports of Istio's chart");
    let container: BTreeSet<i32> = ports.values().copied().collect();
    for (name, (_, target)) in &svc_ports {
        assert!(
            container.contains(target),
            "Service port {name} targets {target}, which the container does not declare"
        );
    }
}

/// The Deployment's environment as the kubelet would give it: literal values, the
/// downward-API ones filled in, and the in-cluster API server variables.
fn pod_env(d: &Deployment, doc: &Doc) -> common::env::MapEnv {
    let c = discovery_container(d);
    let mut env = BTreeMap::new();
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), None) => v.clone(),
            (None, Some(from)) => {
                let path = from
                    .field_ref
                    .as_ref()
                    .map(|f| f.field_path.as_str())
                    .unwrap_or_else(|| panic!("env {}: only fieldRef is expected", e.name));
                match path {
                    "metadata.name" => "istiod-5d8f7b9c4-abcde".into(),
                    "metadata.namespace" => doc.namespace().into(),
                    "spec.serviceAccountName" => "istiod".into(),
                    other => panic!("env {}: unexpected fieldRef {other}", e.name),
                }
            }
            (None, None) => String::new(),
            (Some(_), Some(_)) => panic!("env {}: both value and valueFrom", e.name),
        };
        assert!(
            env.insert(e.name.clone(), value).is_none(),
            "env {} twice",
            e.name
        );
    }
    env.insert("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into());
    env.insert("KUBERNETES_SERVICE_PORT".into(), "443".into());
    common::env::MapEnv(env)
}

/// Parses `args` as `pilot-discovery <args>` does: istiod's global logging flags, then the
/// `discovery` subcommand's `DiscoveryArgs`. Unknown flags fail here (istiod itself only
/// warns about them), so every flag the manifest passes is one istiod implements.
fn parse_discovery(args: &[String]) -> (String, DiscoveryArgs) {
    let cmd = clap::Command::new("pilot-discovery")
        .arg(
            clap::Arg::new("log_output_level")
                .long("log_output_level")
                .global(true)
                .default_value(common::log::DEFAULT_LOG_OUTPUT_LEVEL),
        )
        .subcommand_required(true)
        .subcommand(DiscoveryArgs::augment_args(clap::Command::new("discovery")));
    let matches = cmd
        .try_get_matches_from(
            std::iter::once("pilot-discovery".to_string()).chain(args.iter().cloned()),
        )
        .unwrap_or_else(|e| panic!("the Deployment's args {args:?}: {e}"));
    let (sub, sub_matches) = matches.subcommand().expect("a subcommand");
    assert_eq!(sub, "discovery");
    let level = sub_matches
        .get_one::<String>("log_output_level")
        .cloned()
        .unwrap_or_default();
    let parsed = DiscoveryArgs::from_arg_matches(sub_matches).expect("DiscoveryArgs");
    (level, parsed)
}

#[test]
fn the_container_args_parse_with_istiods_own_parser() {
    let docs = istiod_documents();
    let (doc, d) = deployment(&docs);
    let c = discovery_container(&d);
    assert!(
        c.command.is_none(),
        "the image's entrypoint (pilot-discovery) runs"
    );
    let args = c.args.clone().expect("args");
    // Istio's chart, rendered with its default values.
    let chart = [
        "discovery",
        "--monitoringAddr=:15014",
        "--log_output_level=default:info",
        "--domain",
        "cluster.local",
        "--keepaliveMaxServerConnectionAge",
        "30m",
    ];
    assert_eq!(args, chart, "Istio's chart arguments");
    let (level, parsed) = parse_discovery(&args);
    common::log::filter(&level).unwrap_or_else(|e| panic!("--log_output_level={level}: {e}"));
    assert_eq!(parsed.domain, "cluster.local");
    assert_eq!(
        parsed.keepalive_max_server_connection_age,
        std::time::Duration::from_secs(30 * 60)
    );

    let env = pod_env(&d, doc);
    let config = Config::from_args(&parsed, &env)
        .unwrap_or_else(|e| panic!("istiod rejects the Deployment's configuration: {e}"));
    assert_eq!(config.mesh.namespace, doc.namespace());
    assert_eq!(config.mesh.cluster_id, "Kubernetes");
    assert_eq!(
        config.registry.kube,
        Some(istiod::kube::KubeConnection::InCluster),
        "in a Pod istiod uses its service account"
    );
    // Every address istiod listens on is a declared container port.
    let ports: BTreeSet<u16> = container_ports(&c)
        .values()
        .map(|p| u16::try_from(*p).unwrap())
        .collect();
    for (flag, addr) in [
        ("grpcAddr", config.server.grpc_addr),
        ("secureGRPCAddr", config.server.secure_grpc_addr),
        ("httpAddr", config.server.http_addr),
        ("monitoringAddr", config.server.monitoring_addr),
    ] {
        let addr = addr.unwrap_or_else(|| panic!("--{flag} is disabled"));
        assert!(
            ports.contains(&addr.port()),
            "--{flag} {addr} is not a container port"
        );
    }
    let https = istiod::config::parse_listen_addr("httpsAddr", &parsed.https_addr)
        .unwrap()
        .expect("the webhooks are served");
    assert!(
        ports.contains(&https.port()),
        "--httpsAddr {https} is not a container port"
    );
    // The readiness probe asks istiod's HTTP port.
    let probe = c
        .readiness_probe
        .expect("readinessProbe")
        .http_get
        .expect("httpGet");
    assert_eq!(probe.path.as_deref(), Some("/ready"));
    assert_eq!(
        probe.port,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i32::from(
            config.server.http_addr.unwrap().port()
        ))
    );
}

#[test]
fn the_mounted_configmaps_and_secrets_exist_or_are_optional() {
    let docs = istiod_documents();
    let (doc, d) = deployment(&docs);
    let pod = d.spec.unwrap().template.spec.unwrap();
    let volumes = pod.volumes.unwrap_or_default();
    let mounts = discovery_container_mounts(&pod.containers[0]);
    for v in &volumes {
        assert!(mounts.contains(&v.name), "volume {} is not mounted", v.name);
        if let Some(cm) = &v.config_map {
            let exists = docs.iter().any(|x| {
                x.kind() == "ConfigMap" && x.name() == cm.name && x.namespace() == doc.namespace()
            });
            // istiod writes the root ConfigMap itself, in every namespace including its own.
            let written_by_istiod = cm.name == istiod::ca::namespace_controller::CA_ROOT_CONFIGMAP;
            assert!(
                exists || (written_by_istiod && cm.optional == Some(true)),
                "volume {}: ConfigMap {} is neither installed nor optional and written by istiod",
                v.name,
                cm.name
            );
        }
        if let Some(s) = &v.secret {
            // Secrets are the user's (a plugged-in CA, a remote kubeconfig): optional.
            assert_eq!(
                s.optional,
                Some(true),
                "volume {}: Secret must be optional",
                v.name
            );
        }
    }
    for m in &mounts {
        assert!(
            volumes.iter().any(|v| &v.name == m),
            "mount {m} has no volume"
        );
    }
    // The ConfigMaps istiod reads through the API exist.
    find(&docs, "ConfigMap", istiod::mesh::MESH_CONFIGMAP);
    find(&docs, "ConfigMap", "istio-sidecar-injector");
}

fn discovery_container_mounts(c: &k8s_openapi::api::core::v1::Container) -> Vec<String> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.clone())
        .collect()
}

#[test]
fn the_token_volume_is_for_istiods_audience() {
    let docs = istiod_documents();
    let (_, d) = deployment(&docs);
    let pod = d.spec.unwrap().template.spec.unwrap();
    let token = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.name == "istio-token")
        .expect("the istio-token volume");
    let sources = token.projected.unwrap().sources.unwrap();
    let sat = sources[0].service_account_token.as_ref().unwrap();
    assert_eq!(
        sat.audience.as_deref(),
        Some(istiod::ca::authn::DEFAULT_AUDIENCE)
    );
    assert_eq!(sat.path, "istio-token");
}

fn webhook_service_target(
    docs: &[Doc],
    what: &str,
    svc_ref: Option<&admission::ServiceReference>,
) -> (String, i32) {
    let svc_ref = svc_ref.unwrap_or_else(|| panic!("{what}: no clientConfig.service"));
    let svc = find(docs, "Service", &svc_ref.name);
    assert_eq!(
        svc.namespace(),
        svc_ref.namespace,
        "{what}: Service namespace"
    );
    let port = svc_ref.port.unwrap_or(443);
    let svc: Service = svc.typed();
    let p = svc
        .spec
        .unwrap()
        .ports
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.port == port)
        .unwrap_or_else(|| panic!("{what}: the Service has no port {port}"));
    let target = match p.target_port {
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(t)) => t,
        None => p.port,
        Some(other) => panic!("{what}: named targetPort {other:?}"),
    };
    (svc_ref.path.clone().unwrap_or_default(), target)
}

fn webhook_port(docs: &[Doc]) -> i32 {
    let (_, d) = deployment(docs);
    let args = discovery_container(&d).args.unwrap();
    let (_, parsed) = parse_discovery(&args);
    let addr = istiod::config::parse_listen_addr("httpsAddr", &parsed.https_addr)
        .unwrap()
        .unwrap();
    i32::from(addr.port())
}

/// The Deployment's `REVISION`: istiod patches the webhook configurations labelled with it.
fn revision(docs: &[Doc]) -> String {
    let (_, d) = deployment(docs);
    discovery_container(&d)
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "REVISION")
        .and_then(|e| e.value.clone())
        .unwrap_or_else(|| "default".into())
}

fn rev_label(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<&str> {
    meta.labels
        .as_ref()?
        .get("istio.io/rev")
        .map(String::as_str)
}

#[test]
fn the_injection_webhooks_are_istio_charts_and_reach_istiod() {
    let docs = istiod_documents();
    let https = webhook_port(&docs);
    let mwc: admission::MutatingWebhookConfiguration = find(
        &docs,
        "MutatingWebhookConfiguration",
        "istio-sidecar-injector",
    )
    .typed();
    assert_eq!(
        rev_label(&mwc.metadata),
        Some(revision(&docs).as_str()),
        "istiod patches the configurations of its revision"
    );
    let hooks = mwc.webhooks.unwrap();
    let names: Vec<&str> = hooks.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "rev.namespace.sidecar-injector.istio.io",
            "rev.object.sidecar-injector.istio.io",
            "namespace.sidecar-injector.istio.io",
            "object.sidecar-injector.istio.io",
        ]
    );
    let selector = |s: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>| {
        s.as_ref()
            .unwrap()
            .match_expressions
            .iter()
            .flatten()
            .map(|e| {
                let values = e.values.clone().unwrap_or_default().join(",");
                format!("{} {} {values}", e.key, e.operator)
            })
            .collect::<Vec<_>>()
    };
    // istio-discovery templates/mutatingwebhook.yaml, default revision.
    let expected: [(&[&str], &[&str]); 4] = [
        (
            &["istio.io/rev In default", "istio-injection DoesNotExist "],
            &["sidecar.istio.io/inject NotIn false"],
        ),
        (
            &[
                "istio.io/rev DoesNotExist ",
                "istio-injection DoesNotExist ",
            ],
            &[
                "sidecar.istio.io/inject NotIn false",
                "istio.io/rev In default",
            ],
        ),
        (
            &["istio-injection In enabled"],
            &["sidecar.istio.io/inject NotIn false"],
        ),
        (
            &[
                "istio-injection DoesNotExist ",
                "istio.io/rev DoesNotExist ",
            ],
            &[
                "sidecar.istio.io/inject In true",
                "istio.io/rev DoesNotExist ",
            ],
        ),
    ];
    for (h, (ns, obj)) in hooks.iter().zip(expected) {
        assert_eq!(
            selector(&h.namespace_selector),
            ns,
            "{}: namespaceSelector",
            h.name
        );
        assert_eq!(
            selector(&h.object_selector),
            obj,
            "{}: objectSelector",
            h.name
        );
        let (path, target) =
            webhook_service_target(&docs, &h.name, h.client_config.service.as_ref());
        assert_eq!(path, "/inject", "{}", h.name);
        assert_eq!(target, https, "{}: reaches istiod's --httpsAddr", h.name);
        assert_eq!(h.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(h.side_effects, "None");
        assert_eq!(h.admission_review_versions, ["v1"]);
        assert!(
            h.client_config.ca_bundle.is_none(),
            "istiod writes the caBundle"
        );
        let rules = h.rules.as_ref().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].operations.as_deref(),
            Some(&["CREATE".to_string()][..])
        );
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["pods".to_string()][..])
        );
    }
}

#[test]
fn the_validation_webhook_is_istio_charts_and_reaches_istiod() {
    let docs = istiod_documents();
    let https = webhook_port(&docs);
    let vwc: admission::ValidatingWebhookConfiguration = find(
        &docs,
        "ValidatingWebhookConfiguration",
        "istio-validator-istio-system",
    )
    .typed();
    assert_eq!(rev_label(&vwc.metadata), Some(revision(&docs).as_str()));
    let hooks = vwc.webhooks.unwrap();
    assert_eq!(hooks.len(), 1);
    let h = &hooks[0];
    assert_eq!(h.name, "rev.validation.istio.io");
    let (path, target) = webhook_service_target(&docs, &h.name, h.client_config.service.as_ref());
    assert_eq!(path, "/validate");
    assert_eq!(target, https);
    assert_eq!(
        h.failure_policy.as_deref(),
        Some("Ignore"),
        "Istio fails open until ready"
    );
    let rules = h.rules.as_ref().unwrap();
    let groups: BTreeSet<&str> = rules
        .iter()
        .flat_map(|r| r.api_groups.iter().flatten().map(String::as_str))
        .collect();
    let istio_groups: BTreeSet<&str> = Kind::ALL
        .iter()
        .filter(|k| k.is_istio())
        .map(|k| k.group())
        .collect();
    assert!(
        istio_groups.is_subset(&groups),
        "validation covers {groups:?}, istiod reads {istio_groups:?}"
    );
}

/// Whether `rules` allow `verb` on `group`/`resource` (named `name` when given).
fn allows(
    rules: &[PolicyRule],
    group: &str,
    resource: &str,
    verb: &str,
    name: Option<&str>,
) -> bool {
    rules.iter().any(|r| {
        let has =
            |list: &Option<Vec<String>>, v: &str| list.iter().flatten().any(|x| x == v || x == "*");
        has(&r.api_groups, group)
            && has(&r.resources, resource)
            && r.verbs.iter().any(|v| v == verb || v == "*")
            && match (&r.resource_names, name) {
                (None, _) => true,
                (Some(names), Some(n)) => names.iter().any(|x| x == n),
                (Some(_), None) => false,
            }
    })
}

#[test]
fn rbac_grants_what_istiod_uses_to_its_service_account() {
    let docs = istiod_documents();
    let cr: ClusterRole = find(&docs, "ClusterRole", "istiod-clusterrole-istio-system").typed();
    let rules = cr.rules.unwrap_or_default();
    // The Kubernetes source lists and watches every kind it models.
    for kind in Kind::ALL {
        let plural = istiod::source::kube::plural(kind);
        for verb in ["list", "watch"] {
            assert!(
                allows(&rules, kind.group(), plural, verb, None),
                "ClusterRole lacks {verb} on {plural}.{}",
                kind.group()
            );
        }
    }
    // The autoregistration controller writes WorkloadEntries and their status.
    for verb in ["create", "patch", "delete"] {
        assert!(
            allows(&rules, "networking.istio.io", "workloadentries", verb, None),
            "workloadentries {verb}"
        );
    }
    assert!(allows(
        &rules,
        "networking.istio.io",
        "workloadentries/status",
        "patch",
        None
    ));
    // The CA: token reviews, and the root ConfigMap in every namespace.
    assert!(allows(
        &rules,
        "authentication.k8s.io",
        "tokenreviews",
        "create",
        None
    ));
    for verb in ["get", "list", "watch", "create", "update"] {
        assert!(
            allows(&rules, "", "configmaps", verb, None),
            "configmaps {verb}"
        );
    }
    assert!(allows(&rules, "", "namespaces", "watch", None));
    // The webhook configurations whose caBundle istiod keeps current.
    for (resource, name) in [
        ("mutatingwebhookconfigurations", "istio-sidecar-injector"),
        (
            "validatingwebhookconfigurations",
            "istio-validator-istio-system",
        ),
    ] {
        find(
            &docs,
            if resource.starts_with("mutating") {
                "MutatingWebhookConfiguration"
            } else {
                "ValidatingWebhookConfiguration"
            },
            name,
        );
        for verb in ["get", "update", "patch"] {
            assert!(
                allows(
                    &rules,
                    "admissionregistration.k8s.io",
                    resource,
                    verb,
                    Some(name)
                ),
                "{resource} {name}: {verb}"
            );
        }
        // The patcher finds them by their revision label, not by name.
        for verb in ["list", "watch"] {
            assert!(
                allows(&rules, "admissionregistration.k8s.io", resource, verb, None),
                "{resource}: {verb} (with a label selector)"
            );
        }
    }
    // The Gateway API status the Kubernetes source writes back.
    for resource in [
        "gatewayclasses/status",
        "gateways/status",
        "httproutes/status",
        "tcproutes/status",
        "tlsroutes/status",
        "grpcroutes/status",
        "backendtlspolicies/status",
        "listenersets/status",
    ] {
        for verb in ["update", "patch"] {
            assert!(
                allows(&rules, "gateway.networking.k8s.io", resource, verb, None),
                "{resource}: {verb}"
            );
        }
    }
    // No write to anything cluster-wide beyond those.
    for r in &rules {
        let writes = r
            .verbs
            .iter()
            .any(|v| matches!(v.as_str(), "create" | "update" | "patch" | "delete" | "*"));
        if writes {
            let resources: Vec<&str> = r.resources.iter().flatten().map(String::as_str).collect();
            assert!(
                matches!(
                    resources.as_slice(),
                    ["configmaps"]
                        | ["tokenreviews"]
                        | ["mutatingwebhookconfigurations"]
                        | ["validatingwebhookconfigurations"]
                        // The Gateway API status istiod writes back.
                        | [
                            "gatewayclasses/status",
                            "gateways/status",
                            "httproutes/status",
                            "tcproutes/status",
                            "tlsroutes/status",
                            "grpcroutes/status",
                            "backendtlspolicies/status",
                            "listenersets/status"
                        ]
                        // Auto-registered VMs' WorkloadEntries and their health.
                        | ["workloadentries"]
                        | ["workloadentries/status"]
                ) && (r.resource_names.is_some()
                    || !resources[0].ends_with("webhookconfigurations")),
                "unexpected cluster-wide write: {r:?}"
            );
        }
    }

    // The CA's Secrets in istiod's namespace.
    let role: Role = find(&docs, "Role", "istiod").typed();
    let role_rules = role.rules.unwrap_or_default();
    assert!(allows(&role_rules, "", "secrets", "get", Some("cacerts")));
    for verb in ["get", "update"] {
        assert!(allows(
            &role_rules,
            "",
            "secrets",
            verb,
            Some("istio-ca-secret")
        ));
    }
    assert!(allows(&role_rules, "", "secrets", "create", None));

    // Both bindings give the roles to istiod's service account.
    let crb: ClusterRoleBinding = find(
        &docs,
        "ClusterRoleBinding",
        "istiod-clusterrole-istio-system",
    )
    .typed();
    assert_eq!(crb.role_ref.kind, "ClusterRole");
    assert_eq!(crb.role_ref.name, cr.metadata.name.clone().unwrap());
    let rb: RoleBinding = find(&docs, "RoleBinding", "istiod").typed();
    assert_eq!(rb.role_ref.kind, "Role");
    assert_eq!(rb.role_ref.name, role.metadata.name.clone().unwrap());
    for subjects in [crb.subjects.unwrap(), rb.subjects.unwrap()] {
        assert_eq!(subjects.len(), 1);
        let s = &subjects[0];
        assert_eq!(s.kind, "ServiceAccount");
        find(&docs, "ServiceAccount", &s.name);
        assert_eq!(s.namespace.as_deref(), Some("istio-system"));
    }
}

fn configmap_data(docs: &[Doc], name: &str) -> BTreeMap<String, String> {
    let cm: ConfigMap = find(docs, "ConfigMap", name).typed();
    cm.data.unwrap_or_default()
}

#[test]
fn the_mesh_configmap_parses_with_istiods_mesh_parser() {
    let docs = istiod_documents();
    let data = configmap_data(&docs, istiod::mesh::MESH_CONFIGMAP);
    let mesh = istiod::mesh::Mesh::parse(&data["mesh"])
        .unwrap_or_else(|e| panic!("ConfigMap istio, key mesh: {e:?}"));
    assert_eq!(mesh.trust_domain.as_deref(), Some("cluster.local"));
    let mesh_yaml: Value = serde_yaml_ng::from_str(&data["mesh"]).unwrap();
    assert_eq!(
        mesh_yaml["defaultConfig"]["discoveryAddress"], "istiod.istio-system.svc:15012",
        "the proxies reach the istiod Service's xDS port"
    );
    assert_eq!(mesh_yaml["rootNamespace"], "istio-system");
    let networks: Value = serde_yaml_ng::from_str(&data["meshNetworks"]).unwrap();
    assert!(networks["networks"].is_object(), "meshNetworks: {networks}");
}

/// The repository/name:tag of an image reference.
fn split_image(image: &str) -> (&str, &str, &str) {
    let (repo, tag) = image.rsplit_once(':').expect("an image tag");
    let (hub, name) = repo.rsplit_once('/').expect("a hub");
    (hub, name, tag)
}

#[test]
fn the_injector_configmap_holds_values_and_config_istiod_reads() {
    let docs = istiod_documents();
    let data = configmap_data(&docs, "istio-sidecar-injector");
    assert_eq!(
        data.keys().map(String::as_str).collect::<Vec<_>>(),
        ["config", "values"]
    );
    // `values` is JSON, as Istio's chart writes it.
    let json: Value = serde_json::from_str(&data["values"]).expect("values is JSON");
    for key in [
        "global",
        "sidecarInjectorWebhook",
        "revision",
        "pilot",
        "gateways",
    ] {
        assert!(json.get(key).is_some(), "values lacks {key}");
    }
    let values = istiod::inject::Values::from_yaml(&data["values"]).expect("injection values");
    // The proxies' image is this project's, as the Deployment's is.
    let (_, d) = deployment(&docs);
    let image = discovery_container(&d).image.unwrap();
    let (hub, name, tag) = split_image(&image);
    assert_eq!(name, "pilot", "Istio's image name for istiod");
    assert_eq!(values.string("global.hub"), hub);
    assert_eq!(values.string("global.tag"), tag);
    assert_eq!(
        tag,
        istiod::VERSION,
        "the images are tagged with the workspace version"
    );
    assert_eq!(values.string("global.proxy.image"), "proxyv2");
    assert_eq!(values.string("global.proxy.clusterDomain"), "cluster.local");
    assert_eq!(
        values.string("global.sds.token.aud"),
        istiod::ca::authn::DEFAULT_AUDIENCE
    );

    let config = istiod::inject::InjectorConfig::parse(&data["config"])
        .unwrap_or_else(|e| panic!("istio-sidecar-injector config: {e}"));
    assert_eq!(config.default_templates, ["sidecar"]);
    assert_eq!(config.policy, istiod::inject::policy::Policy::Enabled);
    assert!(config.always_inject_selector.is_empty() && config.never_inject_selector.is_empty());
    // The templates are the injector's built-ins, named as Istio's chart names them; their
    // text is not interpreted, so any other name would be a template that does not exist.
    let named: BTreeSet<&str> = config.templates.keys().map(String::as_str).collect();
    let built_in: BTreeSet<&str> = istiod::inject::Template::ALL
        .iter()
        .map(|t| t.name())
        .collect();
    assert_eq!(
        named, built_in,
        "the ConfigMap lists exactly the built-in templates"
    );
}

#[test]
fn the_paths_istiod_uses_are_on_the_right_volumes() {
    let docs = istiod_documents();
    let (doc, d) = deployment(&docs);
    let c = discovery_container(&d);
    let (_, parsed) = parse_discovery(&c.args.clone().unwrap());
    let config = Config::from_args(&parsed, &pod_env(&d, doc)).unwrap();
    let pod = d.spec.unwrap().template.spec.unwrap();
    let volumes = pod.volumes.unwrap_or_default();
    let mounts = c.volume_mounts.clone().unwrap_or_default();
    // istiod runs from `/` (images.rs checks the image's WORKDIR), so `./etc/cacerts` is
    // `/etc/cacerts`.
    let absolute = |p: &Path| Path::new("/").join(p.strip_prefix("./").unwrap_or(p));
    let mount_of = |p: &Path| {
        mounts
            .iter()
            .filter(|m| p.starts_with(&m.mount_path))
            .max_by_key(|m| m.mount_path.len())
            .cloned()
    };
    let volume = |name: &str| volumes.iter().find(|v| v.name == name).unwrap().clone();

    // The plugged-in CA is read from the `cacerts` Secret's mount.
    let root_ca = absolute(&config.ca.root_ca_dir);
    let m = mount_of(&root_ca).unwrap_or_else(|| panic!("{} is on no volume", root_ca.display()));
    assert_eq!(m.mount_path, root_ca.to_str().unwrap());
    let v = volume(&m.name);
    assert_eq!(
        v.secret.and_then(|s| s.secret_name).as_deref(),
        Some("cacerts")
    );

    // The self-signed root is written, and the root filesystem is read-only.
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let self_signed = absolute(&config.ca.self_signed_ca_dir);
    let m = mount_of(&self_signed).unwrap_or_else(|| {
        panic!(
            "istiod writes {} on the read-only root",
            self_signed.display()
        )
    });
    assert_ne!(m.read_only, Some(true), "{} is read-only", m.mount_path);
    assert!(
        volume(&m.name).empty_dir.is_some(),
        "{}: a writable volume",
        m.name
    );

    // The workload tokens istiod reviews carry the audience of its token volume.
    assert!(
        config
            .ca
            .token_audiences
            .iter()
            .any(|a| a == istiod::ca::authn::DEFAULT_AUDIENCE)
    );
    assert_eq!(
        config.ca.jwt_policy,
        istiod::ca::kube_jwt::JwtPolicy::ThirdParty
    );
    assert_eq!(config.mesh.trust_domain, "cluster.local");
}
