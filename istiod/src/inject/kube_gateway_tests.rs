//! The rendered objects against Istio's own deployment controller goldens
//! (`pilot/pkg/config/kube/gatewaycommon/testdata/deployment/*.yaml`,
//! vendored in `istiod/tests/testdata/gateway-deployment/`), each with the
//! Gateway and values of Istio's `TestConfigureIstioGateway` case.
//!
//! Normalised before comparing, each for a stated reason:
//! - Istio's test runs with ambient waypoints enabled, which adds
//!   `istio.io/dataplane-mode: none` to every object: this istiod has no
//!   ambient mode, so the label is dropped from the golden.
//! - Istio's test values set only `global.hub` and `global.tag`; Go's
//!   template prints a missing value as `<no value>` or `<nil>`, and treats
//!   a missing `revision` as non-empty (`istiod-<no value>.`): our values
//!   read missing keys as empty, so those print as empty text.
//! - A template's unquoted empty uid renders as `null`, a quoted one as
//!   `""`: both are the empty uid of Istio's test Gateway.
//! - An empty `annotations` map and a missing one are the same, and so are
//!   an environment variable's empty `value` and a missing one (the API
//!   stores `value: ""` as absent; our renderer omits it).
//! - The first document is Istio's write of the Gateway's
//!   `gateway.istio.io/controller-version` annotation, which this istiod
//!   does not write (it reads it: see the controller).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;

const GOLDENS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/testdata/gateway-deployment"
);

fn golden(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(format!("{GOLDENS}/{name}.yaml")).expect("golden");
    let docs = crate::inject::parse_yaml_documents(&text).expect("golden YAML");
    docs.into_iter()
        .filter(|d| d["kind"] != "Gateway")
        .map(|mut d| {
            normalise(&mut d);
            d
        })
        .collect()
}

fn normalise(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for x in m.values_mut() {
                normalise(x);
            }
            if let Some(Value::Object(labels)) = m.get_mut("labels") {
                labels.remove("istio.io/dataplane-mode");
            }
            if m.get("annotations")
                .is_some_and(|a| a.as_object().is_some_and(|a| a.is_empty()))
            {
                m.remove("annotations");
            }
            if m.get("value") == Some(&json!("")) && m.contains_key("name") {
                m.remove("value");
            }
            if m.get("kind") == Some(&json!("Gateway")) && m.get("uid") == Some(&Value::Null) {
                m.insert("uid".into(), json!(""));
            }
        }
        Value::Array(a) => a.iter_mut().for_each(normalise),
        Value::String(s) => {
            *s = s
                .replace("istiod-<no value>.", "istiod.")
                .replace("<no value>", "")
                .replace("<nil>", "");
        }
        _ => {}
    }
}

fn values() -> Values {
    Values::from_yaml("global:\n  hub: test\n  tag: test\n").unwrap()
}

fn rendered(gw: &GatewayFacts, overlays: &[BTreeMap<String, String>]) -> Vec<Value> {
    let d = derive(gw, true);
    let v = values();
    let mesh = MeshSettings::default();
    let pc = Map::new();
    let input = KubeGatewayInput {
        name: &gw.name,
        namespace: &gw.namespace,
        uid: &gw.uid,
        class: &gw.class,
        gateway_annotations: &gw.annotations,
        deployment_name: d.deployment_name,
        service_account: d.service_account,
        ports: d.ports,
        service_type: d.service_type,
        address: gw.addresses.first().cloned(),
        cluster_id: "Kubernetes",
        revision: "",
        infra_labels: d.infra_labels,
        infra_annotations: d.infra_annotations,
        values: &v,
        mesh: &mesh,
        proxy_config: &pc,
    };
    let mut out = render_with_overlays(&input, overlays).expect("renders");
    out.iter_mut().for_each(normalise);
    out
}

fn assert_same(case: &str, ours: &[Value], istio: &[Value]) {
    assert_eq!(
        ours.iter().map(|o| o["kind"].clone()).collect::<Vec<_>>(),
        istio.iter().map(|o| o["kind"].clone()).collect::<Vec<_>>(),
        "{case}: the objects"
    );
    for (o, i) in ours.iter().zip(istio) {
        assert_eq!(
            o,
            i,
            "{case}: {} differs:\nours:  {}\nistio: {}",
            i["kind"],
            serde_json::to_string_pretty(o).unwrap(),
            serde_json::to_string_pretty(i).unwrap()
        );
    }
}

fn gateway(name: &str) -> GatewayFacts {
    GatewayFacts {
        name: name.into(),
        namespace: "default".into(),
        class: "istio".into(),
        ..GatewayFacts::default()
    }
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn simple() {
    let mut gw = gateway("default");
    gw.labels = map(&[("should", "see")]);
    gw.annotations = map(&[("should", "see")]);
    assert_same("simple", &rendered(&gw, &[]), &golden("simple"));
}

#[test]
fn cluster_ip() {
    let mut gw = gateway("default");
    gw.annotations = map(&[
        ("networking.istio.io/service-type", "ClusterIP"),
        ("gateway.istio.io/name-override", "default"),
    ]);
    gw.listeners = vec![("http".into(), 80, "HTTP".into())];
    assert_same("cluster-ip", &rendered(&gw, &[]), &golden("cluster-ip"));
}

#[test]
fn infrastructure_labels_annotations() {
    let mut gw = gateway("default");
    gw.labels = map(&[("should-not", "see")]);
    gw.annotations = map(&[("should-not", "see")]);
    gw.infrastructure = Some(Infrastructure {
        labels: Some(map(&[
            ("foo", "bar"),
            ("gateway.networking.k8s.io/ignore", "true"),
        ])),
        annotations: Some(map(&[
            ("fizz", "buzz"),
            ("gateway.networking.k8s.io/ignore", "true"),
        ])),
        parameters_ref: None,
    });
    assert_same(
        "infrastructure-labels-annotations",
        &rendered(&gw, &[]),
        &golden("infrastructure-labels-annotations"),
    );
}

#[test]
fn customizations() {
    let mut gw = gateway("namespace");
    gw.infrastructure = Some(Infrastructure {
        labels: Some(map(&[("foo", "bar")])),
        annotations: None,
        parameters_ref: Some(ParametersRef {
            group: String::new(),
            kind: "ConfigMap".into(),
            name: "gw-options".into(),
        }),
    });
    let cm = map(&[
        ("podDisruptionBudget", "\nspec:\n  minAvailable: 1"),
        (
            "horizontalPodAutoscaler",
            "\nspec:\n  minReplicas: 2\n  maxReplicas: 2",
        ),
        (
            "deployment",
            "\nmetadata:\n  annotations:\n    cm-annotation: cm-annotation-value\nspec:\n  replicas: 4\n  template:\n    spec:\n      containers:\n      - name: istio-proxy\n        resources:\n          requests:\n            cpu: 222m",
        ),
    ]);
    assert_same(
        "customizations",
        &rendered(&gw, &[cm]),
        &golden("customizations"),
    );
}

#[test]
fn illegal_customizations_are_refused() {
    let gw = gateway("namespace");
    let d = derive(&gw, true);
    let v = values();
    let mesh = MeshSettings::default();
    let pc = Map::new();
    let input = KubeGatewayInput {
        name: &gw.name,
        namespace: &gw.namespace,
        uid: "",
        class: &gw.class,
        gateway_annotations: &gw.annotations,
        deployment_name: d.deployment_name,
        service_account: d.service_account,
        ports: d.ports,
        service_type: d.service_type,
        address: None,
        cluster_id: "Kubernetes",
        revision: "",
        infra_labels: d.infra_labels,
        infra_annotations: d.infra_annotations,
        values: &v,
        mesh: &mesh,
        proxy_config: &pc,
    };
    let renamed = map(&[("deployment", "metadata:\n  name: not-allowed")]);
    assert_eq!(
        render_with_overlays(&input, &[renamed]),
        Err(KubeGatewayError::IllegalMetadataChange("deployment".into()))
    );
    let unknown = map(&[("daemonSet", "{}")]);
    assert!(matches!(
        render_with_overlays(&input, &[unknown]),
        Err(KubeGatewayError::UnsupportedOverlay(_))
    ));
    let directive = map(&[(
        "deployment",
        "spec:\n  template:\n    spec:\n      containers:\n      - name: istio-proxy\n        $patch: delete",
    )]);
    assert!(matches!(
        render_with_overlays(&input, &[directive]),
        Err(KubeGatewayError::Directive { .. })
    ));
}

#[test]
fn ports_follow_the_listeners() {
    let ports = service_ports(&[
        ("http".into(), 80, "HTTP".into()),
        ("other".into(), 80, "HTTP".into()),
        ("a.b".into(), 443, "HTTPS".into()),
        ("http".into(), 8080, "HTTP".into()),
    ]);
    let names: Vec<&str> = ports.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["status-port", "http", "a-b", "http-8080"]);
    assert_eq!(ports[2]["appProtocol"], "https");
}

#[test]
fn managed_unless_a_hostname_or_several_addresses() {
    assert!(is_managed(&[]));
    assert!(is_managed(&[Some("IPAddress".into())]));
    assert!(is_managed(&[None]));
    assert!(!is_managed(&[Some("Hostname".into())]));
    assert!(!is_managed(&[None, None]));
}
