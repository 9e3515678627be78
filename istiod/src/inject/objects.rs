//! `istioctl kube-inject`'s side of injection: objects as `kubectl apply` takes them (a
//! Pod, a workload with a pod template, a CronJob's job template, a List of them), each pod
//! template injected with [`super::inject_pod_in_namespace`].

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{
    InjectError, InjectionConfig, Outcome, WorkloadMeta, inject_pod_in_namespace, policy,
    string_map,
};

/// Injects into any object `kubectl apply` would take, as `istioctl kube-inject` does: a Pod,
/// the pod template of a Deployment, StatefulSet, DaemonSet, ReplicaSet, Job,
/// ReplicationController or DeploymentConfig, the job template's pod template of a CronJob,
/// each item of a List. Other kinds, and pods that are skipped, come back unchanged.
pub fn inject_object(obj: &Value, cfg: &InjectionConfig) -> Result<Value, InjectError> {
    inject_object_in_namespace(obj, &BTreeMap::new(), cfg)
}

/// [`inject_object`] for an object of a namespace with these annotations (see
/// [`inject_pod_in_namespace`]).
pub fn inject_object_in_namespace(
    obj: &Value,
    namespace_annotations: &BTreeMap<String, String>,
    cfg: &InjectionConfig,
) -> Result<Value, InjectError> {
    let ns = namespace_annotations;
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let mut out = obj.clone();
    if kind == "List" {
        if let Some(Value::Array(items)) = out.get_mut("items") {
            for item in items.iter_mut() {
                *item = inject_object_in_namespace(item, ns, cfg)?;
            }
        }
        return Ok(out);
    }
    if kind == "CronJob" {
        return inject_cron_job(out, ns, cfg);
    }
    let template_path = match kind {
        "Pod" => "",
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "Job"
        | "ReplicationController"
        | "DeploymentConfig" => "/spec/template",
        "CronJob" => "/spec/jobTemplate/spec/template",
        _ => return Ok(out),
    };
    let s = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let workload = if kind == "Pod" {
        WorkloadMeta::from_pod(obj)
    } else {
        WorkloadMeta {
            name: s("/metadata/name"),
            namespace: s("/metadata/namespace"),
            api_version: s("/apiVersion"),
            kind: kind.to_string(),
            proxy_config: Default::default(),
        }
    };
    let Some(template) = out.pointer_mut(template_path) else {
        return Err(InjectError::NoPodTemplate {
            kind: kind.into(),
            path: "spec.template",
        });
    };
    if kube_inject_required(template, &workload)
        && let Outcome::Injected(pod) = inject_pod_in_namespace(template, &workload, ns, cfg)?
    {
        *template = pod;
    }
    Ok(out)
}

/// `kube-inject` honours the pod's own opt-out with the `enabled` policy.
fn kube_inject_required(template: &Value, workload: &WorkloadMeta) -> bool {
    let labels = string_map(template.pointer("/metadata/labels"));
    let annotations = string_map(template.pointer("/metadata/annotations"));
    let facts = policy::PodFacts {
        namespace: &workload.namespace,
        labels: &labels,
        annotations: &annotations,
        host_network: false,
    };
    policy::inject_required(&facts, policy::Policy::Enabled, &[], &[]) == policy::Decision::Inject
}

/// A CronJob as `kube-inject` treats it: the metadata read and written is the job template's
/// (`spec.jobTemplate.metadata`), the spec the pod template's. Istio's goldens record this.
fn inject_cron_job(
    mut out: Value,
    ns: &BTreeMap<String, String>,
    cfg: &InjectionConfig,
) -> Result<Value, InjectError> {
    let s = |p: &str| {
        out.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let workload = WorkloadMeta {
        name: s("/metadata/name"),
        namespace: s("/metadata/namespace"),
        api_version: s("/apiVersion"),
        kind: "CronJob".into(),
        proxy_config: Default::default(),
    };
    let Some(job) = out.pointer_mut("/spec/jobTemplate") else {
        return Err(InjectError::NoPodTemplate {
            kind: "CronJob".into(),
            path: "spec.jobTemplate",
        });
    };
    let pod = json!({
        "metadata": job.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "spec": job.pointer("/spec/template/spec").cloned().unwrap_or_else(|| json!({})),
    });
    if !kube_inject_required(&pod, &workload) {
        return Ok(out);
    }
    if let Outcome::Injected(pod) = inject_pod_in_namespace(&pod, &workload, ns, cfg)?
        && let (Some(meta), Some(spec)) = (pod.get("metadata"), pod.get("spec"))
        && let Some(job) = out.pointer_mut("/spec/jobTemplate")
    {
        job["metadata"] = meta.clone();
        if let Some(template) = job.pointer_mut("/spec/template") {
            template["spec"] = spec.clone();
        }
    }
    Ok(out)
}

/// Parses a multi-document YAML stream into its (non-empty) documents.
pub fn parse_yaml_documents(text: &str) -> Result<Vec<Value>, InjectError> {
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v: Value = serde::Deserialize::deserialize(doc).map_err(|e| InjectError::Parse {
            what: "YAML document".into(),
            reason: e.to_string(),
        })?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}
