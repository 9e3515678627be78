use std::collections::HashMap;

use common::istio_stats::{
    Reporter, TAG_CLUSTER_SERVICES, TAG_UPSTREAM_LOCAL_PRINCIPAL, TAG_UPSTREAM_PEER_PRINCIPAL,
    TAG_UPSTREAM_WORKLOAD,
};
use prometheus::{Encoder, Registry, TextEncoder};
use proto::pb::envoy::data::accesslog::v3::tls_properties::CertificateProperties;
use proto::pb::envoy::data::accesslog::v3::tls_properties::certificate_properties::{
    SubjectAltName, subject_alt_name::San,
};
use proto::pb::envoy::data::accesslog::v3::{
    AccessLogCommon, AccessLogType, ConnectionProperties, HttpAccessLogEntry,
    HttpRequestProperties, HttpResponseProperties, ResponseFlags, TcpAccessLogEntry, TlsProperties,
};
use proto::pb::google::protobuf::{Duration, UInt32Value};

use super::*;

fn local() -> Peer {
    let meta = common::NodeMetadata::from_json_object(
        serde_json::json!({
            "NAMESPACE": "demo",
            "WORKLOAD_NAME": "sleep",
            "CLUSTER_ID": "Kubernetes",
            "LABELS": {"app": "sleep", "version": "v1"}
        })
        .as_object()
        .unwrap()
        .clone(),
    );
    Peer::local(&meta)
}

fn text(registry: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .unwrap();
    String::from_utf8(buf).unwrap()
}

/// The value of the series of `family` whose labels include every pair.
fn value(text: &str, family: &str, pairs: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .find(|l| {
            pairs
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn uri(u: &str) -> CertificateProperties {
    CertificateProperties {
        subject_alt_name: vec![SubjectAltName {
            san: Some(San::Uri(u.into())),
        }],
        ..Default::default()
    }
}

fn http_entry(code: u32, tags: &[(&str, &str)], cluster: &str) -> HttpAccessLogEntry {
    HttpAccessLogEntry {
        common_properties: Some(AccessLogCommon {
            upstream_cluster: cluster.into(),
            custom_tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
            duration: Some(Duration {
                seconds: 0,
                nanos: 7_000_000,
            }),
            access_log_type: AccessLogType::DownstreamEnd as i32,
            ..Default::default()
        }),
        request: Some(HttpRequestProperties {
            authority: "httpbin:8000".into(),
            request_headers_bytes: 100,
            ..Default::default()
        }),
        response: Some(HttpResponseProperties {
            response_code: Some(UInt32Value { value: code }),
            response_headers_bytes: 50,
            response_body_bytes: 20,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn source_requests_carry_the_local_workload_and_the_upstream_host() {
    let registry = Registry::new();
    let m = StandardMetrics::register(&registry, local()).unwrap();
    let tags = [
        (
            TAG_UPSTREAM_WORKLOAD,
            "httpbin-v1;demo;httpbin;v1;Kubernetes",
        ),
        (
            TAG_CLUSTER_SERVICES,
            r#"[{"host":"httpbin.demo.svc.cluster.local","name":"httpbin","namespace":"demo"}]"#,
        ),
        (
            TAG_UPSTREAM_PEER_PRINCIPAL,
            "spiffe://cluster.local/ns/demo/sa/httpbin",
        ),
        (
            TAG_UPSTREAM_LOCAL_PRINCIPAL,
            "spiffe://cluster.local/ns/demo/sa/sleep",
        ),
    ];
    let cluster = "outbound|8000|v1|httpbin.demo.svc.cluster.local";
    for _ in 0..3 {
        m.record_http(Reporter::Source, &http_entry(200, &tags, cluster));
    }
    m.record_http(Reporter::Source, &http_entry(503, &tags, cluster));
    let t = text(&registry);
    let want = [
        ("reporter", "source"),
        ("source_workload", "sleep"),
        ("source_workload_namespace", "demo"),
        ("source_app", "sleep"),
        ("source_version", "v1"),
        ("source_canonical_service", "sleep"),
        ("source_cluster", "Kubernetes"),
        (
            "source_principal",
            "spiffe://cluster.local/ns/demo/sa/sleep",
        ),
        ("destination_workload", "httpbin-v1"),
        ("destination_workload_namespace", "demo"),
        ("destination_app", "httpbin"),
        ("destination_version", "v1"),
        ("destination_canonical_revision", "v1"),
        (
            "destination_principal",
            "spiffe://cluster.local/ns/demo/sa/httpbin",
        ),
        ("destination_service", "httpbin.demo.svc.cluster.local"),
        ("destination_service_name", "httpbin"),
        ("destination_service_namespace", "demo"),
        ("request_protocol", "http"),
        ("response_code", "200"),
        ("grpc_response_status", ""),
        ("response_flags", "-"),
        ("connection_security_policy", "unknown"),
    ];
    assert_eq!(value(&t, "istio_requests_total", &want), Some(3.0), "{t}");
    assert_eq!(
        value(&t, "istio_requests_total", &[("response_code", "503")]),
        Some(1.0)
    );
    assert_eq!(
        value(
            &t,
            "istio_request_duration_milliseconds_count",
            &[("response_code", "200")]
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            &t,
            "istio_request_duration_milliseconds_bucket",
            &[("response_code", "200"), ("le", "5")]
        ),
        Some(0.0)
    );
    assert_eq!(
        value(
            &t,
            "istio_request_duration_milliseconds_bucket",
            &[("response_code", "200"), ("le", "10")]
        ),
        Some(3.0)
    );
    assert_eq!(
        value(&t, "istio_response_bytes_sum", &[("response_code", "200")]),
        Some(210.0)
    );
    assert_eq!(
        value(&t, "istio_request_bytes_sum", &[("response_code", "200")]),
        Some(300.0)
    );
    assert_eq!(t.matches("# TYPE istio_requests_total counter").count(), 1);
}

#[test]
fn destination_requests_name_the_peer_by_its_certificate() {
    let registry = Registry::new();
    let m = StandardMetrics::register(&registry, local()).unwrap();
    let mut e = http_entry(
        200,
        &[(
            TAG_CLUSTER_SERVICES,
            r#"[{"host":"sleep.demo.svc.cluster.local","name":"sleep","namespace":"demo"}]"#,
        )],
        "inbound|8080||",
    );
    e.common_properties.as_mut().unwrap().tls_properties = Some(TlsProperties {
        peer_certificate_properties: Some(uri("spiffe://cluster.local/ns/demo/sa/client")),
        local_certificate_properties: Some(uri("spiffe://cluster.local/ns/demo/sa/sleep")),
        ..Default::default()
    });
    m.record_http(Reporter::Destination, &e);
    // Plain text: no peer certificate.
    let plain = http_entry(200, &[], "inbound|8080||");
    m.record_http(Reporter::Destination, &plain);
    let t = text(&registry);
    let mtls = [
        ("reporter", "destination"),
        (
            "source_principal",
            "spiffe://cluster.local/ns/demo/sa/client",
        ),
        ("source_workload", "unknown"),
        ("source_workload_namespace", "unknown"),
        ("destination_workload", "sleep"),
        (
            "destination_principal",
            "spiffe://cluster.local/ns/demo/sa/sleep",
        ),
        ("destination_service", "sleep.demo.svc.cluster.local"),
        ("destination_service_name", "sleep"),
        ("connection_security_policy", "mutual_tls"),
    ];
    assert_eq!(value(&t, "istio_requests_total", &mtls), Some(1.0), "{t}");
    let none = [
        ("source_principal", "unknown"),
        ("connection_security_policy", "none"),
        ("destination_service", "httpbin"),
        ("destination_service_name", "inbound|8080||"),
    ];
    assert_eq!(value(&t, "istio_requests_total", &none), Some(1.0), "{t}");
}

#[test]
fn grpc_requests_and_response_flags() {
    let registry = Registry::new();
    let m = StandardMetrics::register(&registry, local()).unwrap();
    let mut e = http_entry(200, &[], "outbound|9000||grpc.demo.svc.cluster.local");
    e.request
        .as_mut()
        .unwrap()
        .request_headers
        .insert("content-type".into(), "application/grpc".into());
    e.response
        .as_mut()
        .unwrap()
        .response_trailers
        .insert("grpc-status".into(), "14".into());
    e.common_properties.as_mut().unwrap().response_flags = Some(ResponseFlags {
        no_healthy_upstream: true,
        upstream_retry_limit_exceeded: true,
        ..Default::default()
    });
    m.record_http(Reporter::Source, &e);
    // Periodic entries are not requests.
    let mut periodic = http_entry(200, &[], "x");
    periodic.common_properties.as_mut().unwrap().access_log_type =
        AccessLogType::DownstreamPeriodic as i32;
    m.record_http(Reporter::Source, &periodic);
    let t = text(&registry);
    let want = [
        ("request_protocol", "grpc"),
        ("grpc_response_status", "14"),
        ("response_flags", "UH,URX"),
        ("destination_service", "grpc.demo.svc.cluster.local"),
        ("destination_service_name", "grpc"),
        ("destination_service_namespace", "demo"),
        ("destination_workload", "unknown"),
    ];
    assert_eq!(value(&t, "istio_requests_total", &want), Some(1.0), "{t}");
    assert_eq!(
        t.lines()
            .filter(|l| l.starts_with("istio_requests_total{"))
            .count(),
        1
    );
}

fn tcp_entry(kind: AccessLogType, received: u64, sent: u64) -> TcpAccessLogEntry {
    TcpAccessLogEntry {
        common_properties: Some(AccessLogCommon {
            upstream_cluster: "outbound|9000||echo.demo.svc.cluster.local".into(),
            stream_id: "conn-1".into(),
            access_log_type: kind as i32,
            ..Default::default()
        }),
        connection_properties: Some(ConnectionProperties {
            received_bytes: received,
            sent_bytes: sent,
        }),
    }
}

#[test]
fn tcp_connections_count_opens_closes_and_byte_deltas() {
    let registry = Registry::new();
    let m = StandardMetrics::register(&registry, local()).unwrap();
    m.record_tcp(
        Reporter::Source,
        &tcp_entry(AccessLogType::TcpUpstreamConnected, 0, 0),
    );
    m.record_tcp(
        Reporter::Source,
        &tcp_entry(AccessLogType::TcpPeriodic, 10, 4),
    );
    m.record_tcp(
        Reporter::Source,
        &tcp_entry(AccessLogType::TcpConnectionEnd, 25, 9),
    );
    // A connection still looking for its upstream reports nothing yet; one
    // that never reached it is counted by its only entry, at its end.
    let mut early = tcp_entry(AccessLogType::TcpPeriodic, 3, 0);
    early.common_properties.as_mut().unwrap().stream_id = "conn-2".into();
    early.common_properties.as_mut().unwrap().upstream_cluster = String::new();
    m.record_tcp(Reporter::Source, &early);
    let mut failed = tcp_entry(AccessLogType::TcpConnectionEnd, 3, 0);
    failed.common_properties.as_mut().unwrap().stream_id = "conn-2".into();
    m.record_tcp(Reporter::Source, &failed);
    let t = text(&registry);
    let l = [
        ("request_protocol", "tcp"),
        ("destination_service", "echo.demo.svc.cluster.local"),
        ("reporter", "source"),
    ];
    assert_eq!(
        value(&t, "istio_tcp_connections_opened_total", &l),
        Some(2.0),
        "{t}"
    );
    assert_eq!(
        value(&t, "istio_tcp_connections_closed_total", &l),
        Some(2.0)
    );
    assert_eq!(value(&t, "istio_tcp_received_bytes_total", &l), Some(28.0));
    assert_eq!(value(&t, "istio_tcp_sent_bytes_total", &l), Some(9.0));
    assert!(!t.contains("response_code"), "{t}");
    assert!(!t.contains("destination_service=\"unknown\""), "{t}");
    assert!(m.lock().connections.is_empty());
}

#[test]
fn series_beyond_the_cap_are_dropped() {
    let registry = Registry::new();
    let m = StandardMetrics::register(&registry, local()).unwrap();
    for code in 0..(MAX_SERIES as u32 + 5) {
        m.record_http(Reporter::Source, &http_entry(code, &[], "x"));
    }
    let t = text(&registry);
    let series = t
        .lines()
        .filter(|l| l.starts_with("istio_requests_total{"))
        .count();
    assert_eq!(series, MAX_SERIES);
}
