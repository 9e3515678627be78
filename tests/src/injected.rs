//! Runs an injected Pod's Istio containers the way a kubelet would, from
//! nothing but the Pod's spec: the harness reads the spec the webhook
//! produced and does what it says.
//!
//! - The Pod gets a network namespace on the hub with its IP.
//! - Volumes are laid out as files under the Pod's directory (`emptyDir`,
//!   also for a volume with no source, as the API server defaults it;
//!   `configMap` items from the cluster; `downwardAPI` labels/annotations
//!   in the kubelet's `key="value"` format; `projected` service account
//!   tokens for their audience and ConfigMaps). Each container sees a
//!   mount at `<pod dir>/<mountPath>`, and runs with the Pod directory as
//!   its working directory: Istio's agent reads its files relative to `/`
//!   (`./var/run/secrets/...`), so this is the container's view.
//! - Environment: `value`, `fieldRef` (`metadata.name`, `metadata.namespace`,
//!   `metadata.uid`, `metadata.labels[...]`, `metadata.annotations[...]`,
//!   `spec.nodeName`, `spec.serviceAccountName`, `status.podIP`,
//!   `status.podIPs`, `status.hostIP`, `status.hostIPs`) and
//!   `resourceFieldRef` (limits/requests of cpu and memory, node capacity
//!   when unset, as the kubelet reports); `$(VAR)` in `args` expanded as
//!   the kubelet does (`$$` escapes).
//! - The proxy image's entrypoint is `pilot-agent` (images/): a container
//!   with `args` only runs `pilot-agent <args>`, as the user its
//!   `securityContext` names. Init containers run in order; one with
//!   `restartPolicy: Always` (a native sidecar) is started and the next
//!   waits for its `startupProbe`.
//! - Only Istio's containers run (`istio-init`, `istio-validation`,
//!   `istio-proxy`); the app containers are the test's to stand in for.
//!
//! - The Pod's network `sysctls` are set in its namespace.
//!
//! Nothing is added that the spec lacks; what the harness cannot do
//! (secrets, host paths, other images' commands) fails the test loudly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::mesh::{Hub, PodNet};

/// What the cluster knows of a Pod besides its spec.
pub struct PodFacts {
    /// The Pod's IP.
    pub ip: String,
    /// The node's name.
    pub node_name: String,
    /// The node's IP.
    pub host_ip: String,
    /// ConfigMaps of the Pod's namespace: name to data.
    pub configmaps: BTreeMap<String, BTreeMap<String, String>>,
    /// A token for the Pod's service account with the given audience.
    pub token: Box<dyn Fn(&str) -> String>,
}

/// A running injected Pod.
pub struct InjectedPod {
    /// Its network.
    pub net: PodNet,
    /// Its directory (the containers' `/`).
    pub dir: PathBuf,
    /// The long-running containers by name.
    pub containers: Vec<(String, crate::Proc)>,
}

impl InjectedPod {
    /// The running container named `name`.
    pub fn container(&mut self, name: &str) -> &mut crate::Proc {
        &mut self
            .containers
            .iter_mut()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no running container {name}"))
            .1
    }
}

const ISTIO_CONTAINERS: [&str; 3] = ["istio-init", "istio-validation", "istio-proxy"];

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

/// A downward-API file: `key="value"` lines, sorted, values escaped as the kubelet does.
fn downward(map: Option<&Value>) -> String {
    let map: BTreeMap<&String, &str> = map
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k, v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    map.iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{v}\"\n")
        })
        .collect()
}

fn field_ref(pod: &Value, facts: &PodFacts, path: &str) -> String {
    if let Some(key) = path
        .strip_prefix("metadata.labels['")
        .and_then(|r| r.strip_suffix("']"))
    {
        return s(pod, &format!("/metadata/labels/{}", key.replace('/', "~1"))).into();
    }
    if let Some(key) = path
        .strip_prefix("metadata.annotations['")
        .and_then(|r| r.strip_suffix("']"))
    {
        return s(
            pod,
            &format!("/metadata/annotations/{}", key.replace('/', "~1")),
        )
        .into();
    }
    match path {
        "metadata.name" => s(pod, "/metadata/name").into(),
        "metadata.namespace" => s(pod, "/metadata/namespace").into(),
        "metadata.uid" => s(pod, "/metadata/uid").into(),
        "metadata.labels" => downward(pod.pointer("/metadata/labels")),
        "metadata.annotations" => downward(pod.pointer("/metadata/annotations")),
        "spec.nodeName" => facts.node_name.clone(),
        "spec.serviceAccountName" => {
            let sa = s(pod, "/spec/serviceAccountName");
            if sa.is_empty() { "default" } else { sa }.into()
        }
        "status.podIP" | "status.podIPs" => facts.ip.clone(),
        "status.hostIP" | "status.hostIPs" => facts.host_ip.clone(),
        other => panic!("the harness does not know fieldRef {other}"),
    }
}

/// `resourceFieldRef`: the container's limit or request, node capacity when
/// unset, divided by `divisor` and rounded up.
fn resource_ref(container: &Value, r: &Value) -> String {
    let resource = s(r, "/resource");
    let (kind, name) = resource.split_once('.').unwrap_or(("limits", resource));
    let set = container
        .pointer(&format!("/resources/{kind}/{name}"))
        .and_then(Value::as_str)
        .map(quantity);
    let node = match name {
        "cpu" => std::thread::available_parallelism().map_or(1, |n| n.get()) as f64,
        _ => 8.0 * 1024.0 * 1024.0 * 1024.0,
    };
    let value = set.unwrap_or(node);
    let divisor = r
        .get("divisor")
        .map(|d| match d {
            Value::String(s) => quantity(s),
            Value::Number(n) => n.as_f64().unwrap_or(1.0),
            _ => 1.0,
        })
        .filter(|d| *d > 0.0)
        .unwrap_or(1.0);
    format!("{}", (value / divisor).ceil() as u64)
}

/// A Kubernetes quantity as a number (`500m`, `2`, `128Mi`, `1G`).
fn quantity(q: &str) -> f64 {
    let units = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("m", 0.001),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    for (suffix, factor) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<f64>().unwrap_or(0.0) * factor;
        }
    }
    q.parse().unwrap_or(0.0)
}

/// The container's environment, in order.
fn environment(pod: &Value, container: &Value, facts: &PodFacts) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for e in container
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = s(e, "/name").to_string();
        let value = if let Some(v) = e.get("value") {
            v.as_str().unwrap_or_default().to_string()
        } else if let Some(f) = e.pointer("/valueFrom/fieldRef") {
            field_ref(pod, facts, s(f, "/fieldPath"))
        } else if let Some(r) = e.pointer("/valueFrom/resourceFieldRef") {
            resource_ref(container, r)
        } else if e.get("valueFrom").is_some() {
            panic!("the harness cannot resolve env {name}: {e}")
        } else {
            String::new()
        };
        let value = expand(&value, &env);
        env.push((name, value));
    }
    env
}

/// The kubelet's `$(VAR)` expansion: defined variables are replaced, `$$`
/// is a `$`, anything else stays as written.
pub fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i + 1..];
        if let Some(t) = tail.strip_prefix('$') {
            out.push('$');
            rest = t;
        } else if let Some((name, after)) = tail.strip_prefix('(').and_then(|t| t.split_once(')')) {
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&format!("$({name})")),
            }
            rest = after;
        } else {
            out.push('$');
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// Writes every volume of the Pod under `dir/volumes/<name>`.
fn lay_out_volumes(pod: &Value, facts: &PodFacts, dir: &Path) {
    for v in pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = s(v, "/name");
        let root = dir.join("volumes").join(name);
        std::fs::create_dir_all(&root).expect("a volume directory");
        let write = |path: &str, text: &str| {
            let file = root.join(path);
            std::fs::create_dir_all(file.parent().expect("a parent")).expect("volume subdir");
            std::fs::write(&file, text).expect("write a volume file");
        };
        // A volume with no source is an `emptyDir`: the API server's
        // defaulting (Istio's template relies on it for its socket volumes).
        let sourceless = v.as_object().is_some_and(|o| o.len() == 1);
        if v.get("emptyDir").is_some() || sourceless {
            continue;
        }
        if let Some(cm) = v.get("configMap") {
            write_configmap(cm, facts, &write);
        } else if let Some(d) = v.get("downwardAPI") {
            for item in d
                .get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let text = field_ref(pod, facts, s(item, "/fieldRef/fieldPath"));
                write(s(item, "/path"), &text);
            }
        } else if let Some(p) = v.get("projected") {
            for source in p
                .get("sources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(t) = source.get("serviceAccountToken") {
                    write(s(t, "/path"), &(facts.token)(s(t, "/audience")));
                } else if let Some(cm) = source.get("configMap") {
                    write_configmap(cm, facts, &write);
                } else {
                    panic!("the harness cannot project {source} (volume {name})");
                }
            }
        } else {
            panic!("the harness cannot lay out volume {v}");
        }
    }
}

fn write_configmap(cm: &Value, facts: &PodFacts, write: &dyn Fn(&str, &str)) {
    let name = s(cm, "/name");
    let optional = cm.get("optional").and_then(Value::as_bool) == Some(true);
    let Some(data) = facts.configmaps.get(name) else {
        assert!(
            optional,
            "ConfigMap {name} is not in the cluster and not optional"
        );
        return;
    };
    match cm.get("items").and_then(Value::as_array) {
        Some(items) => {
            for item in items {
                let key = s(item, "/key");
                let text = data
                    .get(key)
                    .unwrap_or_else(|| panic!("ConfigMap {name} has no key {key}"));
                write(s(item, "/path"), text);
            }
        }
        None => data.iter().for_each(|(k, v)| write(k, v)),
    }
}

/// Links each of `container`'s mounts to its volume at `dir/<mountPath>`.
fn mount(container: &Value, dir: &Path) {
    for m in container
        .get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let target = dir.join(s(m, "/mountPath").trim_start_matches('/'));
        let source = dir.join("volumes").join(s(m, "/name"));
        if target.exists() {
            continue;
        }
        std::fs::create_dir_all(target.parent().expect("a mount's parent")).expect("mount dir");
        std::os::unix::fs::symlink(&source, &target).expect("link a mount");
    }
}

fn user_of(pod: &Value, container: &Value) -> u32 {
    container
        .pointer("/securityContext/runAsUser")
        .or_else(|| pod.pointer("/spec/securityContext/runAsUser"))
        .and_then(Value::as_u64)
        .unwrap_or(0) as u32
}

/// The command a container runs: the proxy image's entrypoint with `args`.
fn command(
    net: &PodNet,
    pod: &Value,
    c: &Value,
    facts: &PodFacts,
    pilot_agent: &Path,
    dir: &Path,
) -> Command {
    assert!(
        c.get("command").is_none(),
        "container {} overrides the image's entrypoint; the harness runs only pilot-agent",
        s(c, "/name")
    );
    let env = environment(pod, c, facts);
    let args: Vec<String> = c
        .get("args")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|a| expand(a.as_str().unwrap_or_default(), &env))
        .collect();
    let uid = user_of(pod, c);
    let mut cmd = net.command_as(uid, pilot_agent);
    cmd.args(&args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .envs(env);
    cmd
}

/// Waits for a container's HTTP probe (`startupProbe` or `readinessProbe`) to pass.
pub fn wait_probe(net: &PodNet, c: &Value, probe: &str, proc: &mut crate::Proc, limit: Duration) {
    let Some(p) = c.get(probe) else { return };
    let path = s(p, "/httpGet/path").to_string();
    let port = p
        .pointer("/httpGet/port")
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("the harness probes only numeric HTTP ports: {p}"))
        as u16;
    let name = s(c, "/name").to_string();
    crate::wait_for(&format!("{name} {probe}"), limit, || {
        assert!(proc.alive(), "{name} exited:\n{}", proc.log());
        let path = path.clone();
        net.ns
            .run(move || {
                crate::http_get(std::net::SocketAddr::from(([127, 0, 0, 1], port)), &path).ok()
            })
            .filter(|(code, _)| (200..400).contains(code))
    });
}

/// The Pod's `securityContext.sysctls`, set in its network namespace as
/// the kubelet sets them (only the namespaced `net.*` ones can be).
fn apply_sysctls(net: &PodNet, pod: &Value) {
    let sysctls = pod
        .pointer("/spec/securityContext/sysctls")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for sc in sysctls {
        let (name, value) = (s(&sc, "/name"), s(&sc, "/value"));
        assert!(
            name.starts_with("net."),
            "the harness sets only network sysctls, not {name}"
        );
        let out = net
            .ns
            .command("sysctl")
            .args(["-w", &format!("{name}={value}")])
            .output()
            .expect("run sysctl");
        assert!(
            out.status.success(),
            "sysctl {name}={value}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Runs the Istio containers of `pod` (an injected Pod as the API stored
/// it) on `hub`, in `dir`, with `pilot_agent` standing for the proxy image.
/// Returns when `istio-proxy` is ready.
pub fn run(
    hub: &Hub,
    pod: &Value,
    facts: &PodFacts,
    pilot_agent: &Path,
    dir: &Path,
) -> InjectedPod {
    std::fs::create_dir_all(dir).expect("the Pod's directory");
    let net = hub.pod("inj", &facts.ip);
    apply_sysctls(&net, pod);
    lay_out_volumes(pod, facts, dir);
    let mut running = Vec::new();
    let inits = pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mains = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    // The Pod's files belong to its users as an fsGroup would make them.
    let chown = |uid: u32| {
        let ok = Command::new("chown")
            .args(["-R", "-h", &format!("{uid}:{uid}")])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "chown the Pod's files");
    };
    for c in inits
        .iter()
        .filter(|c| ISTIO_CONTAINERS.contains(&s(c, "/name")))
    {
        mount(c, dir);
        let name = s(c, "/name").to_string();
        chown(user_of(pod, c));
        let mut cmd = command(&net, pod, c, facts, pilot_agent, dir);
        if s(c, "/restartPolicy") == "Always" {
            let mut proc = crate::Proc::spawn(&name, cmd, &dir.join(format!("{name}.log")));
            wait_probe(&net, c, "startupProbe", &mut proc, Duration::from_secs(60));
            running.push((name, proc));
        } else {
            let out = cmd.output().expect("run an init container");
            assert!(
                out.status.success(),
                "init container {name} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    for c in mains
        .iter()
        .filter(|c| ISTIO_CONTAINERS.contains(&s(c, "/name")))
    {
        mount(c, dir);
        let name = s(c, "/name").to_string();
        chown(user_of(pod, c));
        let cmd = command(&net, pod, c, facts, pilot_agent, dir);
        running.push((
            name.clone(),
            crate::Proc::spawn(&name, cmd, &dir.join(format!("{name}.log"))),
        ));
    }
    for c in inits
        .iter()
        .chain(&mains)
        .filter(|c| s(c, "/name") == "istio-proxy")
    {
        let proc = &mut running
            .iter_mut()
            .find(|(n, _)| n == "istio-proxy")
            .expect("istio-proxy runs")
            .1;
        wait_probe(&net, c, "readinessProbe", proc, Duration::from_secs(60));
    }
    InjectedPod {
        net,
        dir: dir.to_path_buf(),
        containers: running,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_as_the_kubelet_does() {
        let env = vec![("POD_NAMESPACE".to_string(), "demo".to_string())];
        assert_eq!(
            expand("$(POD_NAMESPACE).svc.cluster.local", &env),
            "demo.svc.cluster.local"
        );
        assert_eq!(
            expand("$$(POD_NAMESPACE) $(MISSING) $x", &env),
            "$(POD_NAMESPACE) $(MISSING) $x"
        );
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("500m"), 0.5);
        assert_eq!(quantity("128Mi"), 128.0 * 1024.0 * 1024.0);
        let c = serde_json::json!({"resources": {"limits": {"cpu": "1500m"}}});
        assert_eq!(
            resource_ref(&c, &serde_json::json!({"resource": "limits.cpu"})),
            "2"
        );
    }
}
