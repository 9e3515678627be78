//! Istio's default `sidecar` injection template, written as Rust.
//!
//! Each piece mirrors a block of the istio-discovery chart's `files/injection-template.yaml`
//! (the `istio-init` / `istio-validation` init container, the `istio-proxy` container as a
//! native sidecar or a regular container, the volumes, labels and annotations), driven by the
//! same inputs: Helm values, mesh config's `defaultConfig`, and the pod's annotations.
//! The logic reads better as code than as a template engine port; what the built-in
//! templates share is in [`super::template`].

use common::{InterceptionMode, TlsMode};
use serde_json::{Map, Value, json};

use super::ann;
use super::template::{
    Flavour, Rendered, TemplateInput, agent_args, canonical_labels, image, istiod_ca_volume,
    label_or, number, podinfo_and_token_volumes, proxy_env, resources, revision_annotations,
    scalar_string, seccomp,
};

/// Renders the template.
pub(crate) fn render(t: &TemplateInput<'_>) -> Rendered {
    let mut out = Rendered::default();
    // The mode stays the annotation's text: Istio's template passes it on
    // verbatim (to the init container's `-m` and the agent's environment).
    let mode = t.interception_mode();
    let tproxy = mode == InterceptionMode::Tproxy.as_str();
    let cni = t.values.bool("pilot.cni.enabled");
    let containers = t.app_container_names();

    // metadata.labels
    let tls_mode = label_or(t.labels, TlsMode::LABEL, TlsMode::Istio.as_str());
    out.labels.push((TlsMode::LABEL.into(), tls_mode));
    let md = t.proxy_metadata();
    if md
        .iter()
        .any(|(k, v)| k == "ISTIO_META_ENABLE_HBONE" && v == "true")
    {
        let tunnel = label_or(t.labels, "networking.istio.io/tunnel", "http");
        out.labels
            .push(("networking.istio.io/tunnel".into(), tunnel));
    }
    out.labels.extend(canonical_labels(t));

    // metadata.annotations
    out.annotations = revision_annotations(t);
    if cni {
        cni_annotations(t, &mode, &mut out.annotations);
    }

    // spec.initContainers
    let no_capture = mode == InterceptionMode::None.as_str();
    let no_init = no_capture && !t.native_sidecar;
    if !no_init && !no_capture {
        out.init_containers
            .push(init_container(t, &mode, tproxy, cni, &md));
    }
    let proxy = proxy_container(t, tproxy, &containers, &md);
    if t.native_sidecar {
        out.init_containers.push(proxy);
    } else {
        out.containers.push(proxy);
    }
    out.volumes = volumes(t);
    if let Some(secrets) = t
        .values
        .get("global.imagePullSecrets")
        .and_then(Value::as_array)
    {
        out.image_pull_secrets = secrets
            .iter()
            .map(|s| json!({"name": scalar_string(s)}))
            .collect();
    }
    out
}

fn cni_annotations(t: &TemplateInput<'_>, mode: &str, out: &mut Vec<(String, String)>) {
    let v = t.values;
    if v.string("pilot.cni.provider") == "multus" {
        let existing = t
            .annotations
            .get("k8s.v1.cni.cncf.io/networks")
            .cloned()
            .unwrap_or_default();
        out.push((
            "k8s.v1.cni.cncf.io/networks".into(),
            append_multus_network(&existing, "default/istio-cni"),
        ));
    }
    out.push((ann::INTERCEPTION_MODE.into(), mode.into()));
    for (key, value) in [
        (
            ann::INCLUDE_OUTBOUND_IP_RANGES,
            "global.proxy.includeIPRanges",
        ),
        (
            ann::EXCLUDE_OUTBOUND_IP_RANGES,
            "global.proxy.excludeIPRanges",
        ),
    ] {
        let s = t.annotation(key, v.string(value));
        if !s.is_empty() {
            out.push((key.into(), s));
        }
    }
    out.push((
        ann::INCLUDE_INBOUND_PORTS.into(),
        t.annotation(
            ann::INCLUDE_INBOUND_PORTS,
            v.string("global.proxy.includeInboundPorts"),
        ),
    ));
    out.push((ann::EXCLUDE_INBOUND_PORTS.into(), excluded_inbound(t)));
    if t.annotations.contains_key(ann::INCLUDE_OUTBOUND_PORTS)
        || !v.string("global.proxy.includeOutboundPorts").is_empty()
    {
        out.push((
            ann::INCLUDE_OUTBOUND_PORTS.into(),
            t.annotation(
                ann::INCLUDE_OUTBOUND_PORTS,
                v.string("global.proxy.includeOutboundPorts"),
            ),
        ));
    }
    if t.annotations.contains_key(ann::EXCLUDE_OUTBOUND_PORTS)
        || !v.string("global.proxy.excludeOutboundPorts").is_empty()
    {
        out.push((
            ann::EXCLUDE_OUTBOUND_PORTS.into(),
            t.annotation(
                ann::EXCLUDE_OUTBOUND_PORTS,
                v.string("global.proxy.excludeOutboundPorts"),
            ),
        ));
    }
    for key in [
        ann::KUBEVIRT_INTERFACES,
        ann::REROUTE_VIRTUAL_INTERFACES,
        ann::EXCLUDE_INTERFACES,
    ] {
        if let Some(s) = t.annotations.get(key).filter(|s| !s.is_empty()) {
            out.push((key.into(), s.clone()));
        }
    }
}

/// Istio's `appendMultusNetwork`: adds `network` (`namespace/name` or `name`) to a
/// `k8s.v1.cni.cncf.io/networks` value given as a comma list or as a JSON list of objects,
/// unless `istio-cni` is already there. A JSON list is extended as text, so the user's own
/// spelling (spaces, line breaks) is kept, as Istio does.
pub(crate) fn append_multus_network(existing: &str, network: &str) -> String {
    let trimmed = existing.trim();
    if trimmed.is_empty() {
        return network.to_string();
    }
    let name = network.rsplit('/').next().unwrap_or(network);
    if trimmed.starts_with('[') && trimmed.ends_with(']') {
        if names_istio_cni(trimmed, name) {
            return existing.to_string();
        }
        let item = match network.split_once('/') {
            Some((ns, name)) => format!("{{\"name\": \"{name}\", \"namespace\": \"{ns}\"}}"),
            None => format!("{{\"name\": \"{name}\"}}"),
        };
        return format!("{}, {item}]", &trimmed[..trimmed.len() - 1]);
    }
    let present = trimmed.split(',').any(|n| {
        let n = n.trim();
        n == network || n == name
    });
    if present {
        existing.to_string()
    } else {
        format!("{existing}, {network}")
    }
}

/// Whether a JSON network list (possibly not strictly JSON, e.g. with a trailing comma)
/// has an item `"name": "<name>"`.
fn names_istio_cni(list: &str, name: &str) -> bool {
    let quoted = format!("\"{name}\"");
    list.match_indices(&quoted).any(|(i, _)| {
        let before = list[..i].trim_end();
        before
            .strip_suffix(':')
            .is_some_and(|b| b.trim_end().ends_with("\"name\""))
    })
}

/// Istio's `excludeInboundPort`: the excluded inbound ports plus the status port.
fn excluded_inbound(t: &TemplateInput<'_>) -> String {
    let status = t.status_port().trim().to_string();
    let excluded = t.annotation(
        ann::EXCLUDE_INBOUND_PORTS,
        t.values.string("global.proxy.excludeInboundPorts"),
    );
    if status.is_empty() || status == "0" {
        return excluded;
    }
    let mut out = Vec::new();
    for port in excluded.split(',') {
        if port == status {
            return excluded;
        }
        let port = port.trim();
        if !port.is_empty() {
            out.push(port.to_string());
        }
    }
    out.push(status);
    out.join(",")
}

fn init_container(
    t: &TemplateInput<'_>,
    mode: &str,
    tproxy: bool,
    cni: bool,
    md: &[(String, String)],
) -> Value {
    let v = t.values;
    let a = t.annotations;
    let uid = if tproxy && !t.uid_from_user {
        1337
    } else {
        t.proxy_uid()
    };
    let mut args: Vec<String> = vec!["istio-iptables".into()];
    let mut push = |k: &str, val: String| {
        args.push(k.into());
        args.push(val);
    };
    push("-p", t.mesh.proxy_listen_port.to_string());
    push("-z", t.mesh.proxy_inbound_listen_port.to_string());
    push("-u", uid.to_string());
    push("-m", mode.to_string());
    push(
        "-i",
        t.annotation(
            ann::INCLUDE_OUTBOUND_IP_RANGES,
            v.string("global.proxy.includeIPRanges"),
        ),
    );
    push(
        "-x",
        t.annotation(
            ann::EXCLUDE_OUTBOUND_IP_RANGES,
            v.string("global.proxy.excludeIPRanges"),
        ),
    );
    push(
        "-b",
        t.annotation(
            ann::INCLUDE_INBOUND_PORTS,
            v.string("global.proxy.includeInboundPorts"),
        ),
    );
    let excluded = excluded_inbound(t);
    push(
        "-d",
        if excluded.is_empty() {
            "15090,15021".into()
        } else {
            format!("15090,15021,{excluded}")
        },
    );
    if a.contains_key(ann::INCLUDE_OUTBOUND_PORTS)
        || !v.string("global.proxy.includeOutboundPorts").is_empty()
    {
        push(
            "-q",
            t.annotation(
                ann::INCLUDE_OUTBOUND_PORTS,
                v.string("global.proxy.includeOutboundPorts"),
            ),
        );
    }
    if a.contains_key(ann::EXCLUDE_OUTBOUND_PORTS)
        || !v.string("global.proxy.excludeOutboundPorts").is_empty()
    {
        push(
            "-o",
            t.annotation(
                ann::EXCLUDE_OUTBOUND_PORTS,
                v.string("global.proxy.excludeOutboundPorts"),
            ),
        );
    }
    if let Some(k) = a
        .get(ann::REROUTE_VIRTUAL_INTERFACES)
        .or_else(|| a.get(ann::KUBEVIRT_INTERFACES))
    {
        push("-k", k.clone());
    }
    if let Some(c) = a.get(ann::EXCLUDE_INTERFACES) {
        push("-c", c.clone());
    }
    args.push(format!(
        "--log_output_level={}",
        t.annotation(ann::AGENT_LOG_LEVEL, v.string("global.logging.level"))
    ));
    if v.bool("global.logAsJson") {
        args.push("--log_as_json".into());
    }
    if cni {
        args.push("--run-validation".into());
        args.push("--skip-rule-apply".into());
    } else if v.bool("global.proxy_init.forceApplyIptables") {
        args.push("--force-apply".into());
    }
    if v.bool("global.nativeNftables") {
        args.push("--native-nftables".into());
    }

    let mut c = Map::new();
    c.insert(
        "name".into(),
        json!(if cni {
            "istio-validation"
        } else {
            "istio-init"
        }),
    );
    c.insert("image".into(), json!(image(t, "global.proxy_init.image")));
    c.insert("args".into(), json!(args));
    let pull = v.string("global.imagePullPolicy");
    if !pull.is_empty() {
        c.insert("imagePullPolicy".into(), json!(pull));
    }
    if !md.is_empty() {
        c.insert(
            "env".into(),
            Value::Array(
                md.iter()
                    .map(|(k, v)| json!({"name": k, "value": v}))
                    .collect(),
            ),
        );
    }
    c.insert("resources".into(), resources(t));
    let privileged = v.bool("global.proxy.privileged");
    let mut sc = Map::new();
    sc.insert("allowPrivilegeEscalation".into(), json!(privileged));
    sc.insert("privileged".into(), json!(privileged));
    if cni {
        sc.insert("capabilities".into(), json!({"drop": ["ALL"]}));
        let (uid, gid) = if tproxy {
            (1337, 1337)
        } else {
            (t.proxy_uid(), t.proxy_gid())
        };
        sc.insert("readOnlyRootFilesystem".into(), json!(true));
        sc.insert("runAsGroup".into(), json!(gid));
        sc.insert("runAsUser".into(), json!(uid));
        sc.insert("runAsNonRoot".into(), json!(true));
    } else {
        sc.insert(
            "capabilities".into(),
            json!({"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]}),
        );
        sc.insert("readOnlyRootFilesystem".into(), json!(false));
        sc.insert("runAsGroup".into(), json!(0));
        sc.insert("runAsNonRoot".into(), json!(false));
        sc.insert("runAsUser".into(), json!(0));
    }
    seccomp(v, &mut sc);
    c.insert("securityContext".into(), Value::Object(sc));
    Value::Object(c)
}

fn proxy_container(
    t: &TemplateInput<'_>,
    tproxy: bool,
    app_containers: &[String],
    md: &[(String, String)],
) -> Value {
    let v = t.values;
    let status_port = t.status_port();
    let cap_net_bind = t.annotation(
        ann::CAP_NET_BIND_SERVICE,
        v.string("global.proxy.capNetBindService"),
    ) == "true";
    let mut c = Map::new();
    c.insert("name".into(), json!(super::PROXY_CONTAINER));
    c.insert("image".into(), json!(image(t, "global.proxy.image")));
    if t.native_sidecar {
        c.insert("restartPolicy".into(), json!("Always"));
    }
    c.insert(
        "ports".into(),
        json!([{"containerPort": 15090, "protocol": "TCP", "name": "http-envoy-prom"}]),
    );
    let mut args = agent_args(t, "sidecar");
    let outlier = v.string("global.proxy.outlierLogPath");
    if !outlier.is_empty() {
        args.push(format!("--outlierLogPath={outlier}"));
    }
    c.insert("args".into(), json!(args));
    if let Some(l) = v
        .get("global.proxy.lifecycle")
        .filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
    {
        c.insert("lifecycle".into(), l.clone());
    } else if t.hold_application() {
        c.insert(
            "lifecycle".into(),
            json!({"postStart": {"exec": {"command": ["pilot-agent", "wait"]}}}),
        );
    } else if t.native_sidecar {
        c.insert(
            "lifecycle".into(),
            json!({"preStop": {"exec": {"command": [
                "pilot-agent", "request", format!("--debug-port={status_port}"), "POST", "drain"
            ]}}}),
        );
    }

    c.insert(
        "env".into(),
        Value::Array(proxy_env(t, Flavour::Sidecar, app_containers)),
    );
    let pull = v.string("global.imagePullPolicy");
    if !pull.is_empty() {
        c.insert("imagePullPolicy".into(), json!(pull));
    }
    if status_port != "0" {
        if v.bool("global.proxy.startupProbe.enabled") {
            c.insert(
                "startupProbe".into(),
                json!({
                    "httpGet": {"path": "/healthz/ready", "port": 15021},
                    "periodSeconds": 1,
                    "timeoutSeconds": 3,
                    "failureThreshold": number(&v.string("global.proxy.startupProbe.failureThreshold")),
                }),
            );
        }
        let mut probe = Map::new();
        probe.insert(
            "httpGet".into(),
            json!({"path": "/healthz/ready", "port": 15021}),
        );
        for (key, ann_key, value) in [
            (
                "initialDelaySeconds",
                ann::READINESS_INITIAL_DELAY,
                "global.proxy.readinessInitialDelaySeconds",
            ),
            (
                "periodSeconds",
                ann::READINESS_PERIOD,
                "global.proxy.readinessPeriodSeconds",
            ),
            (
                "failureThreshold",
                ann::READINESS_FAILURE_THRESHOLD,
                "global.proxy.readinessFailureThreshold",
            ),
        ] {
            let n = number(&t.annotation(ann_key, v.string(value)));
            // Go's omitempty drops a zero.
            if n != json!(0) {
                probe.insert(key.into(), n);
            }
        }
        probe.insert("timeoutSeconds".into(), json!(3));
        c.insert("readinessProbe".into(), Value::Object(probe));
    }
    let privileged = v.bool("global.proxy.privileged");
    let iptables_trace = md
        .iter()
        .any(|(k, v)| k == "IPTABLES_TRACE_LOGGING" && v == "true");
    let mut sc = Map::new();
    if iptables_trace {
        sc.insert("allowPrivilegeEscalation".into(), json!(true));
        sc.insert(
            "capabilities".into(),
            json!({"add": ["NET_ADMIN"], "drop": ["ALL"]}),
        );
        sc.insert("privileged".into(), json!(true));
        sc.insert("readOnlyRootFilesystem".into(), json!(true));
        sc.insert("runAsGroup".into(), json!(t.proxy_gid()));
        sc.insert("runAsNonRoot".into(), json!(false));
        sc.insert("runAsUser".into(), json!(0));
    } else {
        sc.insert("allowPrivilegeEscalation".into(), json!(privileged));
        let mut caps = Map::new();
        let mut add = Vec::new();
        if tproxy {
            add.push("NET_ADMIN");
        }
        if cap_net_bind {
            add.push("NET_BIND_SERVICE");
        }
        if !add.is_empty() {
            caps.insert("add".into(), json!(add));
        }
        caps.insert("drop".into(), json!(["ALL"]));
        sc.insert("capabilities".into(), Value::Object(caps));
        sc.insert("privileged".into(), json!(privileged));
        sc.insert("readOnlyRootFilesystem".into(), json!(true));
        if tproxy || cap_net_bind {
            sc.insert("runAsNonRoot".into(), json!(false));
            sc.insert("runAsUser".into(), json!(0));
            sc.insert("runAsGroup".into(), json!(1337));
        } else {
            sc.insert("runAsNonRoot".into(), json!(true));
            sc.insert("runAsUser".into(), json!(t.proxy_uid()));
            sc.insert("runAsGroup".into(), json!(t.proxy_gid()));
        }
    }
    seccomp(v, &mut sc);
    c.insert("securityContext".into(), Value::Object(sc));
    c.insert("resources".into(), resources(t));
    c.insert("volumeMounts".into(), volume_mounts(t));
    Value::Object(c)
}

fn volume_mounts(t: &TemplateInput<'_>) -> Value {
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
        m.push(json!({"mountPath": "/var/run/secrets/istio/crl", "name": "istio-ca-crl"}));
    }
    m.push(json!({"mountPath": "/var/lib/istio/data", "name": "istio-data"}));
    if t.annotations.contains_key(ann::BOOTSTRAP_OVERRIDE) {
        m.push(
            json!({"mountPath": "/etc/istio/custom-bootstrap", "name": "custom-bootstrap-volume"}),
        );
    }
    m.push(json!({"mountPath": "/etc/istio/proxy", "name": "istio-envoy"}));
    m.push(json!({"mountPath": "/var/run/secrets/tokens", "name": "istio-token"}));
    if v.bool("global.mountMtlsCerts") {
        m.push(json!({"mountPath": "/etc/certs/", "name": "istio-certs", "readOnly": true}));
    }
    m.push(json!({"name": "istio-podinfo", "mountPath": "/etc/istio/pod"}));
    if let Some(Ok(Value::Object(user))) = t
        .annotations
        .get(ann::USER_VOLUME_MOUNT)
        .map(|s| serde_json::from_str::<Value>(s))
    {
        for (name, spec) in user {
            let mut e = spec.as_object().cloned().unwrap_or_default();
            e.insert("name".into(), json!(name));
            m.push(Value::Object(e));
        }
    }
    Value::Array(m)
}

fn volumes(t: &TemplateInput<'_>) -> Vec<Value> {
    let v = t.values;
    let mut out = vec![
        json!({"name": "workload-socket"}),
        json!({"name": "credential-socket"}),
    ];
    if v.string("global.caName") == "GkeWorkloadCertificate" {
        out.push(json!({"name": "gke-workload-certificate", "csi": {"driver": "workloadcertificates.security.cloud.google.com"}}));
    } else {
        out.push(json!({"name": "workload-certs"}));
    }
    if let Some(cm) = t.annotations.get(ann::BOOTSTRAP_OVERRIDE) {
        out.push(json!({"name": "custom-bootstrap-volume", "configMap": {"name": cm}}));
    }
    out.push(json!({"name": "istio-envoy", "emptyDir": {"medium": "Memory"}}));
    out.push(json!({"name": "istio-data", "emptyDir": {}}));
    out.extend(podinfo_and_token_volumes(v));
    out.extend(istiod_ca_volume(v));
    let crl = match v.string("pilot.crlConfigMapName") {
        s if s.is_empty() => "istio-ca-crl".to_string(),
        s => s,
    };
    out.push(json!({"name": "istio-ca-crl", "configMap": {"name": crl, "optional": true}}));
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
    if let Some(Ok(Value::Object(user))) = t
        .annotations
        .get(ann::USER_VOLUME)
        .map(|s| serde_json::from_str::<Value>(s))
    {
        for (name, spec) in user {
            let mut e = spec.as_object().cloned().unwrap_or_default();
            e.insert("name".into(), json!(name));
            out.push(Value::Object(e));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::append_multus_network;

    /// Istio's `TestAppendMultusNetwork` table, applied twice (idempotence).
    #[test]
    fn appends_istio_cni_once_keeping_the_user_spelling() {
        let multiline =
            "[\n  {\"name\": \"macvlan-conf-1\"},\n  {\"name\": \"macvlan-conf-2\"}\n  ]";
        let preconfigured = "[\n  {\"name\": \"macvlan-conf-1\"},\n  {\"name\": \"istio-cni\", \"config\": \"x\"},\n  ]";
        for (input, want) in [
            ("", "istio-cni"),
            ("macvlan-conf-1", "macvlan-conf-1, istio-cni"),
            (
                "macvlan-conf-1, macvlan-conf-2",
                "macvlan-conf-1, macvlan-conf-2, istio-cni",
            ),
            (
                r#"[{"name": "macvlan-conf-1"}]"#,
                r#"[{"name": "macvlan-conf-1"}, {"name": "istio-cni"}]"#,
            ),
            (
                multiline,
                "[\n  {\"name\": \"macvlan-conf-1\"},\n  {\"name\": \"macvlan-conf-2\"}\n  , {\"name\": \"istio-cni\"}]",
            ),
            (preconfigured, preconfigured),
        ] {
            let once = append_multus_network(input, "istio-cni");
            assert_eq!(once, want, "{input:?}");
            assert_eq!(
                append_multus_network(&once, "istio-cni"),
                want,
                "{input:?} twice"
            );
        }
        assert_eq!(
            append_multus_network(r#"[{"name": "alt"}]"#, "default/istio-cni"),
            r#"[{"name": "alt"}, {"name": "istio-cni", "namespace": "default"}]"#
        );
    }
}
