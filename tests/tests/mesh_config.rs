//! istiod generates and pushes configuration: the sample mesh, through the
//! agent's xDS proxy over mTLS, into a real Envoy with Istio's names, and a
//! bad config file is rejected while the last good state keeps serving.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tests::sample_mesh::SampleMesh;
use tests::{http_get, wait_for};

const HTTPBIN: &str = "httpbin.demo.svc.cluster.local";

/// The sample mesh, with this test's queries on it.
struct Mesh(SampleMesh);

impl std::ops::Deref for Mesh {
    type Target = SampleMesh;
    fn deref(&self) -> &SampleMesh {
        &self.0
    }
}

/// istiod on the sample mesh and the `sleep` Pod's agent and Envoy, in one network.
fn start() -> Mesh {
    Mesh(SampleMesh::start("mesh"))
}

impl Mesh {
    fn config_dump(&self) -> serde_json::Value {
        let (_, body) = self.get(15000, "/config_dump?include_eds").unwrap();
        serde_json::from_str(&body).unwrap()
    }

    /// Names of dynamic resources of one kind in Envoy's config dump.
    fn names(&self, section: &str, field: &str) -> Vec<String> {
        let dump = self.config_dump();
        let mut out = Vec::new();
        for c in dump["configs"].as_array().unwrap() {
            for list in [
                "dynamic_active_clusters",
                "dynamic_listeners",
                "dynamic_route_configs",
                "static_clusters",
            ] {
                if !list.starts_with(section) {
                    continue;
                }
                for item in c[list].as_array().into_iter().flatten() {
                    let v = match section {
                        "dynamic_active_clusters" => &item["cluster"]["name"],
                        "dynamic_listeners" => &item["name"],
                        _ => &item["route_config"][field],
                    };
                    if let Some(s) = v.as_str() {
                        out.push(s.to_string());
                    }
                }
            }
        }
        out
    }

    fn rejected(&self) -> u64 {
        let (_, body) = self.get(15000, "/stats?filter=update_rejected").unwrap();
        body.lines()
            .filter_map(|l| l.rsplit(": ").next()?.trim().parse::<u64>().ok())
            .sum()
    }
}

#[test]
fn envoy_gets_istio_shaped_config_for_the_sample_mesh() {
    let mesh = start();
    let clusters = mesh.names("dynamic_active_clusters", "");
    for want in [
        format!("outbound|8000||{HTTPBIN}"),
        format!("outbound|8000|v1|{HTTPBIN}"),
        format!("outbound|8000|v2|{HTTPBIN}"),
        "BlackHoleCluster".into(),
        "PassthroughCluster".into(),
        "InboundPassthroughCluster".into(),
    ] {
        assert!(clusters.contains(&want), "{want} not in {clusters:?}");
    }
    assert!(
        clusters.iter().any(|c| c.starts_with("inbound|")),
        "the sleep Pod's inbound cluster: {clusters:?}"
    );
    let listeners = mesh.names("dynamic_listeners", "");
    for want in ["virtualOutbound", "virtualInbound", "0.0.0.0_8000"] {
        assert!(
            listeners.iter().any(|l| l == want),
            "{want} not in {listeners:?}"
        );
    }
    let dump = mesh.config_dump().to_string();
    assert!(
        dump.contains(&format!("\"{HTTPBIN}:8000\"")),
        "the route's virtual host"
    );
    assert!(
        dump.contains("\"weight\":90") && dump.contains("\"weight\":10"),
        "the 90/10 VirtualService"
    );
    assert!(
        dump.contains("spiffe://cluster.local/ns/demo/sa/httpbin"),
        "ISTIO_MUTUAL verifies httpbin's identity"
    );
    assert_eq!(mesh.rejected(), 0, "Envoy rejected nothing");
    // istiod's view agrees.
    let (code, syncz) = mesh.ns.run({
        let http = mesh.istiod.http;
        move || http_get(http, "/debug/syncz").unwrap()
    });
    assert_eq!(code, 200);
    assert!(syncz.contains("sleep-1.demo"), "{syncz}");
}

#[test]
fn bad_yaml_is_rejected_naming_file_object_and_field_and_envoy_keeps_its_config() {
    let mesh = start();
    let before = mesh.names("dynamic_active_clusters", "");
    std::fs::write(
        mesh.config.join("zz-bad.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: broken, namespace: demo}\nspec:\n  hosts: [httpbin]\n  http:\n  - route:\n    - destination: {host: httpbin, subset: v1}\n      weight: 150\n",
    )
    .unwrap();
    let log = wait_for("istiod to reject the file", Duration::from_secs(10), || {
        let log = mesh.istiod.proc.log();
        log.contains("zz-bad.yaml").then_some(log)
    });
    let line = log.lines().find(|l| l.contains("zz-bad.yaml")).unwrap();
    assert!(line.contains("VirtualService/demo/broken"), "{line}");
    assert!(line.contains("weight"), "{line}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        mesh.names("dynamic_active_clusters", ""),
        before,
        "Envoy keeps its configuration"
    );
    assert_eq!(mesh.rejected(), 0);
    assert_eq!(mesh.get(15021, "/healthz/ready").unwrap().0, 200);
}

impl Mesh {
    /// When Envoy last updated the route configuration `name`.
    fn route_updated(&self, name: &str) -> Option<String> {
        let dump = self.config_dump();
        dump["configs"].as_array()?.iter().find_map(|c| {
            c["dynamic_route_configs"].as_array()?.iter().find_map(|r| {
                (r["route_config"]["name"] == name)
                    .then(|| r["last_updated"].as_str().unwrap_or_default().to_string())
            })
        })
    }

    /// A counter from Envoy's `/stats`, exact name.
    fn stat(&self, name: &str) -> u64 {
        let (_, body) = self.get(15000, "/stats").unwrap();
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    fn edit(&self, file: &str, from: &str, to: &str) {
        let path = self.config.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{from} not in {file}");
        // Write atomically so the watcher never sees half a file.
        let tmp = self.config.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text.replacen(from, to, 1)).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
}

#[test]
fn an_endpoint_only_change_updates_eds_without_cds_lds_or_rds() {
    let mesh = start();
    let cds = mesh.stat("cluster_manager.cds.update_success");
    let lds = mesh.stat("listener_manager.lds.update_success");
    // Istio's bootstrap keeps no per-route stats: RDS is watched through the
    // route configuration's update time in the config dump.
    let rds = mesh.route_updated("8000");
    assert!(
        cds > 0 && lds > 0 && rds.is_some(),
        "cds {cds} lds {lds} rds {rds:?}"
    );
    // A third httpbin endpoint appears in the EndpointSlice.
    mesh.edit(
        "httpbin.yaml",
        "- addresses: [198.18.0.4]",
        "- addresses: [198.18.0.9]\n  conditions: {ready: true}\n- addresses: [198.18.0.4]",
    );
    wait_for(
        "Envoy to get the new endpoint",
        Duration::from_secs(15),
        || {
            let dump = mesh.config_dump().to_string();
            dump.contains("198.18.0.9").then_some(())
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        mesh.stat("cluster_manager.cds.update_success"),
        cds,
        "no new CDS"
    );
    assert_eq!(
        mesh.stat("listener_manager.lds.update_success"),
        lds,
        "no new LDS"
    );
    assert_eq!(mesh.route_updated("8000"), rds, "no new RDS");
    assert!(
        mesh.istiod.proc.log().contains("EDS: PUSH INC"),
        "istiod pushed incrementally"
    );
    assert_eq!(mesh.rejected(), 0);
}

#[test]
fn on_delta_an_edit_to_one_service_sends_only_its_resources() {
    let mesh = start();
    let modified = mesh.stat("cluster_manager.cluster_modified");
    let added = mesh.stat("cluster_manager.cluster_added");
    // httpbin's DestinationRule gets a load-balancing policy: only httpbin's
    // three clusters change.
    mesh.edit(
        "istio.yaml",
        "    tls:\n      mode: ISTIO_MUTUAL",
        "    loadBalancer:\n      simple: ROUND_ROBIN\n    tls:\n      mode: ISTIO_MUTUAL",
    );
    wait_for("Envoy to apply the change", Duration::from_secs(15), || {
        (mesh.stat("cluster_manager.cluster_modified") > modified).then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        mesh.stat("cluster_manager.cluster_modified") - modified,
        3,
        "only httpbin's clusters were sent"
    );
    assert_eq!(mesh.stat("cluster_manager.cluster_added"), added);
    let log = mesh.istiod.proc.log();
    assert!(
        log.lines()
            .any(|l| l.contains("CDS: PUSH for node:sleep-1.demo resources:3 removed:0")),
        "istiod sent exactly three clusters:\n{}",
        log.lines()
            .filter(|l| l.contains("CDS: PUSH"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(mesh.rejected(), 0);
}

/// An istiod whose mesh config sets fields it does not build does not start
/// half-configured: it exits naming each field, as does an agent whose
/// ProxyConfig does.
#[test]
fn mesh_and_proxy_config_fields_that_are_not_built_stop_the_binaries_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = dir.path().join("mesh");
    std::fs::write(
        &mesh,
        "h2UpgradePolicy: UPGRADE\ntrustDomainAliases: [old.example]\ndefaultConfig:\n  proxyHeaders: {server: {disabled: true}}\n",
    )
    .unwrap();
    let out = std::process::Command::new(tests::bin("istiod"))
        .args(["discovery", "--meshConfig"])
        .arg(&mesh)
        .args(["--grpcAddr", "", "--httpAddr", "", "--httpsAddr", ""])
        .args(["--monitoringAddr", "", "--secureGRPCAddr", ""])
        .output()
        .unwrap();
    // Both binaries log to standard output, as Istio's do.
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "istiod started: {log}");
    for field in [
        "h2UpgradePolicy: \"UPGRADE\" is not supported",
        "trustDomainAliases: [\"old.example\"] is not supported",
        "defaultConfig.proxyHeaders is not supported",
    ] {
        assert!(log.contains(field), "{field} missing from: {log}");
    }
    let out = std::process::Command::new(tests::bin("pilot-agent"))
        .args(["proxy", "sidecar"])
        .env("PROXY_CONFIG", "privateKeyProvider: {cryptomb: {}}\n")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "pilot-agent started: {log}");
    assert!(
        log.contains("PROXY_CONFIG: privateKeyProvider is not supported"),
        "{log}"
    );
}
