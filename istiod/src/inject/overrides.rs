//! `proxy.istio.io/overrides`: the user's own fields for containers a template renders.
//!
//! When the pod already carries a container the template also renders (its own `istio-proxy`,
//! `istio-init`, or an app container a template such as `grpc-agent` adds fields to), Istio's
//! `reapplyOverwrittenContainers` merges the user's container back over the rendered one, so the
//! user's fields win, and records those containers in the `proxy.istio.io/overrides`
//! annotation as `{"containers":[..],"initContainers":[..]}`.
//!
//! The annotation is the JSON Go's `encoding/json` writes for `corev1.Container`: fields in the
//! struct's declaration order, `resources` always present, quantities in canonical form. The
//! field order is a table here ([`GO_FIELD_ORDER`]); serde_json's map sorts keys, so the text is
//! written by [`go_json`] rather than by `serde_json::to_string`.

use serde_json::{Map, Value, json};

use super::{PROXY_CONTAINER, quantity, strategic_merge};

/// The user's containers that override rendered ones, by the list of the rendered pod they
/// override (Istio's `ParsedContainers`).
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    /// Overrides of rendered `containers`.
    pub containers: Vec<Value>,
    /// Overrides of rendered `initContainers`.
    pub init_containers: Vec<Value>,
}

impl Overrides {
    /// Whether nothing was overridden (then the annotation is not written).
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty() && self.init_containers.is_empty()
    }

    /// The annotation's value, as Go writes `ParsedContainers` (`omitempty` on both lists).
    pub fn annotation(&self) -> String {
        let mut parts = Vec::new();
        for (key, list) in [
            ("containers", &self.containers),
            ("initContainers", &self.init_containers),
        ] {
            if !list.is_empty() {
                let items: Vec<String> =
                    list.iter().map(|c| go_json(&as_go_container(c))).collect();
                parts.push(format!("{}:[{}]", json!(key), items.join(",")));
            }
        }
        format!("{{{}}}", parts.join(","))
    }
}

/// The overlay a user's container contributes: the container itself as Go's typed round
/// trip reads it (resource quantities canonical), without an `image: auto` (which only asks
/// for the injected image).
pub(crate) fn overlay(user: &Value) -> Value {
    let mut overlay = user.clone();
    if let Some(o) = overlay.as_object_mut() {
        if o.get("image").and_then(Value::as_str) == Some("auto") {
            o.remove("image");
        }
        if let Some(Value::Object(res)) = o.get_mut("resources") {
            for part in ["limits", "requests"] {
                if let Some(Value::Object(amounts)) = res.get_mut(part) {
                    for q in amounts.values_mut() {
                        let text = super::template::scalar_string(q);
                        *q = json!(quantity::canonical(&text));
                    }
                }
            }
        }
    }
    overlay
}

/// A container as Go writes it: `resources` present (the field has no `omitempty`).
fn as_go_container(c: &Value) -> Value {
    let mut c = c.clone();
    if let Some(o) = c.as_object_mut() {
        o.entry("resources").or_insert_with(|| json!({}));
    }
    c
}

/// Field names of `corev1.Container` and the structs under it, in Go's declaration order.
/// One list serves all of them: no two of these structs order a shared name differently.
/// Keys not listed (map keys such as resource names) follow, sorted, as Go sorts map keys.
const GO_FIELD_ORDER: &[&str] = &[
    // Container
    "name",
    "image",
    "command",
    "args",
    "workingDir",
    "ports",
    "envFrom",
    "env",
    "resources",
    "resizePolicy",
    "restartPolicy",
    "volumeMounts",
    "volumeDevices",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "imagePullPolicy",
    "securityContext",
    "stdin",
    "stdinOnce",
    "tty",
    // ContainerPort
    "hostPort",
    "containerPort",
    "protocol",
    "hostIP",
    // EnvVar, EnvVarSource
    "value",
    "valueFrom",
    "fieldRef",
    "resourceFieldRef",
    "configMapKeyRef",
    "secretKeyRef",
    // ResourceRequirements
    "limits",
    "requests",
    "claims",
    // VolumeMount
    "readOnly",
    "recursiveReadOnly",
    "mountPath",
    "subPath",
    "mountPropagation",
    "subPathExpr",
    // Lifecycle
    "postStart",
    "preStop",
    // ProbeHandler / LifecycleHandler
    "exec",
    "httpGet",
    "tcpSocket",
    "grpc",
    "sleep",
    // HTTPGetAction
    "path",
    "port",
    "host",
    "scheme",
    "httpHeaders",
    // Probe
    "initialDelaySeconds",
    "timeoutSeconds",
    "periodSeconds",
    "successThreshold",
    "failureThreshold",
    "terminationGracePeriodSeconds",
    // SecurityContext
    "capabilities",
    "privileged",
    "seLinuxOptions",
    "windowsOptions",
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "readOnlyRootFilesystem",
    "allowPrivilegeEscalation",
    "procMount",
    "seccompProfile",
    "appArmorProfile",
    // Capabilities
    "add",
    "drop",
];

/// `v` as compact JSON with object keys in Go's field order ([`GO_FIELD_ORDER`]).
pub(crate) fn go_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let fields: Vec<String> = go_ordered(m)
                .into_iter()
                .map(|(k, v)| format!("{}:{}", json!(k), go_json(v)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(go_json).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}

fn go_ordered(m: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut fields: Vec<(&String, &Value)> = m.iter().collect();
    fields.sort_by_key(|(k, _)| {
        (
            GO_FIELD_ORDER
                .iter()
                .position(|f| f == k)
                .unwrap_or(usize::MAX),
            k.to_string(),
        )
    });
    fields
}

/// The container of this name in `spec`'s containers, else in its init containers (Istio's
/// `FindContainerFromPod`).
pub(crate) fn find_container<'a>(spec: &'a Value, name: &str) -> Option<&'a Value> {
    ["containers", "initContainers"].iter().find_map(|list| {
        spec.get(*list)
            .and_then(Value::as_array)?
            .iter()
            .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
    })
}

/// Istio's `reapplyOverwrittenContainers`: each rendered container (`rendered[0]`) and init
/// container (`rendered[1]`) the user's pod also has gets the user's container merged back
/// over it, so the user's fields win; those are the overrides recorded on the pod.
///
/// A user's `runAsUser` for `istio-proxy` is not applied where the platform decides it: with
/// TPROXY interception the proxy runs as root (the override is still recorded, as Istio's
/// goldens show), and on OpenShift the namespace's range decides (the override is dropped).
pub(crate) fn reapply(
    spec: &mut Value,
    original: &Value,
    rendered: [&[String]; 2],
    run_as: ProxyRunAs,
) -> Overrides {
    let mut out = Overrides::default();
    for (i, names) in rendered.into_iter().enumerate() {
        for name in names {
            let Some(user) = find_container(original, name) else {
                continue;
            };
            let mut overlay = overlay(user);
            if run_as.openshift && name == PROXY_CONTAINER {
                drop_run_as_user(&mut overlay);
            }
            let mut applied = overlay.clone();
            if run_as.tproxy && name == PROXY_CONTAINER {
                drop_run_as_user(&mut applied);
            }
            for list in ["initContainers", "containers"] {
                if let Some(Value::Array(items)) = spec.get_mut(list)
                    && let Some(c) = items
                        .iter_mut()
                        .find(|c| c.get("name").and_then(Value::as_str) == Some(name.as_str()))
                {
                    strategic_merge(c, &applied);
                }
            }
            if i == 0 {
                out.containers.push(overlay);
            } else {
                out.init_containers.push(overlay);
            }
        }
    }
    out
}

/// What decides the proxy's user besides the user's own `istio-proxy`.
#[derive(Clone, Copy)]
pub(crate) struct ProxyRunAs {
    /// TPROXY interception.
    pub tproxy: bool,
    /// OpenShift.
    pub openshift: bool,
}

/// Removes `securityContext.runAsUser` (and an emptied `securityContext`) from a container.
fn drop_run_as_user(c: &mut Value) {
    if let Some(c) = c.as_object_mut()
        && let Some(Value::Object(sc)) = c.get_mut("securityContext")
    {
        sc.remove("runAsUser");
        if sc.is_empty() {
            c.remove("securityContext");
        }
    }
}

/// The namespace annotation of OpenShift's UID range for its pods (`start/size`).
pub(crate) const OPENSHIFT_UID_RANGE: &str = "openshift.io/sa.scc.uid-range";
/// The namespace annotation of OpenShift's supplemental group range (`start/size`).
pub(crate) const OPENSHIFT_GROUPS: &str = "openshift.io/sa.scc.supplemental-groups";

/// The last ID of an OpenShift range, `start/size` or `start-end`; the first of several
/// comma-separated ranges is used.
pub(crate) fn range_top(range: &str) -> Option<i64> {
    let first = range.split(',').next()?.trim();
    if let Some((start, size)) = first.split_once('/') {
        let (start, size): (i64, i64) = (start.trim().parse().ok()?, size.trim().parse().ok()?);
        return (size > 0).then(|| start + size - 1);
    }
    let (_, end) = first.split_once('-')?;
    end.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_go_field_order_and_canonical_quantities() {
        let o = Overrides {
            containers: vec![],
            init_containers: vec![overlay(&json!({
                "tty": true,
                "resources": {"requests": {"cpu": "123m"}, "limits": {"cpu": "3000m"}},
                "name": "istio-proxy",
                "securityContext": {"runAsGroup": 1, "runAsUser": 2},
            }))],
        };
        assert_eq!(
            o.annotation(),
            r#"{"initContainers":[{"name":"istio-proxy","resources":{"limits":{"cpu":"3"},"requests":{"cpu":"123m"}},"securityContext":{"runAsUser":2,"runAsGroup":1},"tty":true}]}"#
        );
    }

    #[test]
    fn auto_image_is_not_an_override() {
        let o = overlay(&json!({"name": "istio-proxy", "image": "auto"}));
        assert_eq!(o, json!({"name": "istio-proxy"}));
    }
}
