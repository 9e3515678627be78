//! A client of istiod's debug types over ADS, as `istioctl proxy-status`
//! uses them: one state-of-the-world request of `istio.io/debug/syncz` (or
//! `istio.io/debug/config_dump`), its answer read as Envoy CSDS
//! `ClientConfig`s and printed as istioctl's table.

use std::time::Duration;

use common::xds::{CLIENT_CONFIG_TYPE, DEBUG_SYNCZ_TYPE};
use prost::Message;
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use proto::pb::envoy::service::status::v3::ClientConfig;
use tokio_stream::wrappers::ReceiverStream;

/// Why a debug request or its answer failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyStatusError {
    /// istiod refused the stream or the request.
    #[error("istiod: {0}")]
    Status(#[from] tonic::Status),
    /// No answer in time.
    #[error("no answer from istiod within {0:?}")]
    Timeout(Duration),
    /// The stream ended without an answer.
    #[error("the stream ended without an answer")]
    Ended,
    /// A resource of the answer does not decode.
    #[error("cannot decode a {type_url} resource: {source}")]
    Decode {
        /// Its type.
        type_url: String,
        /// The decoder's error.
        source: prost::DecodeError,
    },
}

/// The node a debug client sends (istioctl's: a node of its namespace,
/// without `PROXY_CONFIG`, so istiod does not take it for a proxy).
pub fn debug_node(namespace: &str, service_account: &str) -> Node {
    let meta = common::NodeMetadata {
        namespace: Some(namespace.into()),
        service_account: Some(service_account.into()),
        generator: Some("event".into()),
        ..Default::default()
    };
    Node {
        id: format!("sidecar~127.0.0.1~istioctl.{namespace}~{namespace}.svc.cluster.local"),
        metadata: Some(meta.to_struct()),
        ..Default::default()
    }
}

/// Sends one request of `type_url` for `names` on a new stream and returns
/// the first answer.
pub async fn request(
    channel: tonic::transport::Channel,
    node: Node,
    type_url: &str,
    names: &[&str],
) -> Result<DiscoveryResponse, ProxyStatusError> {
    let limit = Duration::from_secs(10);
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let req = DiscoveryRequest {
        node: Some(node),
        type_url: type_url.into(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    };
    tx.send(req).await.map_err(|_| ProxyStatusError::Ended)?;
    let call = client.stream_aggregated_resources(ReceiverStream::new(rx));
    let mut stream = tokio::time::timeout(limit, call)
        .await
        .map_err(|_| ProxyStatusError::Timeout(limit))??
        .into_inner();
    let answer = tokio::time::timeout(limit, stream.message())
        .await
        .map_err(|_| ProxyStatusError::Timeout(limit))??;
    drop(tx);
    answer.ok_or(ProxyStatusError::Ended)
}

/// The `istio.io/debug/syncz` answer.
pub async fn syncz(
    channel: tonic::transport::Channel,
    node: Node,
) -> Result<DiscoveryResponse, ProxyStatusError> {
    request(channel, node, DEBUG_SYNCZ_TYPE, &[]).await
}

/// The answer's `ClientConfig`s.
pub fn client_configs(r: &DiscoveryResponse) -> Result<Vec<ClientConfig>, ProxyStatusError> {
    r.resources
        .iter()
        .filter(|a| a.type_url == CLIENT_CONFIG_TYPE)
        .map(|a| {
            ClientConfig::decode(a.value.as_slice()).map_err(|source| ProxyStatusError::Decode {
                type_url: a.type_url.clone(),
                source,
            })
        })
        .collect()
}

/// One line of `istioctl proxy-status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The proxy ID (`<pod>.<namespace>`).
    pub name: String,
    /// Its cluster ID.
    pub cluster: String,
    /// CDS state (`SYNCED`, `NOT_SENT`, `STALE`, ...).
    pub cds: String,
    /// LDS state.
    pub lds: String,
    /// EDS state.
    pub eds: String,
    /// RDS state.
    pub rds: String,
    /// ECDS state.
    pub ecds: String,
    /// The answering istiod's ID.
    pub istiod: String,
    /// Its version.
    pub version: String,
}

/// The rows of a syncz answer, by proxy ID (istioctl's `setupStatusPrint`).
pub fn rows(r: &DiscoveryResponse) -> Result<Vec<Row>, ProxyStatusError> {
    let cp: serde_json::Value = r
        .control_plane
        .as_ref()
        .and_then(|c| serde_json::from_str(&c.identifier).ok())
        .unwrap_or_else(|| serde_json::json!({"ID": "MISSING", "Info": {"version": "MISSING"}}));
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    let mut rows: Vec<Row> = client_configs(r)?
        .into_iter()
        .map(|cc| {
            let node = cc.node.clone().unwrap_or_default();
            let meta = node
                .metadata
                .as_ref()
                .map(common::NodeMetadata::from_struct)
                .unwrap_or_default();
            let state = |t: &str| {
                cc.generic_xds_configs
                    .iter()
                    .find(|g| g.type_url == t)
                    .map(|g| g.config_status().as_str_name().to_string())
                    .unwrap_or_default()
            };
            Row {
                name: node.id,
                cluster: meta.cluster_id.unwrap_or_default(),
                cds: state(common::xds::CLUSTER_TYPE),
                lds: state(common::xds::LISTENER_TYPE),
                eds: state(common::xds::ENDPOINT_TYPE),
                rds: state(common::xds::ROUTE_TYPE),
                ecds: state(common::xds::EXTENSION_CONFIGURATION_TYPE),
                istiod: text(&cp["ID"]),
                version: text(&cp["Info"]["version"]),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(rows)
}

/// The rows as istioctl's table (columns padded, three spaces apart).
pub fn table(rows: &[Row]) -> String {
    let head = [
        "NAME", "CLUSTER", "CDS", "LDS", "EDS", "RDS", "ECDS", "ISTIOD", "VERSION",
    ];
    let cells: Vec<[&str; 9]> = rows
        .iter()
        .map(|r| {
            [
                &r.name, &r.cluster, &r.cds, &r.lds, &r.eds, &r.rds, &r.ecds, &r.istiod, &r.version,
            ]
            .map(String::as_str)
        })
        .collect();
    let widths: Vec<usize> = (0..head.len())
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].len())
                .chain([head[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in std::iter::once(head).chain(cells) {
        let padded: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(padded.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::config::core::v3::ControlPlane;
    use proto::pb::envoy::service::status::v3::ConfigStatus;
    use proto::pb::envoy::service::status::v3::client_config::GenericXdsConfig;

    #[test]
    fn rows_read_each_type_and_the_control_plane_and_print_as_a_table() {
        let cc = ClientConfig {
            node: Some(Node {
                id: "sleep-1.demo".into(),
                metadata: Some(
                    common::NodeMetadata {
                        cluster_id: Some("Kubernetes".into()),
                        ..Default::default()
                    }
                    .to_struct(),
                ),
                ..Default::default()
            }),
            generic_xds_configs: [
                (common::xds::CLUSTER_TYPE, ConfigStatus::Synced),
                (common::xds::LISTENER_TYPE, ConfigStatus::Stale),
                (common::xds::ENDPOINT_TYPE, ConfigStatus::NotSent),
            ]
            .into_iter()
            .map(|(t, s)| GenericXdsConfig {
                type_url: t.into(),
                config_status: s as i32,
                ..Default::default()
            })
            .collect(),
            ..Default::default()
        };
        let r = DiscoveryResponse {
            resources: vec![crate::ads::any(&cc)],
            control_plane: Some(ControlPlane {
                identifier: r#"{"Component":"istiod","ID":"istiod-1","Info":{"version":"0.1.0"}}"#
                    .into(),
            }),
            ..Default::default()
        };
        let rows = rows(&r).unwrap();
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(
            (row.cds.as_str(), row.lds.as_str(), row.eds.as_str()),
            ("SYNCED", "STALE", "NOT_SENT")
        );
        assert_eq!(
            (row.istiod.as_str(), row.version.as_str()),
            ("istiod-1", "0.1.0")
        );
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAME           CLUSTER"), "{t}");
        assert!(
            lines[1].starts_with("sleep-1.demo   Kubernetes   SYNCED"),
            "{t}"
        );
    }
}
