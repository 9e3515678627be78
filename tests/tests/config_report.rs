//! Configuration istiod cannot apply is never dropped out of sight: a file
//! holding Istio kinds that this istiod does not implement is named, with
//! the kind, in istiod's log, in `/debug/configz` and in Istio's
//! `pilot_total_rejected_configs`, while the objects it can apply serve.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tests::netns::Netns;
use tests::{Istiod, http_get, wait_for};

const WAIT: Duration = Duration::from_secs(30);

/// A Gateway API kind (experimental channel) this istiod does not read
/// (yet): an XBackendTrafficPolicy.
const BACKEND_TRAFFIC_POLICY: &str = r#"apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackendTrafficPolicy
metadata: {name: retry-budget, namespace: demo}
spec:
  targetRefs: [{group: "", kind: Service, name: httpbin}]
  retryConstraint: {budget: {percent: 20}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: applied, namespace: demo}
spec:
  hosts: [applied.example.com]
  http:
  - route:
    - destination: {host: applied.example.com}
"#;

const WASM_PLUGIN: &str = r#"apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: tweak, namespace: demo}
spec:
  url: oci://example.com/filter:1
"#;

fn configz(http: SocketAddr) -> Value {
    let (code, body) = http_get(http, "/debug/configz").unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn rejected_count(monitoring: SocketAddr, kind: &str, file: &str) -> Option<u64> {
    let (_, body) = http_get(monitoring, "/metrics").ok()?;
    body.lines().find_map(|l| {
        let rest = l.strip_prefix("pilot_total_rejected_configs{")?;
        let (labels, value) = rest.split_once("} ")?;
        (labels.contains(&format!("name=\"{file}\""))
            && labels.contains(&format!("type=\"{kind}\"")))
        .then(|| value.trim().parse().ok())?
    })
}

#[test]
fn unimplemented_kinds_are_reported_by_file_and_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config");
    std::fs::create_dir_all(&config).unwrap();
    let group_file = config.join("backend-traffic-policy.yaml");
    std::fs::write(&group_file, BACKEND_TRAFFIC_POLICY).unwrap();
    let ns = Netns::new("report");
    let istiod = Istiod::start_with_config(&ns, &tmp.path().join("istiod"), &config, &[]);
    let (http, monitoring) = (istiod.http, istiod.monitoring);

    // At start: the XBackendTrafficPolicy is listed with its file; the VirtualService
    // beside it is applied.
    let group_path = group_file.display().to_string();
    let path = group_path.clone();
    ns.run(move || {
        let c = configz(http);
        assert_eq!(
            c["unimplemented"],
            serde_json::json!([{"file": path, "apiVersion": "gateway.networking.x-k8s.io/v1alpha1", "kind": "XBackendTrafficPolicy"}]),
            "{c}"
        );
        assert!(
            c["objects"]
                .as_array()
                .unwrap()
                .contains(&Value::from("VirtualService/demo/applied")),
            "{c}"
        );
        assert_eq!(rejected_count(monitoring, "XBackendTrafficPolicy", &path), Some(1));
    });
    let log = istiod.proc.log();
    assert!(
        log.lines().any(|l| l.contains(&group_path)
            && l.contains("XBackendTrafficPolicy")
            && l.contains("warn")),
        "istiod's log names the file and the kind:\n{log}"
    );

    // A file added while istiod runs is reported the same way.
    let filter_file = config.join("filter.yaml");
    std::fs::write(&filter_file, WASM_PLUGIN).unwrap();
    let filter_path = filter_file.display().to_string();
    ns.run(move || {
        wait_for("the WasmPlugin reported in configz", WAIT, || {
            let c = configz(http);
            c["unimplemented"]
                .as_array()
                .unwrap()
                .iter()
                .any(|u| u["file"] == filter_path.as_str() && u["kind"] == "WasmPlugin")
                .then_some(())
        });
        assert_eq!(
            rejected_count(monitoring, "WasmPlugin", &filter_path),
            Some(1)
        );
    });

    // Removing the file clears it from configz.
    std::fs::remove_file(&group_file).unwrap();
    ns.run(move || {
        wait_for(
            "the removed XBackendTrafficPolicy file gone from configz",
            WAIT,
            || {
                let c = configz(http);
                (c["unimplemented"].as_array().unwrap().len() == 1).then_some(())
            },
        )
    });
}
