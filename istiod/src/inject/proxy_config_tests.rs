//! ProxyConfig objects applied at injection: the workload's `concurrency`
//! in the `PROXY_CONFIG` the agent reads, `environmentVariables` as the
//! proxy's environment and `image.imageType` as the image's tag, over the
//! Pod's own annotation where Istio puts them.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{InjectionConfig, Outcome, Values, WorkloadMeta, inject_pod};
use crate::model::proxy_config::WorkloadProxyConfig;
use crate::model::{ConfigStore, Update, parse_file};

const VALUES: &str = "global:\n  hub: docker.io/istio\n  tag: 1.24.0\n";

fn proxy(pod: &Value) -> &Value {
    pod["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "istio-proxy"))
        .or_else(|| {
            pod["spec"]["initContainers"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["name"] == "istio-proxy"))
        })
        .expect("an istio-proxy container")
}

fn env<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?
        .get("value")?
        .as_str()
}

fn inject(objects: &str, annotations: Value) -> Value {
    let store = ConfigStore::new();
    let parsed = parse_file("pc.yaml", objects).unwrap();
    store.apply(
        parsed
            .objects
            .into_iter()
            .map(|o| Update::Upsert(Arc::new(o))),
    );
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sleep", "namespace": "demo", "labels": {"app": "sleep"},
                     "annotations": annotations},
        "spec": {"containers": [{"name": "sleep", "image": "curl"}]}
    });
    let labels = [("app".to_string(), "sleep".to_string())].into();
    let mut workload = WorkloadMeta::from_pod(&pod);
    workload.proxy_config = WorkloadProxyConfig::lookup(&store.snapshot(), "demo", &labels);
    let cfg = InjectionConfig::new(Values::from_yaml(VALUES).unwrap());
    match inject_pod(&pod, &workload, &cfg).unwrap() {
        Outcome::Injected(pod) => pod,
        other => panic!("not injected: {other:?}"),
    }
}

const OBJECTS: &str = "\
apiVersion: networking.istio.io/v1beta1
kind: ProxyConfig
metadata: {name: mesh, namespace: istio-system}
spec: {environmentVariables: {FROM_ROOT: 'yes'}}
---
apiVersion: networking.istio.io/v1beta1
kind: ProxyConfig
metadata: {name: sleep, namespace: demo}
spec:
  selector: {matchLabels: {app: sleep}}
  concurrency: 1
  image: {imageType: distroless}
";

#[test]
fn the_workloads_proxy_config_reaches_the_proxy() {
    let pod = inject(
        OBJECTS,
        json!({"proxy.istio.io/config": "concurrency: 4\nholdApplicationUntilProxyStarts: false\n"}),
    );
    let c = proxy(&pod);
    let pc: Value = serde_json::from_str(env(c, "PROXY_CONFIG").unwrap()).unwrap();
    // The workload's object is over the annotation; the annotation's other
    // fields stay.
    assert_eq!(pc["concurrency"], 1, "{pc}");
    assert_eq!(pc["proxyMetadata"]["FROM_ROOT"], "yes", "{pc}");
    assert_eq!(env(c, "FROM_ROOT"), Some("yes"));
    assert_eq!(c["image"], "docker.io/istio/proxyv2:1.24.0-distroless");
}

#[test]
fn without_objects_the_annotation_applies() {
    let pod = inject(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n",
        json!({"proxy.istio.io/config": "concurrency: 4\n"}),
    );
    let c = proxy(&pod);
    let pc: Value = serde_json::from_str(env(c, "PROXY_CONFIG").unwrap()).unwrap();
    assert_eq!(pc["concurrency"], 4, "{pc}");
    assert_eq!(c["image"], "docker.io/istio/proxyv2:1.24.0");
}

#[test]
fn an_annotation_setting_fields_that_are_not_built_is_refused_naming_the_field() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sleep", "namespace": "demo", "labels": {"app": "sleep"},
                     "annotations": {"proxy.istio.io/config": "proxyHeaders: {server: {disabled: true}}\n"}},
        "spec": {"containers": [{"name": "sleep", "image": "curl"}]}
    });
    let workload = WorkloadMeta::from_pod(&pod);
    let cfg = InjectionConfig::new(Values::from_yaml(VALUES).unwrap());
    let err = inject_pod(&pod, &workload, &cfg).unwrap_err().to_string();
    assert!(
        err.contains("proxy.istio.io/config") && err.contains("proxyHeaders is not supported"),
        "{err}"
    );
}
