//! A DestinationRule's traffic policy for one cluster, as Istio's
//! `MergeTrafficPolicy` and `applyTrafficPolicy` apply it: the port's
//! `portLevelSettings` override the rule's top-level parts, a subset's
//! policy overrides those part by part, and the subset's own port-level
//! settings come last; then the load balancer, connection pool and outlier
//! detection go onto the cluster.

use proto::pb::envoy::config::cluster::v3::{
    Cluster, OutlierDetection as EnvoyOutlier, UpstreamConnectionOptions, cluster,
};
use proto::pb::envoy::config::core::v3::{TcpKeepalive, TransportSocket};
use proto::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use proto::pb::envoy::r#type::v3::Percent as EnvoyPercent;

use super::unlimited_breakers;
use crate::model::istio::{
    ConnectionPoolSettings, ConsistentHashLb, LoadBalancerSettings, OutlierDetection,
    PortTrafficPolicy, ProxyProtocol, ProxyProtocolVersion, SimpleLb, Subset, TrafficPolicy,
};
use crate::xds::util::{duration, transport_socket, u32v};

/// The port-level settings of `tp` for `port` over its top-level parts.
fn with_port(tp: &TrafficPolicy, port: u16) -> TrafficPolicy {
    let mut out = TrafficPolicy {
        port_level_settings: Vec::new(),
        ..tp.clone()
    };
    let found = tp
        .port_level_settings
        .iter()
        .find(|p| p.port.as_ref().is_some_and(|s| s.number == u32::from(port)));
    if let Some(PortTrafficPolicy {
        load_balancer,
        connection_pool,
        outlier_detection,
        tls,
        ..
    }) = found
    {
        if load_balancer.is_some() {
            out.load_balancer = load_balancer.clone();
        }
        if connection_pool.is_some() {
            out.connection_pool = connection_pool.clone();
        }
        if outlier_detection.is_some() {
            out.outlier_detection = outlier_detection.clone();
        }
        if tls.is_some() {
            out.tls = tls.clone();
        }
    }
    out
}

/// The policy of the cluster for `port` (and `subset`, if any).
pub fn effective(
    top: Option<&TrafficPolicy>,
    subset: Option<&Subset>,
    port: u16,
) -> Option<TrafficPolicy> {
    let top = top.map(|t| with_port(t, port));
    let Some(sub) = subset.and_then(|s| s.traffic_policy.as_ref()) else {
        return top;
    };
    let sub = with_port(sub, port);
    let Some(t) = top else { return Some(sub) };
    Some(TrafficPolicy {
        load_balancer: sub.load_balancer.or(t.load_balancer),
        connection_pool: sub.connection_pool.or(t.connection_pool),
        outlier_detection: sub.outlier_detection.or(t.outlier_detection),
        tls: sub.tls.or(t.tls),
        port_level_settings: Vec::new(),
        tunnel: sub.tunnel.or(t.tunnel),
        proxy_protocol: sub.proxy_protocol.or(t.proxy_protocol),
    })
}

fn positive(v: Option<i32>) -> Option<u32> {
    v.filter(|v| *v > 0).map(|v| v as u32)
}

/// `loadBalancer`: Istio's default LEAST_REQUEST, the slow-start window
/// (`warmupDurationSecs`) for ROUND_ROBIN and LEAST_REQUEST, and
/// `consistentHash` as Istio's `ApplyRingHashLoadBalancer` sets it.
pub fn apply_load_balancer(c: &mut Cluster, lb: Option<&LoadBalancerSettings>) {
    apply_simple(c, lb);
    if let Some(ch) = lb.and_then(|l| l.consistent_hash.as_ref()) {
        apply_consistent_hash(c, ch);
    }
}

/// MAGLEV (with `maglev.tableSize`), or RING_HASH with
/// `ringHash.minimumRingSize`, else the deprecated top-level
/// `minimumRingSize`, else Envoy's 1024.
fn apply_consistent_hash(c: &mut Cluster, ch: &ConsistentHashLb) {
    let size = |v: u64| Some(proto::pb::google::protobuf::UInt64Value { value: v });
    if let Some(m) = &ch.maglev {
        c.lb_policy = cluster::LbPolicy::Maglev.into();
        c.lb_config = m.table_size.filter(|t| *t != 0).map(|t| {
            cluster::LbConfig::MaglevLbConfig(cluster::MaglevLbConfig {
                table_size: size(t),
            })
        });
    } else if let Some(r) = &ch.ring_hash {
        c.lb_policy = cluster::LbPolicy::RingHash.into();
        c.lb_config = r.minimum_ring_size.filter(|s| *s != 0).map(|s| {
            cluster::LbConfig::RingHashLbConfig(cluster::RingHashLbConfig {
                minimum_ring_size: size(s),
                ..Default::default()
            })
        });
    } else {
        c.lb_policy = cluster::LbPolicy::RingHash.into();
        c.lb_config = Some(cluster::LbConfig::RingHashLbConfig(
            cluster::RingHashLbConfig {
                minimum_ring_size: size(ch.minimum_ring_size.filter(|s| *s != 0).unwrap_or(1024)),
                ..Default::default()
            },
        ));
    }
}

/// `proxyProtocol` as Istio's `applyUpstreamProxyProtocol`: the cluster's
/// transport socket, and each of its transport socket matches, wrapped in
/// Envoy's upstream PROXY protocol socket (plain text wrapped when the
/// cluster has no socket).
pub fn apply_proxy_protocol(c: &mut Cluster, pp: &ProxyProtocol) {
    use proto::pb::envoy::config::core::v3::{ProxyProtocolConfig, proxy_protocol_config};
    use proto::pb::envoy::extensions::transport_sockets::proxy_protocol::v3::ProxyProtocolUpstreamTransport;
    let version = match pp.version {
        ProxyProtocolVersion::V1 => proxy_protocol_config::Version::V1,
        ProxyProtocolVersion::V2 => proxy_protocol_config::Version::V2,
    };
    let wrap = |inner: TransportSocket| {
        transport_socket(
            "envoy.transport_sockets.upstream_proxy_protocol",
            &ProxyProtocolUpstreamTransport {
                config: Some(ProxyProtocolConfig {
                    version: version.into(),
                    ..Default::default()
                }),
                transport_socket: Some(inner),
                ..Default::default()
            },
        )
    };
    if c.transport_socket.is_none() && c.transport_socket_matches.is_empty() {
        c.transport_socket = Some(wrap(transport_socket(
            "envoy.transport_sockets.raw_buffer",
            &RawBuffer {},
        )));
        return;
    }
    if let Some(inner) = c.transport_socket.take() {
        c.transport_socket = Some(wrap(inner));
    }
    for m in &mut c.transport_socket_matches {
        if let Some(inner) = m.transport_socket.take() {
            m.transport_socket = Some(wrap(inner));
        }
    }
}

fn apply_simple(c: &mut Cluster, lb: Option<&LoadBalancerSettings>) {
    let simple = lb.and_then(|l| l.simple);
    let slow_start = lb
        .and_then(|l| l.warmup_duration_secs)
        .map(|w| cluster::SlowStartConfig {
            slow_start_window: Some(duration(w)),
            ..Default::default()
        });
    match simple {
        Some(SimpleLb::RoundRobin) => {
            c.lb_policy = cluster::LbPolicy::RoundRobin.into();
            if let Some(s) = slow_start {
                c.lb_config = Some(cluster::LbConfig::RoundRobinLbConfig(
                    cluster::RoundRobinLbConfig {
                        slow_start_config: Some(s),
                    },
                ));
            }
        }
        Some(SimpleLb::Random) => c.lb_policy = cluster::LbPolicy::Random.into(),
        _ => {
            c.lb_policy = cluster::LbPolicy::LeastRequest.into();
            if let Some(s) = slow_start {
                c.lb_config = Some(cluster::LbConfig::LeastRequestLbConfig(
                    cluster::LeastRequestLbConfig {
                        slow_start_config: Some(s),
                        ..Default::default()
                    },
                ));
            }
        }
    }
}

/// `connectionPool`'s circuit breakers and TCP options (the HTTP options
/// go into the cluster's protocol options, see `super::http_options`).
pub fn apply_connection_pool(c: &mut Cluster, cp: &ConnectionPoolSettings) {
    let t = &mut c
        .circuit_breakers
        .get_or_insert_with(unlimited_breakers)
        .thresholds[0];
    if let Some(v) = cp.tcp.as_ref().and_then(|t| positive(t.max_connections)) {
        t.max_connections = Some(u32v(v));
    }
    if let Some(h) = &cp.http {
        if let Some(v) = positive(h.http1_max_pending_requests) {
            t.max_pending_requests = Some(u32v(v));
        }
        if let Some(v) = positive(h.http2_max_requests) {
            t.max_requests = Some(u32v(v));
        }
        if let Some(v) = positive(h.max_retries) {
            t.max_retries = Some(u32v(v));
        }
    }
    if let Some(ka) = cp.tcp.as_ref().and_then(|t| t.tcp_keepalive.as_ref()) {
        // Envoy counts keepalive times in whole seconds, as Istio sends them.
        let secs = |d: Option<std::time::Duration>| d.map(|d| u32v(d.as_secs() as u32));
        c.upstream_connection_options = Some(UpstreamConnectionOptions {
            tcp_keepalive: Some(TcpKeepalive {
                keepalive_probes: ka.probes.map(u32v),
                keepalive_time: secs(ka.time),
                keepalive_interval: secs(ka.interval),
            }),
            ..Default::default()
        });
    }
}

/// `outlierDetection`, with Istio's enforcement percentages (100 when a
/// threshold is above zero, 0 when it is zero) and `minHealthPercent` as
/// the panic threshold (0 when unset, as Istio's proto default).
pub fn apply_outlier_detection(c: &mut Cluster, od: &OutlierDetection) {
    let enforcing = |v: u32| u32v(if v > 0 { 100 } else { 0 });
    c.outlier_detection = Some(EnvoyOutlier {
        consecutive_5xx: od.consecutive_5xx_errors.map(u32v),
        enforcing_consecutive_5xx: od.consecutive_5xx_errors.map(enforcing),
        consecutive_gateway_failure: od.consecutive_gateway_errors.map(u32v),
        enforcing_consecutive_gateway_failure: od.consecutive_gateway_errors.map(enforcing),
        split_external_local_origin_errors: od.split_external_local_origin_errors == Some(true),
        consecutive_local_origin_failure: od.consecutive_local_origin_failures.map(u32v),
        enforcing_consecutive_local_origin_failure: od
            .consecutive_local_origin_failures
            .map(enforcing),
        interval: od.interval.map(duration),
        base_ejection_time: od.base_ejection_time.map(duration),
        max_ejection_percent: od.max_ejection_percent.map(|v| u32v(v.max(0) as u32)),
        ..Default::default()
    });
    c.common_lb_config
        .get_or_insert_with(Default::default)
        .healthy_panic_threshold = Some(EnvoyPercent {
        value: f64::from(od.min_health_percent.unwrap_or(0).clamp(0, 100)),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::istio::{ClientTlsSettings, PortSelector, TlsMode};

    fn tls(mode: TlsMode) -> Option<ClientTlsSettings> {
        Some(ClientTlsSettings {
            mode,
            ..Default::default()
        })
    }

    #[test]
    fn port_level_then_subset_then_subset_port_level() {
        let top = TrafficPolicy {
            tls: tls(TlsMode::IstioMutual),
            load_balancer: Some(LoadBalancerSettings {
                simple: Some(SimpleLb::Random),
                ..Default::default()
            }),
            port_level_settings: vec![PortTrafficPolicy {
                port: Some(PortSelector { number: 443 }),
                tls: tls(TlsMode::Simple),
                ..Default::default()
            }],
            ..Default::default()
        };
        let p80 = effective(Some(&top), None, 80).unwrap();
        assert_eq!(p80.tls.unwrap().mode, TlsMode::IstioMutual);
        let p443 = effective(Some(&top), None, 443).unwrap();
        assert_eq!(p443.tls.unwrap().mode, TlsMode::Simple);
        assert_eq!(p443.load_balancer.unwrap().simple, Some(SimpleLb::Random));

        let subset = Subset {
            name: "v1".into(),
            traffic_policy: Some(TrafficPolicy {
                tls: tls(TlsMode::Disable),
                port_level_settings: vec![PortTrafficPolicy {
                    port: Some(PortSelector { number: 443 }),
                    tls: tls(TlsMode::Mutual),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let s80 = effective(Some(&top), Some(&subset), 80).unwrap();
        assert_eq!(s80.tls.unwrap().mode, TlsMode::Disable);
        assert_eq!(s80.load_balancer.unwrap().simple, Some(SimpleLb::Random));
        let s443 = effective(Some(&top), Some(&subset), 443).unwrap();
        assert_eq!(s443.tls.unwrap().mode, TlsMode::Mutual);
    }

    #[test]
    fn outlier_detection_enforces_and_sets_the_panic_threshold() {
        let mut c = Cluster::default();
        apply_outlier_detection(
            &mut c,
            &OutlierDetection {
                consecutive_5xx_errors: Some(0),
                consecutive_gateway_errors: Some(3),
                split_external_local_origin_errors: Some(true),
                consecutive_local_origin_failures: Some(2),
                min_health_percent: Some(40),
                ..Default::default()
            },
        );
        let od = c.outlier_detection.unwrap();
        assert_eq!(od.enforcing_consecutive_5xx, Some(u32v(0)));
        assert_eq!(od.enforcing_consecutive_gateway_failure, Some(u32v(100)));
        assert!(od.split_external_local_origin_errors);
        assert_eq!(od.consecutive_local_origin_failure, Some(u32v(2)));
        assert_eq!(
            c.common_lb_config
                .unwrap()
                .healthy_panic_threshold
                .unwrap()
                .value,
            40.0
        );
    }

    fn hashed(yaml: &str) -> Cluster {
        let lb: LoadBalancerSettings = serde_yaml_ng::from_str(yaml).unwrap();
        let mut c = Cluster::default();
        apply_load_balancer(&mut c, Some(&lb));
        c
    }

    #[test]
    fn consistent_hash_picks_ring_hash_or_maglev() {
        let c = hashed("{consistentHash: {httpHeaderName: x-user}}");
        assert_eq!(c.lb_policy, i32::from(cluster::LbPolicy::RingHash));
        assert!(matches!(
            c.lb_config,
            Some(cluster::LbConfig::RingHashLbConfig(ref r)) if r.minimum_ring_size.unwrap().value == 1024
        ));
        let c = hashed("{consistentHash: {useSourceIp: true, minimumRingSize: 64}}");
        assert!(matches!(
            c.lb_config,
            Some(cluster::LbConfig::RingHashLbConfig(ref r)) if r.minimum_ring_size.unwrap().value == 64
        ));
        let c = hashed("{consistentHash: {httpHeaderName: x, ringHash: {minimumRingSize: 2048}}}");
        assert!(matches!(
            c.lb_config,
            Some(cluster::LbConfig::RingHashLbConfig(ref r)) if r.minimum_ring_size.unwrap().value == 2048
        ));
        let c = hashed("{consistentHash: {httpHeaderName: x, maglev: {tableSize: 65537}}}");
        assert_eq!(c.lb_policy, i32::from(cluster::LbPolicy::Maglev));
        assert!(matches!(
            c.lb_config,
            Some(cluster::LbConfig::MaglevLbConfig(ref m)) if m.table_size.unwrap().value == 65537
        ));
        let c = hashed("{consistentHash: {httpHeaderName: x, maglev: {}}}");
        assert_eq!(c.lb_policy, i32::from(cluster::LbPolicy::Maglev));
        assert_eq!(c.lb_config, None);
    }

    #[test]
    fn proxy_protocol_wraps_every_socket() {
        let pp = ProxyProtocol {
            version: ProxyProtocolVersion::V2,
        };
        let mut plain = Cluster::default();
        apply_proxy_protocol(&mut plain, &pp);
        let ts = plain.transport_socket.unwrap();
        assert_eq!(ts.name, "envoy.transport_sockets.upstream_proxy_protocol");
        let mut matched = Cluster {
            transport_socket_matches: vec![cluster::TransportSocketMatch {
                name: "tlsMode-istio".into(),
                transport_socket: Some(transport_socket(
                    "envoy.transport_sockets.raw_buffer",
                    &RawBuffer {},
                )),
                ..Default::default()
            }],
            ..Default::default()
        };
        apply_proxy_protocol(&mut matched, &pp);
        assert!(matched.transport_socket.is_none());
        assert_eq!(
            matched.transport_socket_matches[0]
                .transport_socket
                .as_ref()
                .unwrap()
                .name,
            "envoy.transport_sockets.upstream_proxy_protocol"
        );
    }

    #[test]
    fn warmup_and_keepalive() {
        let mut c = Cluster::default();
        apply_load_balancer(
            &mut c,
            Some(&LoadBalancerSettings {
                simple: Some(SimpleLb::RoundRobin),
                warmup_duration_secs: Some(std::time::Duration::from_secs(30)),
                ..Default::default()
            }),
        );
        assert!(matches!(
            c.lb_config,
            Some(cluster::LbConfig::RoundRobinLbConfig(ref r)) if r.slow_start_config.is_some()
        ));
        apply_connection_pool(
            &mut c,
            &ConnectionPoolSettings {
                tcp: Some(crate::model::istio::TcpSettings {
                    tcp_keepalive: Some(crate::model::istio::TcpKeepalive {
                        probes: Some(3),
                        time: Some(std::time::Duration::from_secs(60)),
                        interval: None,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        let ka = c
            .upstream_connection_options
            .unwrap()
            .tcp_keepalive
            .unwrap();
        assert_eq!(ka.keepalive_probes, Some(u32v(3)));
        assert_eq!(ka.keepalive_time, Some(u32v(60)));
    }
}
