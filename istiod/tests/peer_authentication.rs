//! PeerAuthentication resolved as Istio resolves it: mesh-wide (root
//! namespace), namespace-wide and workload policies, each overriding the
//! broader one only where its mode is set; port-level modes from the
//! workload's policy only; the oldest policy winning a conflict; and the
//! mode clients infer for a service (auto mTLS).

#![allow(clippy::unwrap_used)]

mod shapes;

use istiod::model::istio::MtlsMode;
use shapes::*;

fn pa(namespace: &str, name: &str, created: Option<&str>, spec: &str) -> String {
    let created = created
        .map(|c| format!(", creationTimestamp: \"{c}\""))
        .unwrap_or_default();
    format!(
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: {name}, namespace: {namespace}{created}}}\nspec: {spec}\n---\n"
    )
}

fn mode(policies: &str, port: u16) -> MtlsMode {
    ctx(policies).mtls_mode(&httpbin(), port)
}

#[test]
fn istios_default_is_permissive() {
    assert_eq!(mode("", 8080), MtlsMode::Permissive);
}

#[test]
fn each_level_overrides_the_broader_one_where_it_is_set() {
    let mesh = pa("istio-system", "default", None, "{mtls: {mode: STRICT}}");
    assert_eq!(mode(&mesh, 8080), MtlsMode::Strict);

    let namespace = pa("demo", "default", None, "{mtls: {mode: DISABLE}}");
    assert_eq!(mode(&format!("{mesh}{namespace}"), 8080), MtlsMode::Disable);

    // A namespace policy whose mode is UNSET inherits the mesh's.
    let unset = pa("demo", "default", None, "{mtls: {mode: UNSET}}");
    assert_eq!(mode(&format!("{mesh}{unset}"), 8080), MtlsMode::Strict);

    let workload = pa(
        "demo",
        "httpbin",
        None,
        "{selector: {matchLabels: {app: httpbin}}, mtls: {mode: PERMISSIVE}}",
    );
    assert_eq!(
        mode(&format!("{mesh}{namespace}{workload}"), 8080),
        MtlsMode::Permissive
    );
    // A workload policy without a mode inherits the namespace's.
    let bare = pa(
        "demo",
        "httpbin",
        None,
        "{selector: {matchLabels: {app: httpbin}}}",
    );
    assert_eq!(
        mode(&format!("{mesh}{namespace}{bare}"), 8080),
        MtlsMode::Disable
    );
}

#[test]
fn policies_elsewhere_or_for_other_workloads_do_not_apply() {
    let other_ns = pa("other", "default", None, "{mtls: {mode: STRICT}}");
    let other_workload = pa(
        "demo",
        "sleep",
        None,
        "{selector: {matchLabels: {app: sleep}}, mtls: {mode: STRICT}}",
    );
    // A selector in the root namespace picks workloads of the root
    // namespace only: it is not mesh-wide.
    let root_selector = pa(
        "istio-system",
        "httpbin",
        None,
        "{selector: {matchLabels: {app: httpbin}}, mtls: {mode: STRICT}}",
    );
    assert_eq!(
        mode(&format!("{other_ns}{other_workload}{root_selector}"), 8080),
        MtlsMode::Permissive
    );
}

#[test]
fn an_empty_selector_is_namespace_wide() {
    let empty = pa("demo", "a", None, "{selector: {}, mtls: {mode: STRICT}}");
    assert_eq!(mode(&empty, 8080), MtlsMode::Strict);
    // Namespace-wide, so it does not hide a workload policy either.
    let workload = pa(
        "demo",
        "b",
        None,
        "{selector: {matchLabels: {app: httpbin}}, mtls: {mode: DISABLE}}",
    );
    assert_eq!(mode(&format!("{empty}{workload}"), 8080), MtlsMode::Disable);
}

#[test]
fn port_level_modes_come_from_the_workload_policy_and_inherit_when_unset() {
    let namespace = pa("demo", "default", None, "{mtls: {mode: STRICT}}");
    let workload = pa(
        "demo",
        "httpbin",
        None,
        "{selector: {matchLabels: {app: httpbin}}, portLevelMtls: {8080: {mode: DISABLE}, 9000: {mode: UNSET}}}",
    );
    let policies = format!("{namespace}{workload}");
    assert_eq!(mode(&policies, 8080), MtlsMode::Disable);
    // UNSET on a port inherits the workload's mode, itself the namespace's.
    assert_eq!(mode(&policies, 9000), MtlsMode::Strict);
    assert_eq!(mode(&policies, 7070), MtlsMode::Strict);
    assert_eq!(
        ctx(&policies).port_level_mtls_ports(&httpbin()),
        vec![8080, 9000]
    );
}

#[test]
fn the_oldest_policy_wins_a_conflict() {
    let newer = pa(
        "demo",
        "a-newer",
        Some("2026-02-01T00:00:00Z"),
        "{mtls: {mode: DISABLE}}",
    );
    let older = pa(
        "demo",
        "z-older",
        Some("2026-01-01T00:00:00Z"),
        "{mtls: {mode: STRICT}}",
    );
    assert_eq!(mode(&format!("{newer}{older}"), 8080), MtlsMode::Strict);
    let newer_wl = pa(
        "demo",
        "a-newer-wl",
        Some("2026-02-01T00:00:00Z"),
        "{selector: {matchLabels: {app: httpbin}}, mtls: {mode: PERMISSIVE}}",
    );
    let older_wl = pa(
        "demo",
        "z-older-wl",
        Some("2026-01-01T00:00:00Z"),
        "{selector: {matchLabels: {version: v1}}, mtls: {mode: DISABLE}}",
    );
    assert_eq!(
        mode(&format!("{newer_wl}{older_wl}"), 8080),
        MtlsMode::Disable
    );
}

#[test]
fn clients_infer_the_service_mode_unless_a_workload_policy_could_change_it() {
    let svc = |policies: &str| {
        let ctx = ctx(policies);
        let svc = ctx
            .registry
            .by_hostname("httpbin.demo.svc.cluster.local")
            .next()
            .unwrap()
            .clone();
        ctx.service_mtls_mode(&svc)
    };
    assert_eq!(svc(""), Some(MtlsMode::Permissive));
    let mesh = pa("istio-system", "default", None, "{mtls: {mode: DISABLE}}");
    assert_eq!(svc(&mesh), Some(MtlsMode::Disable));
    let namespace = pa("demo", "default", None, "{mtls: {mode: STRICT}}");
    assert_eq!(svc(&format!("{mesh}{namespace}")), Some(MtlsMode::Strict));
    let workload = pa(
        "demo",
        "httpbin",
        None,
        "{selector: {matchLabels: {app: httpbin}}, mtls: {mode: DISABLE}}",
    );
    assert_eq!(svc(&format!("{namespace}{workload}")), None);
}
