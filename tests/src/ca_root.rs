//! istiod's CA root as a Pod would get it when istiod runs on the Kubernetes
//! API stand-in: read from the Secret the CA keeps it in (`istio-ca-secret`,
//! else the plug-in `cacerts`), through the API the kubeconfig names.

use std::net::SocketAddr;
use std::path::Path;

/// The API address a kubeconfig written by `KubeApi::kubeconfig` names.
fn api_addr(kubeconfig: &Path) -> Option<SocketAddr> {
    let text = std::fs::read_to_string(kubeconfig).ok()?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: http://"))
        .and_then(|a| a.trim().parse().ok())
}

/// `root-cert.pem` of `namespace/name`, if the Secret exists.
fn secret_root(
    addr: SocketAddr,
    netns: Option<&str>,
    namespace: &str,
    name: &str,
) -> Option<String> {
    use base64::Engine;
    let path = format!("/api/v1/namespaces/{namespace}/secrets/{name}");
    let (status, body) = crate::netns::run_in(netns, move || crate::http_get(addr, &path)).ok()?;
    if status != 200 {
        return None;
    }
    let secret: serde_json::Value = serde_json::from_str(&body).ok()?;
    let b64 = secret["data"]["root-cert.pem"].as_str()?;
    let pem = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    String::from_utf8(pem).ok()
}

/// The root bundle istiod in `istio-system` signs under, read from the API.
pub fn from_kube(kubeconfig: &Path, netns: Option<&str>) -> Option<String> {
    let addr = api_addr(kubeconfig)?;
    secret_root(addr, netns, "istio-system", "istio-ca-secret")
        .or_else(|| secret_root(addr, netns, "istio-system", "cacerts"))
}
