//! A real Envoy started by a test, with a bootstrap of the test's own.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::{Proc, envoy_bin, free_port, http_get, wait_for};

/// A running Envoy.
pub struct Envoy {
    /// The process.
    pub proc: Proc,
    /// The admin address.
    pub admin: SocketAddr,
}

impl Envoy {
    /// Starts Envoy in `dir` with `bootstrap` (YAML) and waits for its admin API.
    pub fn start(dir: &Path, bootstrap: &str) -> Envoy {
        let path = dir.join("envoy-test.yaml");
        std::fs::write(&path, bootstrap).unwrap();
        let admin_path = dir.join("envoy-admin-address");
        let _ = std::fs::remove_file(&admin_path);
        let mut cmd = Command::new(envoy_bin());
        cmd.current_dir(dir)
            .arg("-c")
            .arg(&path)
            .args(["--admin-address-path"])
            .arg(&admin_path)
            .args([
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                "warning",
            ]);
        let mut proc = Proc::spawn("envoy", cmd, &dir.join("envoy.log"));
        let admin: SocketAddr = wait_for("Envoy admin address", Duration::from_secs(30), || {
            assert!(proc.alive(), "Envoy exited:\n{}", proc.log());
            std::fs::read_to_string(&admin_path)
                .ok()?
                .trim()
                .parse()
                .ok()
        });
        wait_for("Envoy admin", Duration::from_secs(30), || {
            http_get(admin, "/ready").ok()
        });
        Envoy { proc, admin }
    }

    /// A counter or gauge from `/stats`.
    pub fn stat(&self, name: &str) -> Option<u64> {
        let (_, body) = http_get(self.admin, &format!("/stats?filter=^{name}$")).ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
    }
}

/// A bootstrap whose TLS listener on `port` takes `default` and `ROOTCA` from
/// the agent's SDS socket (as Istio's inbound listeners do) and answers
/// every request with `hello`.
pub fn sds_tls_bootstrap(port: u16, sds_socket: &Path) -> String {
    let admin_port = 0;
    let sds = r#"{resource_api_version: V3, api_config_source: {api_type: GRPC, transport_api_version: V3, grpc_services: [{envoy_grpc: {cluster_name: sds-grpc}}]}}"#;
    format!(
        r#"node: {{id: "sidecar~127.0.0.1~test.default~default.svc.cluster.local", cluster: test.default}}
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin_port}}}}}}}
static_resources:
  listeners:
  - name: tls
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: false
          common_tls_context:
            tls_certificate_sds_secret_configs: [{{name: default, sds_config: {sds}}}]
            validation_context_sds_secret_config: {{name: ROOTCA, sds_config: {sds}}}
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: tls
          http_filters: [{{name: envoy.filters.http.router, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: "/"}}, direct_response: {{status: 200, body: {{inline_string: "hello"}}}}}}]}}]
  clusters:
  - name: sds-grpc
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: sds-grpc
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{pipe: {{path: "{socket}"}}}}}}}}]}}]
"#,
        socket = sds_socket.display()
    )
}

/// A free port for a test listener.
pub fn listener_port() -> u16 {
    free_port()
}
