//! The README's first command, as a user runs it: the demo binary brings up
//! the local mesh and the ingress gateway, sleep calls httpbin over mTLS,
//! `curl` on the machine calls httpbin through the ingress, and the summary
//! says every request was answered with the identities the servers saw.

#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn the_demo_serves_the_mesh_and_the_ingress_with_no_failed_request() {
    let _serial = tests::mesh::one_mesh_at_a_time();
    let port = tests::free_port();
    let out = Command::new(tests::bin("demo"))
        .args(["--seconds", "3", "--ingress-port", &port.to_string()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let line = |prefix: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{stdout}"))
            .to_string()
    };
    let mesh = line("sleep -> httpbin");
    assert!(mesh.ends_with(", 0 failed"), "{mesh}");
    let ingress = line("machine -> ingress gateway -> httpbin");
    assert!(ingress.ends_with(", 0 failed"), "{ingress}");
    let answered: usize = ingress
        .split(": ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(answered > 0, "{ingress}");
    assert!(
        stdout
            .contains("(XFCC URI): spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway"),
        "httpbin saw the gateway's identity over mTLS:\n{stdout}"
    );
    assert!(
        stdout.contains("(XFCC URI): spiffe://cluster.local/ns/demo/sa/sleep"),
        "{stdout}"
    );
}
