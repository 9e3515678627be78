//! Istio's standard metrics without Istio's Envoy filters: Envoy streams an
//! access log entry per request and per TCP connection event to the agent
//! ([`als`]), which keeps the `istio_*` families ([`metrics`]) with Istio's
//! labels ([`labels`]) in the registry the status server merges into
//! `/stats/prometheus`.

pub mod als;
pub mod labels;
pub mod metrics;

pub use als::AlsServer;
pub use metrics::StandardMetrics;

#[cfg(test)]
mod tests {
    #[test]
    fn the_access_log_socket_sits_next_to_the_sds_socket() {
        let socket = std::path::Path::new(common::istio_stats::ALS_SOCKET);
        assert_eq!(
            socket.parent(),
            Some(std::path::Path::new(crate::config::SDS_SOCKET_DIR))
        );
    }
}
