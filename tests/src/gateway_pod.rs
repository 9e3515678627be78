//! A gateway Pod of the local mesh: `pilot-agent proxy router` with a real
//! Envoy in a network namespace of its own on the hub, without iptables
//! capture, as Istio's gateway Deployments run (`istio-ingressgateway`,
//! `istio-egressgateway`, or a Gateway API gateway).

use std::time::Duration;

use crate::mesh::{LocalMesh, MESH_PROXY_CONFIG, PodNet};
use crate::{PodDir, Proc};

/// What a gateway Pod is: its Kubernetes identity and labels.
#[derive(Debug, Clone)]
pub struct GatewaySpec<'a> {
    /// The Pod's name (`POD_NAME`), also its directory under the mesh's.
    pub name: &'a str,
    /// The Pod IP on the hub.
    pub ip: &'a str,
    /// Its Kubernetes namespace.
    pub namespace: &'a str,
    /// Its service account (its SPIFFE identity's `sa`).
    pub service_account: &'a str,
    /// Its labels (what Gateways select).
    pub labels: &'a [(&'a str, &'a str)],
}

impl GatewaySpec<'static> {
    /// Istio's default ingress gateway: `istio: ingressgateway` in
    /// `istio-system`, service account `istio-ingressgateway`.
    pub fn ingress(ip: &'static str) -> GatewaySpec<'static> {
        GatewaySpec {
            name: "istio-ingressgateway-1",
            ip,
            namespace: "istio-system",
            service_account: "istio-ingressgateway",
            labels: &[("istio", "ingressgateway"), ("app", "istio-ingressgateway")],
        }
    }

    /// The Pod Istio's automated deployment runs for the Gateway API
    /// `Gateway` `istio-system/ingress`: service account `ingress-istio`,
    /// labelled `gateway.networking.k8s.io/gateway-name: ingress` (what the
    /// Istio Gateways derived from it select).
    pub fn gateway_api_ingress(ip: &'static str) -> GatewaySpec<'static> {
        GatewaySpec {
            name: "ingress-istio-1",
            ip,
            namespace: "istio-system",
            service_account: "ingress-istio",
            labels: &[("gateway.networking.k8s.io/gateway-name", "ingress")],
        }
    }
}

/// A running gateway Pod.
pub struct GatewayPod {
    /// Its network.
    pub net: PodNet,
    /// Its filesystem.
    pub dir: PodDir,
    /// Its agent (and, below it, Envoy).
    pub agent: Proc,
}

impl GatewayPod {
    /// Panics with the agent's log when it has exited.
    pub fn assert_alive(&mut self) {
        assert!(
            self.agent.alive(),
            "the gateway's agent exited:\n{}",
            self.agent.log()
        );
    }

    /// Stops the agent (and its Envoy), waiting at most `limit`.
    pub fn stop(&mut self, limit: Duration) {
        self.agent.terminate(limit);
    }
}

impl LocalMesh {
    /// Starts a gateway Pod: its namespace on the hub, its token and root
    /// certificate, its labels, and `pilot-agent proxy router`. It does not
    /// wait: the caller polls what it expects the gateway to serve.
    pub fn start_gateway(&self, spec: &GatewaySpec<'_>) -> GatewayPod {
        self.start_gateway_with(spec, "")
    }

    /// [`LocalMesh::start_gateway`] with more ProxyConfig fields (JSON
    /// members, such as `"gatewayTopology": {...}`) over the mesh's.
    pub fn start_gateway_with(&self, spec: &GatewaySpec<'_>, proxy_config: &str) -> GatewayPod {
        let net = self.hub.pod("gw", spec.ip);
        let dir = PodDir::new(
            &self.dir.join(spec.name),
            &self.istiod.token(spec.namespace, spec.service_account),
            Some(&self.istiod.root_pem()),
        );
        dir.write_labels(spec.labels);
        let agent = dir.start_router_with(
            &net.ns,
            &[
                ("POD_NAME", spec.name),
                ("POD_NAMESPACE", spec.namespace),
                ("SERVICE_ACCOUNT", spec.service_account),
                ("INSTANCE_IP", spec.ip),
                ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
            ],
            &if proxy_config.is_empty() {
                MESH_PROXY_CONFIG.to_string()
            } else {
                format!("{MESH_PROXY_CONFIG}, {proxy_config}")
            },
        );
        GatewayPod { net, dir, agent }
    }

    /// The Gateway API status of `key` (`Kind/namespace/name`) as istiod's
    /// `/debug/configz` shows it under `gatewayApiStatus` (where the file
    /// source, which has no status to write, reports it): its lines as JSON.
    pub fn gateway_api_status(&self, key: &str) -> String {
        let http = self.istiod.http;
        let (_, body) = self
            .hub
            .ns
            .run(move || crate::http_get(http, "/debug/configz"))
            .unwrap();
        let configz: serde_json::Value = serde_json::from_str(&body).unwrap();
        configz["gatewayApiStatus"][key].to_string()
    }
}
