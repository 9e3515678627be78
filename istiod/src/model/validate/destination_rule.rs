//! Validation of DestinationRule, with the rules of Istio's
//! `ValidateDestinationRule`, and refusals of the traffic policy parts this
//! istiod accepts in Istio's schema but cannot apply yet (each names the
//! field and says what to use instead).

use std::collections::BTreeSet;

use super::super::istio::{
    ClientTlsSettings, ConnectionPoolSettings, DestinationRule, LoadBalancerSettings,
    LocalityLbSetting, OutlierDetection, SimpleLb, TlsMode, TrafficPolicy,
};
use super::{
    Errors, check_export_to, check_host, check_min_duration, check_policy_selector, check_port,
    is_dns1123_label, non_negative,
};

pub(super) fn destination_rule(dr: &DestinationRule, namespace: &str, e: &mut Errors) {
    if dr.host.is_empty() {
        e.add(
            "spec.host",
            "is required (name the service the rule applies to, e.g. reviews)",
        );
    } else {
        check_host("spec.host", &dr.host, e);
    }
    if let Some(tp) = &dr.traffic_policy {
        traffic_policy("spec.trafficPolicy", tp, true, e);
    }
    let mut names = BTreeSet::new();
    for (i, subset) in dr.subsets.iter().enumerate() {
        let field = format!("spec.subsets[{i}]");
        if subset.name.is_empty() {
            e.add(
                format!("{field}.name"),
                "is required (name the subset, e.g. v1)",
            );
        } else if !is_dns1123_label(&subset.name) {
            e.add(
                format!("{field}.name"),
                format!(
                    "{:?} is not a valid subset name (use lower-case letters, digits and '-')",
                    subset.name
                ),
            );
        } else if !names.insert(subset.name.as_str()) {
            e.add(
                format!("{field}.name"),
                format!(
                    "subset {:?} is defined twice (give each subset a unique name)",
                    subset.name
                ),
            );
        }
        if let Some(tp) = &subset.traffic_policy {
            traffic_policy(&format!("{field}.trafficPolicy"), tp, true, e);
        }
    }
    check_export_to("spec.exportTo", &dr.export_to, e);
    match &dr.workload_selector {
        Some(sel) => {
            check_policy_selector("spec.workloadSelector", sel, e);
            // Istio's `validateExportTo` for a rule with a selector.
            if dr.export_to.iter().any(|ns| ns != "." && ns != namespace) {
                e.add(
                    "spec.exportTo",
                    "a DestinationRule with a workloadSelector applies to workloads of its own namespace only (use exportTo: [\".\"] or remove it)",
                );
            }
        }
        None => {
            for (field, tls) in client_tls_settings(dr) {
                if !tls.credential_name.is_empty() {
                    e.add(
                        format!("{field}.credentialName"),
                        "needs spec.workloadSelector: Istio gives a credentialName to the workloads a rule selects only (sidecars of other rules get no TLS from it); select the clients (sidecars or an egress gateway) that originate TLS with this Secret",
                    );
                }
            }
        }
    }
}

/// Every `tls` of a rule, with its field path.
fn client_tls_settings(dr: &DestinationRule) -> Vec<(String, &ClientTlsSettings)> {
    let policies = dr
        .traffic_policy
        .iter()
        .map(|tp| ("spec.trafficPolicy".to_string(), tp))
        .chain(dr.subsets.iter().enumerate().filter_map(|(i, s)| {
            let tp = s.traffic_policy.as_ref()?;
            Some((format!("spec.subsets[{i}].trafficPolicy"), tp))
        }));
    let mut out = Vec::new();
    for (field, tp) in policies {
        if let Some(tls) = &tp.tls {
            out.push((format!("{field}.tls"), tls));
        }
        for (i, p) in tp.port_level_settings.iter().enumerate() {
            if let Some(tls) = &p.tls {
                out.push((format!("{field}.portLevelSettings[{i}].tls"), tls));
            }
        }
    }
    out
}

fn traffic_policy(field: &str, tp: &TrafficPolicy, port_level: bool, e: &mut Errors) {
    if let Some(lb) = &tp.load_balancer {
        load_balancer(&format!("{field}.loadBalancer"), lb, e);
    }
    if let Some(cp) = &tp.connection_pool {
        connection_pool(&format!("{field}.connectionPool"), cp, e);
    }
    if let Some(od) = &tp.outlier_detection {
        outlier_detection(&format!("{field}.outlierDetection"), od, e);
    }
    if let Some(tls) = &tp.tls {
        client_tls(&format!("{field}.tls"), tls, e);
    }
    if tp.tunnel.is_some() {
        e.add(
            format!("{field}.tunnel"),
            "tunnelling (HTTP CONNECT) is not supported by this istiod (remove it)",
        );
    }
    if !port_level {
        return;
    }
    let mut ports = BTreeSet::new();
    for (i, p) in tp.port_level_settings.iter().enumerate() {
        let pf = format!("{field}.portLevelSettings[{i}]");
        match &p.port {
            None => e.add(
                format!("{pf}.port"),
                "is required (give the port number the settings apply to)",
            ),
            Some(port) => {
                check_port(&format!("{pf}.port.number"), port.number, e);
                if !ports.insert(port.number) {
                    e.add(
                        format!("{pf}.port.number"),
                        format!(
                            "port {} has settings twice (merge them into one entry)",
                            port.number
                        ),
                    );
                }
            }
        }
        if let Some(lb) = &p.load_balancer {
            load_balancer(&format!("{pf}.loadBalancer"), lb, e);
        }
        if let Some(cp) = &p.connection_pool {
            connection_pool(&format!("{pf}.connectionPool"), cp, e);
        }
        if let Some(od) = &p.outlier_detection {
            outlier_detection(&format!("{pf}.outlierDetection"), od, e);
        }
        if let Some(tls) = &p.tls {
            client_tls(&format!("{pf}.tls"), tls, e);
        }
    }
}

fn load_balancer(field: &str, lb: &LoadBalancerSettings, e: &mut Errors) {
    if lb.simple == Some(SimpleLb::Passthrough) {
        e.add(
            format!("{field}.simple"),
            "PASSTHROUGH (original destination) is not supported by this istiod (use LEAST_REQUEST, ROUND_ROBIN or RANDOM)",
        );
    }
    if let Some(l) = &lb.locality_lb_setting {
        locality_lb_setting(&format!("{field}.localityLbSetting"), l, e);
    }
    if let Some(w) = lb.warmup_duration_secs {
        check_min_duration(&format!("{field}.warmupDurationSecs"), w, e);
        if matches!(lb.simple, Some(SimpleLb::Random)) || lb.consistent_hash.is_some() {
            e.add(
                format!("{field}.warmupDurationSecs"),
                "slow start applies to ROUND_ROBIN and LEAST_REQUEST only (remove it or change simple)",
            );
        }
    }
    if lb.simple.is_some() && lb.consistent_hash.is_some() {
        e.add(
            field,
            "simple and consistentHash are mutually exclusive (keep one of them)",
        );
    }
    if let Some(ch) = &lb.consistent_hash {
        let keys = [
            ch.http_header_name.is_some(),
            ch.http_cookie.is_some(),
            ch.use_source_ip.is_some(),
            ch.http_query_parameter_name.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if keys != 1 {
            e.add(
                format!("{field}.consistentHash"),
                "exactly one of httpHeaderName, httpCookie, useSourceIp and httpQueryParameterName is required",
            );
        }
        if let Some(c) = &ch.http_cookie
            && c.name.is_empty()
        {
            e.add(
                format!("{field}.consistentHash.httpCookie.name"),
                "is required (name the cookie to hash on)",
            );
        }
        if let Some(size) = ch.maglev.as_ref().and_then(|m| m.table_size)
            && !is_prime(size)
        {
            e.add(
                format!("{field}.consistentHash.maglev.tableSize"),
                format!(
                    "{size} is not a prime number (Envoy requires a prime table size, e.g. 65537)"
                ),
            );
        }
        if ch.ring_hash.is_some() && ch.maglev.is_some() {
            e.add(
                format!("{field}.consistentHash"),
                "ringHash and maglev are mutually exclusive (keep one of them)",
            );
        }
    }
}

/// Istio's `ValidateLocalityLbSetting`, for a DestinationRule and for the
/// mesh config's `localityLbSetting`.
pub(super) fn locality_lb_setting(field: &str, l: &LocalityLbSetting, e: &mut Errors) {
    if !l.distribute.is_empty() && !l.failover.is_empty() {
        e.add(
            field,
            "can not simultaneously specify 'distribute' and 'failover' (keep one of them)",
        );
        return;
    }
    if !l.failover.is_empty() {
        for label in &l.failover_priority {
            if TOPOLOGY_LABELS.contains(&label.as_str()) {
                e.add(
                    format!("{field}.failoverPriority"),
                    format!("can not simultaneously set 'failover' and topology label {label:?} in 'failoverPriority'"),
                );
                return;
            }
        }
    }
    for (i, d) in l.distribute.iter().enumerate() {
        let df = format!("{field}.distribute[{i}]");
        check_locality(&format!("{df}.from"), &d.from, e);
        if d.to.values().any(|w| !(1..=100).contains(w)) {
            e.add(
                format!("{df}.to"),
                "locality weight must be in range [1, 100]",
            );
            continue;
        }
        let total: u32 = d.to.values().sum();
        if total != 100 {
            e.add(
                format!("{df}.to"),
                format!("total locality weight {total} != 100 (the weights are percentages)"),
            );
        }
        for loc in d.to.keys() {
            check_locality(&format!("{df}.to"), loc, e);
        }
    }
    for (i, f) in l.failover.iter().enumerate() {
        let ff = format!("{field}.failover[{i}]");
        if f.from == f.to {
            e.add(
                &ff,
                "locality lb failover settings must specify different regions",
            );
        }
        if f.from.contains('/') || f.to.contains('/') {
            e.add(&ff, "locality lb failover only specify region");
        }
        if f.from.contains('*') || f.to.contains('*') {
            e.add(
                &ff,
                "locality lb failover region should not contain '*' wildcard",
            );
        }
    }
}

/// Istio's topology labels, which `failover` already orders by.
const TOPOLOGY_LABELS: [&str; 3] = [
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.istio.io/subzone",
];

/// Istio's `validateLocalities`: `region/zone/subzone`, a `*` only as the
/// last part.
fn check_locality(field: &str, locality: &str, e: &mut Errors) {
    let parts: Vec<&str> = locality.split('/').collect();
    let bad = locality.is_empty()
        || parts.len() > 3
        || parts
            .iter()
            .enumerate()
            .any(|(i, p)| p.is_empty() || (p.contains('*') && (*p != "*" || i + 1 != parts.len())));
    if bad {
        e.add(
            field,
            format!("{locality:?} is not a locality (use region, region/zone or region/zone/subzone; '*' only as the last part)"),
        );
    }
}

fn is_prime(n: u64) -> bool {
    n >= 2
        && (2..)
            .take_while(|d| d * d <= n)
            .all(|d| !n.is_multiple_of(d))
}

pub(super) fn connection_pool(field: &str, cp: &ConnectionPoolSettings, e: &mut Errors) {
    if let Some(tcp) = &cp.tcp {
        non_negative(
            &format!("{field}.tcp.maxConnections"),
            tcp.max_connections,
            e,
        );
        if let Some(t) = tcp.connect_timeout {
            check_min_duration(&format!("{field}.tcp.connectTimeout"), t, e);
        }
        if tcp.idle_timeout.is_some() {
            e.add(
                format!("{field}.tcp.idleTimeout"),
                "is not supported by this istiod yet (use http.idleTimeout for HTTP ports)",
            );
        }
        if let Some(t) = tcp.max_connection_duration {
            check_min_duration(&format!("{field}.tcp.maxConnectionDuration"), t, e);
        }
    }
    if let Some(http) = &cp.http {
        for (name, v) in [
            ("http1MaxPendingRequests", http.http1_max_pending_requests),
            ("http2MaxRequests", http.http2_max_requests),
            ("maxRequestsPerConnection", http.max_requests_per_connection),
            ("maxRetries", http.max_retries),
            ("maxConcurrentStreams", http.max_concurrent_streams),
        ] {
            non_negative(&format!("{field}.http.{name}"), v, e);
        }
        if let Some(t) = http.idle_timeout {
            check_min_duration(&format!("{field}.http.idleTimeout"), t, e);
        }
    }
}

fn outlier_detection(field: &str, od: &OutlierDetection, e: &mut Errors) {
    for (name, v) in [
        ("maxEjectionPercent", od.max_ejection_percent),
        ("minHealthPercent", od.min_health_percent),
    ] {
        if let Some(v) = v
            && !(0..=100).contains(&v)
        {
            e.add(
                format!("{field}.{name}"),
                format!("{v} is out of range (use a percentage between 0 and 100)"),
            );
        }
    }
    for (name, v) in [
        ("interval", od.interval),
        ("baseEjectionTime", od.base_ejection_time),
    ] {
        if let Some(v) = v {
            check_min_duration(&format!("{field}.{name}"), v, e);
        }
    }
}

fn client_tls(field: &str, tls: &ClientTlsSettings, e: &mut Errors) {
    let credential = !tls.credential_name.is_empty();
    if credential {
        // The Secret holds the certificate, key and CA (Istio's
        // `validateTLS`: files and a credential are exclusive).
        for (name, value) in [
            ("clientCertificate", &tls.client_certificate),
            ("privateKey", &tls.private_key),
            ("caCertificates", &tls.ca_certificates),
            ("caCrl", &tls.ca_crl),
        ] {
            if !value.is_empty() {
                e.add(
                    format!("{field}.{name}"),
                    "cannot be set with credentialName: the Secret holds the client certificate, key and CA (remove one of them)",
                );
            }
        }
        if tls.credential_name.contains("://") && !tls.credential_name.starts_with("kubernetes://")
        {
            e.add(
                format!("{field}.credentialName"),
                format!(
                    "{:?}: this istiod serves Kubernetes Secrets only (name the Secret, or use kubernetes://<name>)",
                    tls.credential_name
                ),
            );
        }
        if !matches!(tls.mode, TlsMode::Simple | TlsMode::Mutual) {
            e.add(
                format!("{field}.credentialName"),
                "applies to SIMPLE and MUTUAL only (remove it, or set mode: SIMPLE or MUTUAL)",
            );
        }
    }
    let files = [
        ("clientCertificate", &tls.client_certificate),
        ("privateKey", &tls.private_key),
        ("caCertificates", &tls.ca_certificates),
        ("caCrl", &tls.ca_crl),
    ];
    match tls.mode {
        TlsMode::Mutual if credential => {}
        TlsMode::Mutual => {
            if tls.client_certificate.is_empty() {
                e.add(
                    format!("{field}.clientCertificate"),
                    "is required for MUTUAL (give the client certificate file)",
                );
            }
            if tls.private_key.is_empty() {
                e.add(
                    format!("{field}.privateKey"),
                    "is required for MUTUAL (give the client key file)",
                );
            }
        }
        TlsMode::Simple => {
            for (name, value) in &files[..2] {
                if !value.is_empty() {
                    e.add(
                        format!("{field}.{name}"),
                        "is only used with MUTUAL (remove it, or set mode: MUTUAL to present a client certificate)",
                    );
                }
            }
        }
        TlsMode::IstioMutual => {
            for (name, value) in &files {
                if !value.is_empty() {
                    e.add(
                        format!("{field}.{name}"),
                        "ISTIO_MUTUAL uses the workload's Istio certificate and the mesh root (remove it, or use MUTUAL)",
                    );
                }
            }
            if tls.insecure_skip_verify == Some(true) {
                e.add(
                    format!("{field}.insecureSkipVerify"),
                    "ISTIO_MUTUAL always verifies the peer's Istio identity (remove it, or use SIMPLE/MUTUAL)",
                );
            }
        }
        TlsMode::Disable => {
            let set = files.iter().any(|(_, v)| !v.is_empty())
                || !tls.sni.is_empty()
                || !tls.subject_alt_names.is_empty()
                || tls.insecure_skip_verify == Some(true);
            if set {
                e.add(
                    field,
                    "DISABLE sends plain text: remove the TLS settings, or set mode: SIMPLE or MUTUAL",
                );
            }
        }
    }
    if tls.insecure_skip_verify == Some(true) {
        for (name, value) in &files[2..] {
            if !value.is_empty() {
                e.add(
                    format!("{field}.{name}"),
                    "insecureSkipVerify disables server verification, so this file would not be used (remove one of them)",
                );
            }
        }
        if !tls.subject_alt_names.is_empty() {
            e.add(
                format!("{field}.subjectAltNames"),
                "insecureSkipVerify disables server verification, so these names would not be checked (remove one of them)",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support;

    const DR: &str = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: d, namespace: demo}\n";

    /// The errors for `spec`, as `field: message` strings.
    fn errors(spec: &str) -> Vec<String> {
        test_support::errors("mesh/dr.yaml", DR, spec)
    }

    #[track_caller]
    fn refused(spec: &str, field: &str, needle: &str) {
        test_support::refused(&errors(spec), field, needle);
    }

    #[test]
    fn tls_origination_is_accepted() {
        assert!(errors("{host: a, trafficPolicy: {tls: {mode: SIMPLE, caCertificates: /ca.pem, sni: a.example, subjectAltNames: [a.example]}}}").is_empty());
        assert!(errors("{host: a, trafficPolicy: {tls: {mode: MUTUAL, clientCertificate: /c.pem, privateKey: /k.pem}}}").is_empty());
    }

    #[test]
    fn credential_name_needs_a_workload_selector_at_every_level() {
        let msg = "needs spec.workloadSelector";
        refused(
            "{host: a, trafficPolicy: {tls: {mode: SIMPLE, credentialName: c}}}",
            "spec.trafficPolicy.tls.credentialName",
            msg,
        );
        refused(
            "{host: a, trafficPolicy: {portLevelSettings: [{port: {number: 443}, tls: {mode: SIMPLE, credentialName: c}}]}}",
            "spec.trafficPolicy.portLevelSettings[0].tls.credentialName",
            msg,
        );
        refused(
            "{host: a, subsets: [{name: v1, trafficPolicy: {tls: {mode: MUTUAL, credentialName: c}}}]}",
            "spec.subsets[0].trafficPolicy.tls.credentialName",
            msg,
        );
        let sel = "workloadSelector: {matchLabels: {app: sleep}}";
        for spec in [
            format!(
                "{{host: a, {sel}, trafficPolicy: {{tls: {{mode: MUTUAL, credentialName: c, sni: a}}}}}}"
            ),
            format!(
                "{{host: a, {sel}, exportTo: [.], trafficPolicy: {{tls: {{mode: SIMPLE, credentialName: kubernetes://c}}}}}}"
            ),
            format!(
                "{{host: a, {sel}, subsets: [{{name: v1, trafficPolicy: {{tls: {{mode: MUTUAL, credentialName: c}}}}}}]}}"
            ),
        ] {
            assert!(errors(&spec).is_empty(), "{spec}: {:?}", errors(&spec));
        }
        refused(
            &format!(
                "{{host: a, {sel}, trafficPolicy: {{tls: {{mode: MUTUAL, credentialName: c, clientCertificate: /c.pem}}}}}}"
            ),
            "spec.trafficPolicy.tls.clientCertificate",
            "cannot be set with credentialName",
        );
        refused(
            &format!(
                "{{host: a, {sel}, trafficPolicy: {{tls: {{mode: ISTIO_MUTUAL, credentialName: c}}}}}}"
            ),
            "spec.trafficPolicy.tls.credentialName",
            "SIMPLE and MUTUAL only",
        );
        refused(
            &format!(
                "{{host: a, {sel}, trafficPolicy: {{tls: {{mode: SIMPLE, credentialName: configmap://c}}}}}}"
            ),
            "spec.trafficPolicy.tls.credentialName",
            "Kubernetes Secrets only",
        );
    }

    #[test]
    fn a_workload_selector_keeps_the_rule_in_its_namespace() {
        assert!(errors("{host: a, workloadSelector: {matchLabels: {app: x}}}").is_empty());
        assert!(
            errors("{host: a, workloadSelector: {matchLabels: {app: x}}, exportTo: [demo]}")
                .is_empty()
        );
        refused(
            "{host: a, workloadSelector: {matchLabels: {app: x}}, exportTo: ['*']}",
            "spec.exportTo",
            "its own namespace only",
        );
        refused(
            "{host: a, workloadSelector: {matchLabels: {'': x}}}",
            "spec.workloadSelector.matchLabels",
            "cannot be empty",
        );
    }

    #[test]
    fn consistent_hash_locality_and_proxy_protocol_are_accepted() {
        for spec in [
            "{host: a, trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}}",
            "{host: a, trafficPolicy: {loadBalancer: {consistentHash: {httpCookie: {name: c, path: /, ttl: 10s}, ringHash: {minimumRingSize: 2048}}}}}",
            "{host: a, trafficPolicy: {loadBalancer: {consistentHash: {useSourceIp: true, maglev: {tableSize: 65537}}}}}",
            "{host: a, trafficPolicy: {loadBalancer: {consistentHash: {httpQueryParameterName: u, minimumRingSize: 64}}}}",
            "{host: a, trafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: r/z/*, to: {r/a: 80, r/b/*: 20}}]}}}}",
            "{host: a, trafficPolicy: {loadBalancer: {localityLbSetting: {failover: [{from: r, to: s}], failoverPriority: [version]}}, outlierDetection: {consecutive5xxErrors: 1}}}",
            "{host: a, trafficPolicy: {loadBalancer: {localityLbSetting: {enabled: false}}}}",
            "{host: a, trafficPolicy: {proxyProtocol: {version: V2}}}",
        ] {
            assert!(errors(spec).is_empty(), "{spec}: {:?}", errors(spec));
        }
    }

    #[test]
    fn tls_fields_a_mode_would_ignore_are_refused() {
        refused(
            "{host: a, trafficPolicy: {tls: {mode: MUTUAL, privateKey: /k.pem}}}",
            "spec.trafficPolicy.tls.clientCertificate",
            "is required for MUTUAL",
        );
        refused(
            "{host: a, trafficPolicy: {tls: {mode: SIMPLE, clientCertificate: /c.pem}}}",
            "spec.trafficPolicy.tls.clientCertificate",
            "only used with MUTUAL",
        );
        refused(
            "{host: a, trafficPolicy: {tls: {mode: ISTIO_MUTUAL, caCrl: /crl.pem}}}",
            "spec.trafficPolicy.tls.caCrl",
            "ISTIO_MUTUAL uses the workload's Istio certificate",
        );
        refused(
            "{host: a, trafficPolicy: {tls: {mode: SIMPLE, insecureSkipVerify: true, caCertificates: /ca.pem}}}",
            "spec.trafficPolicy.tls.caCertificates",
            "insecureSkipVerify disables server verification",
        );
        refused(
            "{host: a, trafficPolicy: {tls: {mode: DISABLE, sni: x}}}",
            "spec.trafficPolicy.tls",
            "DISABLE sends plain text",
        );
    }

    #[test]
    fn policy_parts_not_applied_are_refused() {
        for (spec, field, needle) in [
            (
                "{host: a, trafficPolicy: {tunnel: {protocol: CONNECT, targetHost: x, targetPort: 1}}}",
                "spec.trafficPolicy.tunnel",
                "not supported",
            ),
            (
                "{host: a, trafficPolicy: {loadBalancer: {simple: PASSTHROUGH}}}",
                "spec.trafficPolicy.loadBalancer.simple",
                "PASSTHROUGH",
            ),
            (
                "{host: a, trafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: r/z, to: {r/a: 60, r/b: 30}}]}}}}",
                "spec.trafficPolicy.loadBalancer.localityLbSetting.distribute[0].to",
                "total locality weight 90",
            ),
            (
                "{host: a, trafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: r/z, to: {r/a: 100}}], failover: [{from: r, to: s}]}}}}",
                "spec.trafficPolicy.loadBalancer.localityLbSetting",
                "'distribute' and 'failover'",
            ),
            (
                "{host: a, trafficPolicy: {loadBalancer: {localityLbSetting: {failover: [{from: r, to: r}]}}}}",
                "spec.trafficPolicy.loadBalancer.localityLbSetting.failover[0]",
                "different regions",
            ),
            (
                "{host: a, trafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: \"*/z\", to: {r: 100}}]}}}}",
                "spec.trafficPolicy.loadBalancer.localityLbSetting.distribute[0].from",
                "is not a locality",
            ),
            (
                "{host: a, trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x, maglev: {tableSize: 1000}}}}}",
                "spec.trafficPolicy.loadBalancer.consistentHash.maglev.tableSize",
                "not a prime",
            ),
            (
                "{host: a, trafficPolicy: {loadBalancer: {simple: RANDOM, warmupDurationSecs: 10s}}}",
                "spec.trafficPolicy.loadBalancer.warmupDurationSecs",
                "ROUND_ROBIN and LEAST_REQUEST",
            ),
            (
                "{host: a, trafficPolicy: {connectionPool: {tcp: {idleTimeout: 10s}}}}",
                "spec.trafficPolicy.connectionPool.tcp.idleTimeout",
                "not supported",
            ),
        ] {
            refused(spec, field, needle);
        }
    }
}
