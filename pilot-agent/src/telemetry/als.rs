//! The gRPC access log service Envoy streams its standard-metrics entries
//! to (`envoy.service.accesslog.v3.AccessLogService`), on a Unix socket
//! next to the SDS one. Each stream names its log in its first message;
//! the log name says which reporter the entries are for.

use std::sync::Arc;

use common::istio_stats::Reporter;
use proto::pb::envoy::service::accesslog::v3::access_log_service_server::{
    AccessLogService, AccessLogServiceServer,
};
use proto::pb::envoy::service::accesslog::v3::stream_access_logs_message::LogEntries;
use proto::pb::envoy::service::accesslog::v3::{StreamAccessLogsMessage, StreamAccessLogsResponse};
use tonic::{Request, Response, Status, Streaming};

use super::metrics::StandardMetrics;

/// The access log service feeding [`StandardMetrics`].
pub struct AlsServer {
    metrics: Arc<StandardMetrics>,
}

impl AlsServer {
    /// A server recording into `metrics`.
    pub fn new(metrics: Arc<StandardMetrics>) -> Self {
        Self { metrics }
    }

    /// The tonic service.
    pub fn into_service(self) -> AccessLogServiceServer<Self> {
        AccessLogServiceServer::new(self)
    }

    /// Records one message's entries for `reporter`.
    pub fn record(&self, reporter: Reporter, message: &StreamAccessLogsMessage) {
        match &message.log_entries {
            Some(LogEntries::HttpLogs(logs)) => {
                for e in &logs.log_entry {
                    self.metrics.record_http(reporter, e);
                }
            }
            Some(LogEntries::TcpLogs(logs)) => {
                for e in &logs.log_entry {
                    self.metrics.record_tcp(reporter, e);
                }
            }
            None => {}
        }
    }
}

#[tonic::async_trait]
impl AccessLogService for AlsServer {
    async fn stream_access_logs(
        &self,
        request: Request<Streaming<StreamAccessLogsMessage>>,
    ) -> Result<Response<StreamAccessLogsResponse>, Status> {
        let mut stream = request.into_inner();
        let mut reporter: Option<Reporter> = None;
        while let Some(message) = stream.message().await? {
            if let Some(id) = &message.identifier {
                reporter = Reporter::from_log_name(&id.log_name);
                if reporter.is_none() {
                    tracing::warn!(target: "telemetry", "ignoring access log {:?}: not a standard metrics log", id.log_name);
                }
            }
            if let Some(r) = reporter {
                self.record(r, &message);
            }
        }
        Ok(Response::new(StreamAccessLogsResponse {}))
    }
}
