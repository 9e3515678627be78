//! Istio's built-in proxyless gRPC injection templates (the istio-discovery chart's
//! `files/grpc-simple.yaml` and `files/grpc-agent.yaml`), written as Rust.
//!
//! - `grpc-simple`: an init container writes a gRPC xDS bootstrap pointing at istiod's
//!   plaintext port; each app container reads it (`GRPC_XDS_BOOTSTRAP`). No agent.
//! - `grpc-agent`: the agent runs without Envoy (`DISABLE_ENVOY`), writes the bootstrap and the
//!   workload certificates for the app's gRPC library, and proxies xDS.
//!
//! Both turn off probe rewriting (`sidecar.istio.io/rewriteAppHTTPProbers: "false"`): no
//! Envoy listens on the agent's behalf.

use serde_json::{Map, Value, json};

use super::template::{
    Flavour, Rendered, TemplateInput, agent_args, canonical_labels, env, env_field, image,
    istiod_ca_volume, podinfo_and_token_volumes, proxy_env, readiness_probe, resources,
    revision_annotations,
};

/// Where `grpc-simple`'s bootstrap is written.
const SIMPLE_BOOTSTRAP_DIR: &str = "/var/lib/grpc/data/";

/// `grpc-simple`'s init container script: a bootstrap with istiod's plaintext xDS port and
/// the proxy's node ID.
const SIMPLE_BOOTSTRAP_SCRIPT: &str = r#"NODE_ID="sidecar~${INSTANCE_IP}~${POD_NAME}.${POD_NAMESPACE}~cluster.local"
SERVER_URI="dns:///istiod.${ISTIO_NAMESPACE}.svc:15010"
echo '
{
  "xds_servers": [
    {
      "server_uri": "'${SERVER_URI}'",
      "channel_creds": [{"type": "insecure"}],
      "server_features" : ["xds_v3"]
    }
  ],
  "node": {
    "id": "'${NODE_ID}'",
    "metadata": {
      "GENERATOR": "grpc"
    }
  }
}' > /var/lib/grpc/data/bootstrap.json"#;

fn no_probe_rewrite() -> (String, String) {
    (
        super::ann::REWRITE_APP_PROBERS.to_string(),
        "false".to_string(),
    )
}

/// Renders `grpc-simple`.
pub(crate) fn render_simple(t: &TemplateInput<'_>) -> Rendered {
    let mut out = Rendered {
        annotations: vec![no_probe_rewrite()],
        ..Rendered::default()
    };
    let mount = json!([{"name": "grpc-io-proxyless-bootstrap", "mountPath": SIMPLE_BOOTSTRAP_DIR}]);
    out.init_containers.push(json!({
        "name": "grpc-bootstrap-init",
        "image": "busybox:1.28",
        "volumeMounts": mount,
        "env": [
            env_field("INSTANCE_IP", "status.podIP"),
            env_field("POD_NAME", "metadata.name"),
            env_field("POD_NAMESPACE", "metadata.namespace"),
            env("ISTIO_NAMESPACE", format!("{}\n", t.values.string("global.istioNamespace"))),
        ],
        "command": ["sh", "-c", SIMPLE_BOOTSTRAP_SCRIPT],
    }));
    for name in t.app_container_names() {
        out.containers.push(json!({
            "name": name,
            "env": [
                env("GRPC_XDS_BOOTSTRAP", format!("{SIMPLE_BOOTSTRAP_DIR}bootstrap.json")),
                env("GRPC_GO_LOG_VERBOSITY_LEVEL", "99"),
                env("GRPC_GO_LOG_SEVERITY_LEVEL", "info"),
            ],
            "volumeMounts": mount,
        }));
    }
    out.volumes
        .push(json!({"name": "grpc-io-proxyless-bootstrap", "emptyDir": {}}));
    out
}

/// Renders `grpc-agent`.
pub(crate) fn render_agent(t: &TemplateInput<'_>) -> Rendered {
    let v = t.values;
    let mut annotations = revision_annotations(t);
    annotations.push(no_probe_rewrite());
    let mut out = Rendered {
        labels: canonical_labels(t),
        annotations,
        ..Rendered::default()
    };
    let apps = t.app_container_names();

    let mut c = Map::new();
    c.insert("name".into(), json!(super::PROXY_CONTAINER));
    c.insert("image".into(), json!(image(t, "global.proxy.image")));
    c.insert(
        "ports".into(),
        json!([{"containerPort": 15020, "protocol": "TCP", "name": "mesh-metrics"}]),
    );
    c.insert("args".into(), json!(agent_args(t, "sidecar")));
    c.insert(
        "lifecycle".into(),
        json!({"postStart": {"exec": {"command": [
            "pilot-agent", "wait", "--url=http://localhost:15020/healthz/ready"
        ]}}}),
    );
    c.insert(
        "env".into(),
        Value::Array(proxy_env(t, Flavour::GrpcAgent, &apps)),
    );
    let pull = v.string("global.imagePullPolicy");
    if !pull.is_empty() {
        c.insert("imagePullPolicy".into(), json!(pull));
    }
    c.insert("readinessProbe".into(), readiness_probe(t, 15020, 15, 4));
    c.insert("resources".into(), resources(t));
    let mut mounts = vec![
        json!({"name": "workload-socket", "mountPath": "/var/run/secrets/workload-spiffe-uds"}),
        json!({"name": "workload-certs", "mountPath": "/var/run/secrets/workload-spiffe-credentials"}),
    ];
    if v.string("global.pilotCertProvider") == "istiod" {
        mounts.push(json!({"mountPath": "/var/run/secrets/istio", "name": "istiod-ca-cert"}));
    }
    mounts.extend([
        json!({"mountPath": "/var/lib/istio/data", "name": "istio-data"}),
        json!({"mountPath": "/etc/istio/proxy", "name": "istio-xds"}),
        json!({"mountPath": "/var/run/secrets/tokens", "name": "istio-token"}),
    ]);
    if v.bool("global.mountMtlsCerts") {
        mounts.push(json!({"mountPath": "/etc/certs/", "name": "istio-certs", "readOnly": true}));
    }
    mounts.push(json!({"name": "istio-podinfo", "mountPath": "/etc/istio/pod"}));
    c.insert("volumeMounts".into(), Value::Array(mounts));
    out.containers.push(Value::Object(c));

    for name in apps {
        out.containers.push(json!({
            "name": name,
            "env": [
                env("GRPC_XDS_EXPERIMENTAL_SECURITY_SUPPORT", "true"),
                env("GRPC_XDS_BOOTSTRAP", "/etc/istio/proxy/grpc-bootstrap.json"),
            ],
            "volumeMounts": [
                {"mountPath": "/var/lib/istio/data", "name": "istio-data"},
                {"mountPath": "/etc/istio/proxy", "name": "istio-xds"},
                {"mountPath": "/var/run/secrets/workload-spiffe-credentials", "name": "workload-certs"},
            ],
        }));
    }

    out.volumes = vec![
        json!({"name": "workload-socket"}),
        json!({"name": "workload-certs"}),
        json!({"name": "istio-xds", "emptyDir": {"medium": "Memory"}}),
        json!({"name": "istio-data", "emptyDir": {}}),
    ];
    out.volumes.extend(podinfo_and_token_volumes(v));
    out.volumes.extend(istiod_ca_volume(v));
    out
}
