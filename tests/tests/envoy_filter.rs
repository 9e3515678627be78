//! EnvoyFilter patches reaching real Envoys in the local mesh (sleep ->
//! httpbin in namespace demo), as a client observes them: a virtual host
//! MERGE adding a response header for one workload only, a Lua filter
//! inserted before the router answering with its header, a removed
//! cluster failing requests with Envoy's no-cluster 503, and a patch that
//! fails at generation reported on istiod's metrics while the rest of the
//! config still reaches Envoy.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use tests::mesh::LocalMesh;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    tests::mesh::one_mesh_at_a_time()
}

const HTTPBIN: &str = "http://httpbin.demo.svc.cluster.local:8000";
const WAIT: Duration = Duration::from_secs(30);

/// Writes `file` in istiod's config directory in one rename.
fn write_config(mesh: &LocalMesh, file: &str, text: &str) {
    let tmp = mesh.config_dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, mesh.config_dir.join(file)).unwrap();
}

/// The value of response header `name` in curl's `-i` output.
fn response_header(out: &str, name: &str) -> Option<String> {
    let head = out.split("\r\n\r\n").next().unwrap_or_default();
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// A GET of httpbin from Pod `pod` with the response head: (status, head+body).
fn get_httpbin(mesh: &LocalMesh, pod: &str) -> Option<(u16, String)> {
    mesh.app_curl_with(pod, &["-i"], &format!("{HTTPBIN}/headers"))
        .ok()
}

/// istiod's `/metrics` text.
fn istiod_metrics(mesh: &LocalMesh) -> String {
    let monitoring = mesh.istiod.monitoring;
    mesh.hub
        .ns
        .run(move || tests::http_get(monitoring, "/metrics"))
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// A text page of a Pod's Envoy admin.
fn envoy_admin(mesh: &LocalMesh, pod: &str, path: &'static str) -> String {
    mesh.pod(pod).ns.run(move || {
        tests::http_get(SocketAddr::from(([127, 0, 0, 1], 15000)), path)
            .map(|(_, body)| body)
            .unwrap_or_default()
    })
}

const VHOST_HEADER: &str = r#"apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: vhost-header, namespace: demo}
spec:
  workloadSelector: {labels: {app: sleep}}
  configPatches:
  - applyTo: VIRTUAL_HOST
    match:
      context: SIDECAR_OUTBOUND
      routeConfiguration:
        portNumber: 8000
        vhost: {name: "httpbin.demo.svc.cluster.local:8000"}
    patch:
      operation: MERGE
      value:
        response_headers_to_add:
        - header: {key: x-envoy-filter, value: vhost-merge}
"#;

const LUA: &str = r#"apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: lua, namespace: demo}
spec:
  workloadSelector: {labels: {app: sleep}}
  priority: 10
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener:
        portNumber: 8000
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {name: envoy.filters.http.router}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          default_source_code:
            inline_string: |
              function envoy_on_response(response_handle)
                response_handle:headers():add("x-lua", "inserted-before-router")
              end
"#;

/// Valid when read (the value is a Filter), broken when applied: the
/// typed_config is a TcpProxy merged into the HTTP connection manager. Its
/// second patch is fine and must still reach Envoy.
const BROKEN: &str = r#"apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: broken, namespace: demo}
spec:
  workloadSelector: {labels: {app: sleep}}
  configPatches:
  - applyTo: NETWORK_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener:
        portNumber: 8000
        filterChain: {filter: {name: envoy.filters.network.http_connection_manager}}
    patch:
      operation: MERGE
      value:
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: not-an-hcm
          cluster: BlackHoleCluster
  - applyTo: HTTP_ROUTE
    match:
      context: SIDECAR_OUTBOUND
      routeConfiguration:
        portNumber: 8000
        vhost: {name: "httpbin.demo.svc.cluster.local:8000", route: {action: ROUTE}}
    patch:
      operation: MERGE
      value:
        response_headers_to_add:
        - header: {key: x-after-broken, value: still-applied}
"#;

#[test]
fn merge_and_insert_reach_one_workload_and_a_broken_patch_is_reported() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);

    // VIRTUAL_HOST MERGE for app=sleep: sleep's responses carry the header.
    write_config(&mesh, "ef-vhost.yaml", VHOST_HEADER);
    let (code, out) = tests::wait_for("the vhost header at sleep", WAIT, || {
        get_httpbin(&mesh, "sleep-1")
            .filter(|(_, out)| response_header(out, "x-envoy-filter").is_some())
    });
    assert_eq!(code, 200, "{out}");
    assert_eq!(
        response_header(&out, "x-envoy-filter").as_deref(),
        Some("vhost-merge")
    );
    // Another client of the same service (httpbin-v1's sidecar) is not
    // selected: its responses come without it.
    let (code, out) = get_httpbin(&mesh, "httpbin-v1").unwrap();
    assert_eq!(code, 200, "{out}");
    assert_eq!(response_header(&out, "x-envoy-filter"), None, "{out}");

    // INSERT_BEFORE the router: the Lua filter answers with its header.
    write_config(&mesh, "ef-lua.yaml", LUA);
    let (_, out) = tests::wait_for("the Lua filter's header at sleep", WAIT, || {
        get_httpbin(&mesh, "sleep-1")
            .filter(|(c, out)| *c == 200 && response_header(out, "x-lua").is_some())
    });
    assert_eq!(
        response_header(&out, "x-lua").as_deref(),
        Some("inserted-before-router")
    );
    assert_eq!(
        response_header(&out, "x-envoy-filter").as_deref(),
        Some("vhost-merge")
    );
    let (_, out) = get_httpbin(&mesh, "httpbin-v1").unwrap();
    assert_eq!(response_header(&out, "x-lua"), None, "{out}");

    // A patch that fails at generation: reported on istiod's metrics, and
    // the rest (its own good patch, the other filters) still reaches Envoy.
    write_config(&mesh, "ef-broken.yaml", BROKEN);
    let error =
        r#"pilot_envoy_filter_status{name="demo/broken",patch="networkfilter",result="error"} 1"#;
    tests::wait_for("the broken patch on istiod's metrics", WAIT, || {
        istiod_metrics(&mesh).contains(error).then_some(())
    });
    let (code, out) = tests::wait_for("the broken filter's good patch at sleep", WAIT, || {
        get_httpbin(&mesh, "sleep-1")
            .filter(|(_, out)| response_header(out, "x-after-broken").is_some())
    });
    assert_eq!(code, 200, "{out}");
    assert!(response_header(&out, "x-lua").is_some(), "{out}");
    assert!(response_header(&out, "x-envoy-filter").is_some(), "{out}");
    let metrics = istiod_metrics(&mesh);
    for applied in [
        r#"pilot_envoy_filter_status{name="demo/vhost-header",patch="vhost",result="applied"} 1"#,
        r#"pilot_envoy_filter_status{name="demo/lua",patch="httpfilter",result="applied"} 1"#,
        r#"pilot_envoy_filter_status{name="demo/broken",patch="route",result="applied"} 1"#,
    ] {
        assert!(metrics.contains(applied), "{applied} in:\n{metrics}");
    }
    // Envoy accepted every listener update (none rejected since the start).
    let stats = envoy_admin(&mesh, "sleep-1", "/stats");
    for l in stats
        .lines()
        .filter(|l| l.contains("lds.update_rejected: "))
    {
        assert!(l.ends_with(": 0"), "{l}");
    }
}

const REMOVE_CLUSTERS: &str = r#"apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: no-httpbin, namespace: demo}
spec:
  workloadSelector: {labels: {app: sleep}}
  configPatches:
  - applyTo: CLUSTER
    match:
      context: SIDECAR_OUTBOUND
      cluster: {service: httpbin.demo.svc.cluster.local, portNumber: 8000}
    patch: {operation: REMOVE}
"#;

/// The sum of the router's `no_cluster` counters in a Pod's Envoy.
fn no_cluster(mesh: &LocalMesh, pod: &str) -> u64 {
    envoy_admin(mesh, pod, "/stats")
        .lines()
        .filter_map(|l| l.split_once(".no_cluster: "))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

#[test]
fn cluster_remove_fails_requests_with_no_cluster_until_the_filter_goes() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start(tmp.path(), &[]);
    let v1 = "outbound|8000|v1|httpbin.demo.svc.cluster.local";
    tests::wait_for("200 from httpbin", WAIT, || {
        get_httpbin(&mesh, "sleep-1").filter(|(c, _)| *c == 200)
    });
    assert!(envoy_admin(&mesh, "sleep-1", "/clusters").contains(v1));

    write_config(&mesh, "ef-remove.yaml", REMOVE_CLUSTERS);
    tests::wait_for("httpbin's clusters gone from sleep's Envoy", WAIT, || {
        let clusters = envoy_admin(&mesh, "sleep-1", "/clusters");
        (!clusters.is_empty() && !clusters.contains("|httpbin.demo.svc.cluster.local"))
            .then_some(())
    });
    let dump = envoy_admin(
        &mesh,
        "sleep-1",
        "/config_dump?resource=dynamic_active_clusters",
    );
    assert!(!dump.contains(v1), "{dump}");
    let before = no_cluster(&mesh, "sleep-1");
    for _ in 0..3 {
        let (code, out) = get_httpbin(&mesh, "sleep-1").unwrap();
        assert_eq!(code, 503, "{out}");
    }
    // Envoy's router counted the requests as routed to no cluster.
    assert_eq!(no_cluster(&mesh, "sleep-1"), before + 3);
    // httpbin-v1's sidecar is not selected: it still reaches httpbin.
    let (code, out) = get_httpbin(&mesh, "httpbin-v1").unwrap();
    assert_eq!(code, 200, "{out}");

    // Deleting the EnvoyFilter pushes the clusters back.
    std::fs::remove_file(mesh.config_dir.join("ef-remove.yaml")).unwrap();
    tests::wait_for("200 from httpbin again", WAIT, || {
        get_httpbin(&mesh, "sleep-1").filter(|(c, _)| *c == 200)
    });
}

#[test]
fn envoy_filters_are_read_from_kubernetes() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let mesh = LocalMesh::start_kube(tmp.path());
    let api = mesh.kube_api.as_ref().unwrap();
    tests::wait_for("200 from httpbin", WAIT, || {
        get_httpbin(&mesh, "sleep-1").filter(|(c, _)| *c == 200)
    });
    let filter: serde_json::Value = serde_yaml_ng::from_str(REMOVE_CLUSTERS).unwrap();
    api.create(filter).unwrap();
    let (code, out) = tests::wait_for("503 at sleep once the filter is watched", WAIT, || {
        get_httpbin(&mesh, "sleep-1").filter(|(c, _)| *c == 503)
    });
    assert_eq!(code, 503, "{out}");
    let (code, out) = get_httpbin(&mesh, "httpbin-v1").unwrap();
    assert_eq!(code, 200, "{out}");
    api.delete(
        "networking.istio.io/v1alpha3",
        "EnvoyFilter",
        "demo",
        "no-httpbin",
    )
    .unwrap();
    tests::wait_for("200 from httpbin after the delete", WAIT, || {
        get_httpbin(&mesh, "sleep-1").filter(|(c, _)| *c == 200)
    });
}
