//! Istio's built-in `gateway` injection template (the istio-discovery chart's
//! `files/gateway-injection-template.yaml`), written as Rust.
//!
//! A gateway pod's `istio-proxy` is the gateway itself (`pilot-agent proxy router`): no
//! traffic capture, no init container, no probe rewriting of its own, and the pod may bind
//! ports below 1024 without privileges (`net.ipv4.ip_unprivileged_port_start=0`) unless the
//! chart's `gateways.securityContext` says otherwise.

use serde_json::{Map, Value, json};

use super::template::{
    Flavour, Rendered, TemplateInput, agent_args, canonical_labels, image, istiod_ca_volume,
    podinfo_and_token_volumes, proxy_env, readiness_probe, revision_annotations,
};

/// Renders the template.
pub(crate) fn render(t: &TemplateInput<'_>) -> Rendered {
    let v = t.values;
    let mut out = Rendered {
        labels: canonical_labels(t),
        annotations: revision_annotations(t),
        ..Rendered::default()
    };
    out.pod_security_context = Some(
        v.get("gateways.securityContext")
            .filter(|sc| sc.as_object().is_some_and(|m| !m.is_empty()))
            .cloned()
            .unwrap_or_else(|| {
                json!({"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]})
            }),
    );

    let mut c = Map::new();
    c.insert("name".into(), json!(super::PROXY_CONTAINER));
    c.insert("image".into(), json!(image(t, "global.proxy.image")));
    c.insert(
        "ports".into(),
        json!([{"containerPort": 15090, "protocol": "TCP", "name": "http-envoy-prom"}]),
    );
    c.insert("args".into(), json!(agent_args(t, "router")));
    if let Some(l) = v
        .get("global.proxy.lifecycle")
        .filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
    {
        c.insert("lifecycle".into(), l.clone());
    }
    c.insert(
        "securityContext".into(),
        json!({"runAsUser": t.proxy_uid(), "runAsGroup": t.proxy_gid()}),
    );
    c.insert(
        "env".into(),
        Value::Array(proxy_env(t, Flavour::Gateway, &t.app_container_names())),
    );
    let pull = v.string("global.imagePullPolicy");
    if !pull.is_empty() {
        c.insert("imagePullPolicy".into(), json!(pull));
    }
    c.insert("readinessProbe".into(), readiness_probe(t, 15021, 15, 4));
    c.insert("volumeMounts".into(), Value::Array(volume_mounts(t)));
    out.containers.push(Value::Object(c));
    out.volumes = volumes(t);
    out
}

fn volume_mounts(t: &TemplateInput<'_>) -> Vec<Value> {
    let v = t.values;
    let mut m = vec![
        json!({"name": "workload-socket", "mountPath": "/var/run/secrets/workload-spiffe-uds"}),
        json!({"name": "credential-socket", "mountPath": "/var/run/secrets/credential-uds"}),
    ];
    if v.string("global.caName") == "GkeWorkloadCertificate" {
        m.push(json!({"name": "gke-workload-certificate", "mountPath": "/var/run/secrets/workload-spiffe-credentials", "readOnly": true}));
    } else {
        m.push(json!({"name": "workload-certs", "mountPath": "/var/run/secrets/workload-spiffe-credentials"}));
    }
    if v.string("global.pilotCertProvider") == "istiod" {
        m.push(json!({"mountPath": "/var/run/secrets/istio", "name": "istiod-ca-cert"}));
    }
    m.push(json!({"mountPath": "/var/lib/istio/data", "name": "istio-data"}));
    m.push(json!({"mountPath": "/etc/istio/proxy", "name": "istio-envoy"}));
    m.push(json!({"mountPath": "/var/run/secrets/tokens", "name": "istio-token"}));
    if v.bool("global.mountMtlsCerts") {
        m.push(json!({"mountPath": "/etc/certs/", "name": "istio-certs", "readOnly": true}));
    }
    m.push(json!({"name": "istio-podinfo", "mountPath": "/etc/istio/pod"}));
    m
}

fn volumes(t: &TemplateInput<'_>) -> Vec<Value> {
    let v = t.values;
    let mut out = vec![
        json!({"name": "workload-socket"}),
        json!({"name": "credential-socket", "emptyDir": {}}),
    ];
    if v.string("global.caName") == "GkeWorkloadCertificate" {
        out.push(json!({"name": "gke-workload-certificate", "csi": {"driver": "workloadcertificates.security.cloud.google.com"}}));
    } else {
        out.push(json!({"name": "workload-certs", "emptyDir": {}}));
    }
    out.push(json!({"name": "istio-envoy", "emptyDir": {"medium": "Memory"}}));
    out.push(json!({"name": "istio-data", "emptyDir": {}}));
    out.extend(podinfo_and_token_volumes(v));
    out.extend(istiod_ca_volume(v));
    if v.bool("global.mountMtlsCerts") {
        let secret = if t.service_account.is_empty() {
            "istio.default".to_string()
        } else {
            format!("istio.{}", t.service_account)
        };
        out.push(
            json!({"name": "istio-certs", "secret": {"optional": true, "secretName": secret}}),
        );
    }
    out
}
