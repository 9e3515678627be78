//! Istio's `ValidateWorkloadGroup` and `validateReadinessProbe`.

use super::super::istio::{ReadinessProbe, WorkloadGroup};
use super::{Errors, check_port};

/// A WorkloadGroup: a template (without an address: each member's is its
/// proxy's IP), valid metadata labels, and a probe of one method.
pub(super) fn workload_group(wg: &WorkloadGroup, e: &mut Errors) {
    match &wg.template {
        None => e.add(
            "spec.template",
            "is required (give the WorkloadEntry every member gets, e.g. {serviceAccount: app})",
        ),
        Some(t) => {
            if !t.address.is_empty() {
                e.add(
                    "spec.template.address",
                    "must be empty (each member's address is the IP its proxy connects with)",
                );
            }
            if !t.network.is_empty() {
                e.add(
                    "spec.template.network",
                    "multi-network meshes are not supported by this istiod (leave network empty)",
                );
            }
            for (name, number) in &t.ports {
                check_port(&format!("spec.template.ports.{name}"), *number, e);
            }
            if t.weight == Some(0) {
                e.add(
                    "spec.template.weight",
                    "must be at least 1 (leave it out for the default weight)",
                );
            }
        }
    }
    if let Some(m) = &wg.metadata {
        for (k, v) in &m.labels {
            if let Err(reason) = check_label(k, v) {
                e.add(format!("spec.metadata.labels.{k}"), reason.to_string());
            }
        }
        for k in m.annotations.keys() {
            if check_qualified_name(k).is_err() {
                e.add(
                    format!("spec.metadata.annotations.{k}"),
                    "is not a valid annotation name (use [prefix/]name, the name of letters, digits, '-', '_' and '.')",
                );
            }
        }
    }
    if let Some(p) = &wg.probe {
        readiness_probe("spec.probe", p, e);
    }
}

/// Istio's `validateReadinessProbe`: thresholds and periods not negative,
/// and exactly one of `httpGet`, `tcpSocket`, `exec`.
pub(super) fn readiness_probe(field: &str, p: &ReadinessProbe, e: &mut Errors) {
    for (name, v) in [
        ("periodSeconds", p.period_seconds),
        ("initialDelaySeconds", p.initial_delay_seconds),
        ("timeoutSeconds", p.timeout_seconds),
        ("successThreshold", p.success_threshold),
        ("failureThreshold", p.failure_threshold),
    ] {
        if v < 0 {
            e.add(
                format!("{field}.{name}"),
                format!("{v} must be non-negative"),
            );
        }
    }
    let methods = [
        p.http_get.is_some(),
        p.tcp_socket.is_some(),
        p.exec.is_some(),
        p.grpc.is_some(),
    ]
    .into_iter()
    .filter(|m| *m)
    .count();
    if methods != 1 {
        e.add(
            field,
            "must have exactly one health check method (httpGet, tcpSocket or exec)",
        );
    }
    if p.grpc.is_some() {
        e.add(
            format!("{field}.grpc"),
            "is not a health check method Istio's validation accepts for a WorkloadGroup (use httpGet, tcpSocket or exec)",
        );
    }
    if let Some(h) = &p.http_get {
        check_port(&format!("{field}.httpGet.port"), h.port, e);
        if !h.scheme.is_empty() && h.scheme != "HTTP" && h.scheme != "HTTPS" {
            e.add(
                format!("{field}.httpGet.scheme"),
                format!("{:?} must be one of \"HTTPS\", \"HTTP\"", h.scheme),
            );
        } else if h.scheme == "HTTPS" {
            e.add(
                format!("{field}.httpGet.scheme"),
                "HTTPS probes are not built in this mesh's agent (use HTTP, tcpSocket or exec)",
            );
        }
        for (i, header) in h.http_headers.iter().enumerate() {
            if !is_header_name(&header.name) {
                e.add(
                    format!("{field}.httpGet.httpHeaders[{i}].name"),
                    format!("{:?} is not a valid header name", header.name),
                );
            }
        }
    }
    if let Some(t) = &p.tcp_socket {
        check_port(&format!("{field}.tcpSocket.port"), t.port, e);
    }
    if let Some(x) = &p.exec
        && x.command.is_empty()
    {
        e.add(format!("{field}.exec.command"), "is required");
    }
}

/// An HTTP token (Istio's `ValidateProbeHeaderName`).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Why a label is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum LabelError {
    /// The key is not `[prefix/]name`.
    #[error(
        "{0:?} is not a valid label key (use [prefix/]name, the name of at most 63 letters, digits, '-', '_' and '.')"
    )]
    Key(String),
    /// The value is not a label value.
    #[error(
        "{0:?} is not a valid label value (at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit)"
    )]
    Value(String),
}

/// Kubernetes' label rules (Istio's `labels.Instance.Validate`).
fn check_label(key: &str, value: &str) -> Result<(), LabelError> {
    check_qualified_name(key).map_err(|()| LabelError::Key(key.to_string()))?;
    if !value.is_empty() && !is_label_name(value) {
        return Err(LabelError::Value(value.to_string()));
    }
    Ok(())
}

fn check_qualified_name(key: &str) -> Result<(), ()> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 || !super::is_hostname(prefix) {
                return Err(());
            }
            name
        }
        None => key,
    };
    if is_label_name(name) { Ok(()) } else { Err(()) }
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

#[cfg(test)]
mod tests {
    use crate::model::parse_file;

    fn errors(spec: &str) -> Vec<String> {
        let yaml = format!(
            "apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata: {{name: vm, namespace: demo}}\nspec: {spec}\n"
        );
        match parse_file("wg.yaml", &yaml) {
            Ok(_) => Vec::new(),
            Err(e) => e.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn accepts_istio_samples() {
        assert_eq!(
            errors(
                "{metadata: {labels: {app: vm}, annotations: {a.io/x: y}}, template: {serviceAccount: vm, ports: {http: 8080}}, probe: {periodSeconds: 2, httpGet: {path: /ready, port: 8080, scheme: HTTP, httpHeaders: [{name: X-Probe, value: a}]}}}"
            ),
            Vec::<String>::new()
        );
        assert!(errors("{template: {}, probe: {tcpSocket: {port: 22}}}").is_empty());
        assert!(errors("{template: {}, probe: {exec: {command: [/bin/true]}}}").is_empty());
    }

    #[test]
    fn refuses_what_istio_refuses() {
        let all = |spec: &str| errors(spec).join("\n");
        assert!(all("{}").contains("spec.template"), "{}", all("{}"));
        let e = all("{template: {address: 10.0.0.1}}");
        assert!(e.contains("spec.template.address"), "{e}");
        let e = all("{template: {}, metadata: {labels: {'-bad': x}}}");
        assert!(e.contains("spec.metadata.labels.-bad"), "{e}");
        let e = all("{template: {}, probe: {periodSeconds: -1, httpGet: {port: 0, scheme: FTP}}}");
        assert!(e.contains("spec.probe.periodSeconds"), "{e}");
        assert!(e.contains("spec.probe.httpGet.port"), "{e}");
        assert!(e.contains("spec.probe.httpGet.scheme"), "{e}");
        let e = all("{template: {}, probe: {periodSeconds: 1}}");
        assert!(e.contains("exactly one health check method"), "{e}");
        let e = all("{template: {}, probe: {tcpSocket: {port: 1}, exec: {command: [x]}}}");
        assert!(e.contains("exactly one health check method"), "{e}");
        let e = all("{template: {}, probe: {exec: {command: []}}}");
        assert!(e.contains("spec.probe.exec.command"), "{e}");
        let e = all("{template: {}, probe: {httpGet: {port: 443, scheme: HTTPS}}}");
        assert!(e.contains("HTTPS probes are not built"), "{e}");
        let e = all("{template: {}, probe: {grpc: {port: 1}}}");
        assert!(e.contains("spec.probe.grpc"), "{e}");
    }
}
