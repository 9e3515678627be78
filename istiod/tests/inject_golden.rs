//! Golden tests of the sidecar injector against Istio's own injection goldens
//! (`pkg/kube/inject/testdata/inject` at istio/istio 86c9f01f; see `testdata/inject/README.md`).
//!
//! Each case injects an input with the values, mesh config and flags that Istio's
//! `inject_test.go` lists for it, then compares the result structurally with Istio's
//! `.injected` output. The goldens are Istio's, so there is no switch to rewrite them.
//!
//! Differences that are not ours to reproduce are normalised on both sides, one by one:
//! - Go's typed serialisation writes empty structs and nil timestamps that carry no meaning:
//!   `creationTimestamp: null`, top-level `status: {}`, `spec.strategy: {}`, an empty
//!   `metadata: {}` and a container's `resources: {}`. They are removed from both sides before comparing.
//! - Likewise a workload's zero-valued `status` (`replicas: 0`, ...), and its `spec` fields
//!   whose value is `false`, `0` or `{}` (`updateStrategy: {}`, a DeploymentConfig's
//!   `test: false` written and `paused: false` dropped by Go's field tags), and a List's
//!   empty `metadata`.
//!
//! Covered: every golden of the reference copy, one case each in `cases()` (118 cases; a
//! golden that Istio checks with several settings has a case for each). A case whose output
//! cannot be Istio's lists its differences one by one, each with its reason (`Expect`), and
//! the test fails when a listed difference no longer occurs:
//! - `custom-template`, `sidecar-spire`, `gateway-spire`: custom templates in Go's template
//!   language (from the `.iop.yaml` values) are not interpreted; injection is refused with an
//!   error naming the template.
//! - `hello-otel-semconv`: `OTEL_RESOURCE_ATTRIBUTES` needs the mesh's OpenTelemetry
//!   extension providers, which the injector's mesh settings do not carry.
//!
//! `tcp-probes`, `merge-probers`, `hello-probes-localhost` are in Istio's table but have no
//! files in the reference copy. OpenShift cases inject as the webhook does for a pod of
//! `inject_test.go`'s `test-ns` namespace (its SCC range annotations).

use std::collections::BTreeMap;
use std::path::PathBuf;

use istiod::inject::{self, InjectionConfig, Values, patch};
use serde_json::{Value, json};

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata/inject")
        .join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(testdata(name)).unwrap_or_else(|e| panic!("reading {name}: {e}"))
}

fn base_config() -> InjectionConfig {
    let values = Values::from_yaml(&read("istio-discovery-values.yaml")).expect("values parse");
    InjectionConfig::new(values)
}

/// Removes Go's zero-value artifacts (see the module doc) in place.
fn normalise_top(v: &mut Value) {
    if let Value::Object(m) = v {
        m.remove("status");
        if m.get("metadata")
            .is_some_and(|md| md.as_object().is_some_and(|o| o.is_empty()))
        {
            m.remove("metadata");
        }
        if let Some(Value::Object(spec)) = m.get_mut("spec") {
            spec.retain(|_, val| !(val == &json!(false) || val == &json!(0) || val == &json!({})));
        }
        if let Some(Value::Array(items)) = m.get_mut("items") {
            items.iter_mut().for_each(normalise_top);
        }
    }
    normalise(v);
}

/// Removes Go's empty-struct artifacts (see the module doc) in place.
fn normalise(v: &mut Value) {
    if let Value::Object(m) = v {
        m.retain(|k, val| {
            !(k == "creationTimestamp" && val.is_null()
                || (k == "status" || k == "strategy" || k == "resources" || k == "metadata")
                    && val.as_object().is_some_and(|o| o.is_empty()))
        });
        m.values_mut().for_each(normalise);
    } else if let Value::Array(a) = v {
        a.iter_mut().for_each(normalise);
    }
}

/// The paths at which `got` and `want` differ, for a readable failure.
fn differences(path: &str, got: &Value, want: &Value, out: &mut Vec<String>) {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                match g.get(k) {
                    Some(gv) => differences(&format!("{path}/{k}"), gv, wv, out),
                    None => out.push(format!("{path}/{k}: missing, want {wv}")),
                }
            }
            for (k, gv) in g {
                if !w.contains_key(k) {
                    out.push(format!("{path}/{k}: unexpected {gv}"));
                }
            }
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
            for (i, (gv, wv)) in g.iter().zip(w).enumerate() {
                differences(&format!("{path}/{i}"), gv, wv, out);
            }
        }
        _ if got != want => out.push(format!("{path}: got {got}, want {want}")),
        _ => {}
    }
}

/// What a case expects besides the golden.
enum Expect {
    /// The golden, exactly (after the normalisations of the module doc).
    Golden,
    /// The golden, except at these paths (a prefix of the differing path, as
    /// `differences` prints it), each with why the difference is not ours to remove.
    Except(&'static [(&'static str, &'static str)]),
    /// Injection fails with an error containing this text; the reason says why.
    Error {
        contains: &'static str,
        reason: &'static str,
    },
}

struct Case {
    input: &'static str,
    golden: &'static str,
    /// Values set as `inject_test.go`'s `setFlags` (`values.` prefix dropped).
    values: &'static [(&'static str, Value)],
    /// An IstioOperator file whose `spec.values` is merged into the values
    /// (`inject_test.go`'s `inFilePath`).
    iop: Option<&'static str>,
    configure: fn(&mut InjectionConfig),
    /// Inject as the webhook does for a pod of `inject_test.go`'s `test-ns` namespace on
    /// OpenShift (its SCC range annotations).
    openshift: bool,
    expect: Expect,
}

fn none(_: &mut InjectionConfig) {}
fn old_version(c: &mut InjectionConfig) {
    c.native_sidecars = false;
}

fn tproxy(c: &mut InjectionConfig) {
    c.mesh
        .default_config
        .insert("interceptionMode".into(), json!("TPROXY"));
}

/// Why goldens of custom templates are not reproduced.
const CUSTOM_TEMPLATES: &str = "custom templates in Go's template language are not interpreted: \
    only the built-in templates (sidecar, gateway, grpc-simple, grpc-agent) exist, and a pod \
    asking for another is refused with an error naming it";

fn case(input: &'static str, golden: &'static str) -> Case {
    Case {
        input,
        golden,
        values: &[],
        iop: None,
        configure: none,
        openshift: false,
        expect: Expect::Golden,
    }
}

/// Merges `overlay` into `target`, objects key by key, as Helm merges values files.
fn merge_values(target: &mut Value, overlay: &Value) {
    match (target, overlay) {
        (Value::Object(t), Value::Object(o)) => {
            for (k, v) in o {
                merge_values(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (t, o) => *t = o.clone(),
    }
}

fn run(c: &Case) -> Result<(), String> {
    let mut cfg = base_config();
    if let Some(iop) = c.iop {
        let iop: Value = serde_yaml_ng::from_str(&read(iop)).map_err(|e| e.to_string())?;
        let mut values = cfg.values.json().clone();
        merge_values(
            &mut values,
            iop.pointer("/spec/values").unwrap_or(&Value::Null),
        );
        cfg.values = Values::from_json(values);
    }
    for (k, v) in c.values {
        cfg.values.set(k, v.clone());
    }
    (c.configure)(&mut cfg);
    let inputs = inject::parse_yaml_documents(&read(c.input)).map_err(|e| e.to_string())?;
    let wants = inject::parse_yaml_documents(&read(c.golden)).map_err(|e| e.to_string())?;
    if inputs.len() != wants.len() {
        return Err(format!(
            "{} documents in, {} in golden",
            inputs.len(),
            wants.len()
        ));
    }
    let mut diffs = Vec::new();
    for (i, (input, want)) in inputs.iter().zip(wants).enumerate() {
        let namespace = if c.openshift {
            cfg.openshift = true;
            BTreeMap::from([
                (
                    "openshift.io/sa.scc.uid-range".into(),
                    "1000620000/10000".into(),
                ),
                (
                    "openshift.io/sa.scc.supplemental-groups".into(),
                    "1000620000/10000".into(),
                ),
            ])
        } else {
            BTreeMap::new()
        };
        let got = inject::inject_object_in_namespace(input, &namespace, &cfg);
        if let Expect::Error { contains, reason } = c.expect {
            assert!(
                !reason.trim().is_empty(),
                "{}: an expected error needs a reason",
                c.golden
            );
            return match got {
                Err(e) if e.to_string().contains(contains) => Ok(()),
                Err(e) => Err(format!("error {e:?} does not contain {contains:?}")),
                Ok(_) => Err(format!("expected an error containing {contains:?}")),
            };
        }
        let mut got = got.map_err(|e| e.to_string())?;
        // The webhook's patch must turn the input into the output.
        let ops = patch::diff(input, &got);
        if patch::apply(input, &ops).as_ref() != Some(&got) {
            diffs.push(format!(
                "doc {i}: JSON patch does not reproduce the injected object"
            ));
        }
        let mut want = want;
        normalise_top(&mut got);
        normalise_top(&mut want);
        let mut found = Vec::new();
        differences(&format!("doc{i}"), &got, &want, &mut found);
        let known: &[(&str, &str)] = match c.expect {
            Expect::Except(known) => known,
            _ => &[],
        };
        for (path, reason) in known {
            assert!(
                !reason.trim().is_empty(),
                "{path}: a listed difference needs a reason"
            );
            if !found.iter().any(|d| d.starts_with(path)) {
                diffs.push(format!(
                    "{path}: listed as a known difference but matches the golden; remove it from the list"
                ));
            }
        }
        diffs.extend(
            found
                .into_iter()
                .filter(|d| !known.iter().any(|(path, _)| d.starts_with(path))),
        );
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(diffs.join("\n  "))
    }
}

fn cases() -> Vec<Case> {
    let status_params: &'static [(&'static str, Value)] = Box::leak(Box::new([
        ("global.proxy.statusPort", json!(123)),
        ("global.proxy.readinessInitialDelaySeconds", json!(100)),
        ("global.proxy.readinessPeriodSeconds", json!(200)),
        ("global.proxy.readinessFailureThreshold", json!(300)),
    ]));
    let cni: &'static [(&'static str, Value)] =
        Box::leak(Box::new([("pilot.cni.enabled", json!(true))]));
    let multus: &'static [(&'static str, Value)] = Box::leak(Box::new([
        ("pilot.cni.enabled", json!(true)),
        ("pilot.cni.provider", json!("multus")),
    ]));
    let hold: &'static [(&'static str, Value)] = Box::leak(Box::new([(
        "global.proxy.holdApplicationUntilProxyStarts",
        json!(true),
    )]));
    vec![
        case("hello.yaml", "hello.yaml.injected"),
        Case {
            configure: old_version,
            ..case("hello.yaml", "hello-old-version.yaml.injected")
        },
        case("frontend.yaml", "frontend.yaml.injected"),
        case("auth.yaml", "auth.yaml.injected"),
        case(
            "auth.non-default-service-account.yaml",
            "auth.non-default-service-account.yaml.injected",
        ),
        case("daemonset.yaml", "daemonset.yaml.injected"),
        Case {
            configure: old_version,
            ..case("daemonset.yaml", "daemonset-old-version.yaml.injected")
        },
        case("deploymentconfig.yaml", "deploymentconfig.yaml.injected"),
        case("statefulset.yaml", "statefulset.yaml.injected"),
        Case {
            configure: old_version,
            ..case("statefulset.yaml", "statefulset-old-version.yaml.injected")
        },
        case("job.yaml", "job.yaml.injected"),
        Case {
            configure: old_version,
            ..case("job.yaml", "job-old-version.yaml.injected")
        },
        case("cronjob.yaml", "cronjob.yaml.injected"),
        Case {
            configure: old_version,
            ..case("cronjob.yaml", "cronjob-old-version.yaml.injected")
        },
        case("replicaset.yaml", "replicaset.yaml.injected"),
        Case {
            configure: old_version,
            ..case("replicaset.yaml", "replicaset-old-version.yaml.injected")
        },
        case("pod.yaml", "pod.yaml.injected"),
        Case {
            configure: old_version,
            ..case("pod.yaml", "pod-old-version.yaml.injected")
        },
        case(
            "replicationcontroller.yaml",
            "replicationcontroller.yaml.injected",
        ),
        case("hello-probes.yaml", "hello-probes.yaml.injected"),
        case("hello-readiness.yaml", "hello-readiness.yaml.injected"),
        case("ready_only.yaml", "ready_only.yaml.injected"),
        case("ready_live.yaml", "ready_live.yaml.injected"),
        case("startup_only.yaml", "startup_only.yaml.injected"),
        case("startup_live.yaml", "startup_live.yaml.injected"),
        case(
            "startup_ready_live.yaml",
            "startup_ready_live.yaml.injected",
        ),
        Case {
            values: Box::leak(Box::new([
                (
                    "global.proxy.includeIPRanges",
                    json!("127.0.0.1/24,10.96.0.1/24"),
                ),
                (
                    "global.proxy.excludeIPRanges",
                    json!("10.96.0.2/24,10.96.0.3/24"),
                ),
                ("global.proxy.excludeInboundPorts", json!("4,5,6")),
                ("global.proxy.statusPort", json!(0)),
            ])),
            ..case("traffic-params.yaml", "traffic-params.yaml.injected")
        },
        case(
            "traffic-params-empty-includes.yaml",
            "traffic-params-empty-includes.yaml.injected",
        ),
        case(
            "resource_annotations.yaml",
            "resource_annotations.yaml.injected",
        ),
        case(
            "status_annotations.yaml",
            "status_annotations.yaml.injected",
        ),
        case(
            "status_annotations_zeroport.yaml",
            "status_annotations_zeroport.yaml.injected",
        ),
        Case {
            values: status_params,
            ..case("status_params.yaml", "status_params.yaml.injected")
        },
        Case {
            values: status_params,
            ..case(
                "kubevirtInterfaces.yaml",
                "kubevirtInterfaces.yaml.injected",
            )
        },
        case(
            "kubevirtInterfaces_list.yaml",
            "kubevirtInterfaces_list.yaml.injected",
        ),
        Case {
            values: status_params,
            ..case(
                "reroute-virtual-interfaces.yaml",
                "reroute-virtual-interfaces.yaml.injected",
            )
        },
        case(
            "reroute-virtual-interfaces_list.yaml",
            "reroute-virtual-interfaces_list.yaml.injected",
        ),
        Case {
            values: hold,
            ..case("hello.yaml", "hello.proxyHoldsApplication.yaml.injected")
        },
        Case {
            values: hold,
            ..case(
                "hello-probes.yaml",
                "hello-probes.proxyHoldsApplication.yaml.injected",
            )
        },
        case(
            "hello-probes-proxyHoldApplication-ProxyConfig.yaml",
            "hello-probes-proxyHoldApplication-ProxyConfig.yaml.injected",
        ),
        Case {
            values: hold,
            ..case(
                "hello-probes-noProxyHoldApplication-ProxyConfig.yaml",
                "hello-probes-noProxyHoldApplication-ProxyConfig.yaml.injected",
            )
        },
        case(
            "hello-probes-with-flag-set-in-annotation.yaml",
            "hello-probes-with-flag-set-in-annotation.yaml.injected",
        ),
        case(
            "hello-probes-with-flag-unset-in-annotation.yaml",
            "hello-probes-with-flag-unset-in-annotation.yaml.injected",
        ),
        Case {
            values: Box::leak(Box::new([("global.proxy.image", json!("proxyTest"))])),
            ..case("hello.yaml", "hello.yaml.proxyImageName.injected")
        },
        Case {
            values: Box::leak(Box::new([(
                "global.proxy_init.image",
                json!("proxyInitTest"),
            )])),
            ..case("hello.yaml", "hello.yaml.proxyInitImageName.injected")
        },
        Case {
            values: Box::leak(Box::new([("global.imagePullPolicy", json!("Always"))])),
            ..case("hello.yaml", "hello-always.yaml.injected")
        },
        Case {
            values: Box::leak(Box::new([("global.imagePullPolicy", json!("Never"))])),
            ..case("hello.yaml", "hello-never.yaml.injected")
        },
        Case {
            values: Box::leak(Box::new([("global.mountMtlsCerts", json!(true))])),
            ..case("hello.yaml", "hello-mount-mtls-certs.yaml.injected")
        },
        Case {
            configure: |c| {
                c.mesh
                    .default_config
                    .insert("interceptionMode".into(), json!("TPROXY"));
            },
            ..case("hello.yaml", "hello-tproxy.yaml.injected")
        },
        Case {
            configure: |c| {
                c.mesh
                    .default_config
                    .insert("drainDuration".into(), json!("23s"));
            },
            ..case("format-duration.yaml", "format-duration.yaml.injected")
        },
        Case {
            configure: |c| c.compliance_policy = Some("fips-140-3".into()),
            ..case("hello.yaml", "hello-fips-140-3.yaml.injected")
        },
        case("native-sidecar.yaml", "native-sidecar.yaml.injected"),
        Case {
            configure: old_version,
            ..case(
                "native-sidecar.yaml",
                "native-sidecar-old-version.yaml.injected",
            )
        },
        case(
            "native-sidecar-opt-in.yaml",
            "native-sidecar-opt-in.yaml.injected",
        ),
        Case {
            configure: old_version,
            ..case(
                "native-sidecar-opt-in.yaml",
                "native-sidecar-opt-in.yaml.injected",
            )
        },
        case(
            "native-sidecar-opt-out.yaml",
            "native-sidecar-opt-out.yaml.injected",
        ),
        Case {
            configure: old_version,
            ..case(
                "native-sidecar-opt-out.yaml",
                "native-sidecar-opt-out.yaml.injected",
            )
        },
        case("multi-init.yaml", "multi-init.yaml.injected"),
        case("multi-container.yaml", "multi-container.yaml.injected"),
        case("one_container.yaml", "one_container.yaml.injected"),
        case("two_container.yaml", "two_container.yaml.injected"),
        case("named_port.yaml", "named_port.yaml.injected"),
        case("prometheus-scrape.yaml", "prometheus-scrape.yaml.injected"),
        case(
            "prometheus-scrape2.yaml",
            "prometheus-scrape2.yaml.injected",
        ),
        case("user-volume.yaml", "user-volume.yaml.injected"),
        case("hello-multi.yaml", "hello-multi.yaml.injected"),
        case("hello-namespace.yaml", "hello-namespace.yaml.injected"),
        case("hello-ignore.yaml", "hello-ignore.yaml.injected"),
        case(
            "hello-host-network.yaml",
            "hello-host-network.yaml.injected",
        ),
        case(
            "hello-mtls-not-ready.yaml",
            "hello-mtls-not-ready.yaml.injected",
        ),
        case("https-probes.yaml", "https-probes.yaml.injected"),
        case(
            "truncate-canonical-name-pod.yaml",
            "truncate-canonical-name-pod.yaml.injected",
        ),
        case(
            "truncate-canonical-name-custom-controller-pod.yaml",
            "truncate-canonical-name-custom-controller-pod.yaml.injected",
        ),
        case(
            "deploymentconfig-with-canonical-service-label.yaml",
            "deploymentconfig-with-canonical-service-label.yaml.injected",
        ),
        case(
            "deploymentconfig-multi.yaml",
            "deploymentconfig-multi.yaml.injected",
        ),
        case(
            "traffic-annotations-empty-includes.yaml",
            "traffic-annotations-empty-includes.yaml.injected",
        ),
        case(
            "traffic-annotations-wildcards.yaml",
            "traffic-annotations-wildcards.yaml.injected",
        ),
        case("enable-core-dump.yaml", "enable-core-dump.yaml.injected"),
        case(
            "hello-image-pull-secret.yaml",
            "hello-image-pull-secret.yaml.injected",
        ),
        case("list.yaml", "list.yaml.injected"),
        case("list-frontend.yaml", "list-frontend.yaml.injected"),
        case("hello-service.yaml", "hello-service.yaml.injected"),
        case(
            "hello-host-network-with-ns.yaml",
            "hello-host-network-with-ns.yaml.injected",
        ),
        case(
            "explicit-security-context.yaml",
            "explicit-security-context.yaml.injected",
        ),
        Case {
            configure: |c| {
                c.mesh.default_config.insert("tracing".into(), json!({}));
            },
            ..case(
                "hello-tracing-disabled.yaml",
                "hello-tracing-disabled.yaml.injected",
            )
        },
        Case {
            configure: |c| {
                c.mesh.default_config.insert(
                    "proxyMetadata".into(),
                    json!({"ISTIO_META_TLS_CLIENT_KEY": "/etc/identity/client/keys/client-key.pem"}),
                );
            },
            ..case(
                "traffic-annotations.yaml",
                "traffic-annotations.yaml.injected",
            )
        },
        // proxy.istio.io/overrides
        case("proxy-override.yaml", "proxy-override.yaml.injected"),
        case(
            "only-proxy-container.yaml",
            "only-proxy-container.yaml.injected",
        ),
        case(
            "proxy-override-args.yaml",
            "proxy-override-args.yaml.injected",
        ),
        case(
            "proxy-override-args.yaml",
            "proxy-override-args-native.yaml.injected",
        ),
        case(
            "proxy-override-runas.yaml",
            "proxy-override-runas.yaml.injected",
        ),
        Case {
            values: cni,
            ..case(
                "proxy-override-runas.yaml",
                "proxy-override-runas.yaml.cni.injected",
            )
        },
        Case {
            configure: tproxy,
            ..case(
                "proxy-override-runas.yaml",
                "proxy-override-runas.yaml.tproxy.injected",
            )
        },
        // Templates
        case("gateway.yaml", "gateway.yaml.injected"),
        case(
            "gateway-with-default-container.yaml",
            "gateway-with-default-container.yaml.injected",
        ),
        case("grpc-simple.yaml", "grpc-simple.yaml.injected"),
        case("grpc-agent.yaml", "grpc-agent.yaml.injected"),
        case(
            "multiple-templates.yaml",
            "multiple-templates.yaml.injected",
        ),
        Case {
            iop: Some("custom-template.iop.yaml"),
            expect: Expect::Error {
                contains: "\"custom\"",
                reason: CUSTOM_TEMPLATES,
            },
            ..case("custom-template.yaml", "custom-template.yaml.injected")
        },
        Case {
            iop: Some("spire-template.iop.yaml"),
            expect: Expect::Error {
                contains: "\"spire\"",
                reason: CUSTOM_TEMPLATES,
            },
            ..case("sidecar-spire.yaml", "sidecar-spire.yaml.injected")
        },
        Case {
            iop: Some("spire-template.iop.yaml"),
            expect: Expect::Error {
                contains: "\"spire\"",
                reason: CUSTOM_TEMPLATES,
            },
            ..case("gateway-spire.yaml", "gateway-spire.yaml.injected")
        },
        // CNI
        Case {
            values: Box::leak(Box::new([
                ("pilot.cni.enabled", json!(true)),
                ("pilot.cni.provider", json!("default")),
                ("global.network", json!("network1")),
            ])),
            ..case("hello.yaml", "hello.yaml.cni.injected")
        },
        Case {
            values: multus,
            ..case("hello.yaml", "hello-cncf-networks.yaml.injected")
        },
        Case {
            values: multus,
            ..case(
                "hello-existing-cncf-networks.yaml",
                "hello-existing-cncf-networks.yaml.injected",
            )
        },
        Case {
            values: multus,
            ..case(
                "hello-existing-cncf-networks-json.yaml",
                "hello-existing-cncf-networks-json.yaml.injected",
            )
        },
        // OpenShift
        Case {
            values: cni,
            openshift: true,
            ..case("hello-openshift.yaml", "hello-openshift.yaml.injected")
        },
        Case {
            values: cni,
            openshift: true,
            ..case(
                "hello-openshift-custom-injection.yaml",
                "hello-openshift-custom-injection.yaml.injected",
            )
        },
        Case {
            values: cni,
            openshift: true,
            ..case(
                "hello-openshift-tproxy.yaml",
                "hello-openshift-tproxy.yaml.injected",
            )
        },
        // Values from IstioOperator files
        Case {
            iop: Some("hello-image-secrets-in-values.iop.yaml"),
            ..case("hello.yaml", "hello-image-secrets-in-values.yaml.injected")
        },
        Case {
            iop: Some("hello-image-secrets-in-values.iop.yaml"),
            ..case(
                "hello-image-pull-secret.yaml",
                "hello-multiple-image-secrets.yaml.injected",
            )
        },
        Case {
            iop: Some("proxy-resources-null.iop.yaml"),
            ..case(
                "proxy-resources-null.yaml",
                "proxy-resources-null.yaml.injected",
            )
        },
        Case {
            iop: Some("proxy-resources-null.iop.yaml"),
            ..case(
                "proxy-resources-null-no-init.yaml",
                "proxy-resources-null-no-init.yaml.injected",
            )
        },
        Case {
            iop: Some("proxy-resources-zero.iop.yaml"),
            ..case(
                "proxy-resources-zero.yaml",
                "proxy-resources-zero.yaml.injected",
            )
        },
        Case {
            iop: Some("proxy-resources-memory-null.iop.yaml"),
            ..case(
                "proxy-resources-memory-null.yaml",
                "proxy-resources-memory-null.yaml.injected",
            )
        },
        Case {
            iop: Some("proxy-resources-mixed-null.iop.yaml"),
            ..case(
                "proxy-resources-mixed-null.yaml",
                "proxy-resources-mixed-null.yaml.injected",
            )
        },
        Case {
            iop: Some("hello-template-in-values.iop.yaml"),
            ..case("hello.yaml", "hello-template-in-values.yaml.injected")
        },
        // Other
        case(
            "hello-multiport-metrics.yaml",
            "hello-multiport-metrics.yaml.injected",
        ),
        case(
            "init-no-intercept-no-native-sidecar.yaml",
            "init-no-intercept-no-native-sidecar.yaml.injected",
        ),
        Case {
            expect: Expect::Except(&[(
                "doc0/spec/template/spec/initContainers/1/env",
                "OTEL_RESOURCE_ATTRIBUTES needs the mesh's OpenTelemetry extension providers \
                 (semantic-convention enrichment), which the injector's mesh settings do not carry",
            )]),
            ..case(
                "hello-otel-semconv.yaml",
                "hello-otel-semconv.yaml.injected",
            )
        },
    ]
}

#[test]
fn injection_matches_istio_goldens() {
    let mut failures = Vec::new();
    let all = cases();
    for c in &all {
        if let Err(e) = run(c) {
            failures.push(format!("{} -> {}:\n  {e}", c.input, c.golden));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} goldens differ:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn bad_traffic_annotations_are_rejected() {
    use inject::{AnnotationValueError as Why, InjectError};
    let cfg = base_config();
    let cidr: fn(&Why) -> bool = |r| matches!(r, Why::NotCidr(_));
    let port: fn(&Why) -> bool = |r| matches!(r, Why::NotPort(_));
    for (input, name, why) in [
        (
            "traffic-annotations-bad-includeipranges.yaml",
            "includeOutboundIPRanges",
            cidr,
        ),
        (
            "traffic-annotations-bad-excludeipranges.yaml",
            "excludeOutboundIPRanges",
            cidr,
        ),
        (
            "traffic-annotations-bad-includeinboundports.yaml",
            "includeInboundPorts",
            port,
        ),
        (
            "traffic-annotations-bad-excludeinboundports.yaml",
            "excludeInboundPorts",
            port,
        ),
        (
            "traffic-annotations-bad-excludeoutboundports.yaml",
            "excludeOutboundPorts",
            port,
        ),
    ] {
        let docs = inject::parse_yaml_documents(&read(input)).expect("parse");
        let err = docs
            .iter()
            .find_map(|d| inject::inject_object(d, &cfg).err())
            .unwrap_or_else(|| panic!("{input}: expected an error"));
        assert!(err.to_string().contains(name), "{input}: {err}");
        assert!(
            matches!(&err, InjectError::InvalidAnnotation { key, reason, .. }
                if key.ends_with(name) && why(reason)),
            "{input}: {err:?}"
        );
    }
}
