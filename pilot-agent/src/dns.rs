//! The agent's DNS proxy (Istio's `pkg/dns/client`): on 127.0.0.1:15053, UDP
//! and TCP, it answers mesh host names (and, for Kubernetes services, their
//! short forms inside the Pod's namespace) from the name table istiod sends
//! over NDS, and forwards every other query to the upstream resolvers of
//! `/etc/resolv.conf`. Messages are parsed with hickory-proto.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use prost::Message as _;
use proto::nds::NameTable;
use proto::pb::google::protobuf::Any;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

/// Istio's answer TTL.
const TTL: u32 = 30;
/// `DNS_FORWARD_TIMEOUT`.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a name table from istiod was not taken (the agent NACKs it).
#[derive(Debug, thiserror::Error)]
pub enum NameTableError {
    /// The resource is not a `NameTable` message.
    #[error("bad NameTable: {0}")]
    Decode(#[from] prost::DecodeError),
}

/// Lower-case name (no trailing dot) to its addresses.
type Names = HashMap<String, Vec<IpAddr>>;

/// The DNS proxy's state: the lookup table and the upstreams.
#[derive(Clone)]
pub struct DnsProxy {
    names: Arc<RwLock<Arc<Names>>>,
    upstreams: Arc<Vec<SocketAddr>>,
    namespace: String,
    ready: Arc<std::sync::Mutex<Option<crate::lifecycle::ReadinessGuard>>>,
}

/// The `nameserver` lines of a resolv.conf, port 53.
pub fn upstreams_from(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|ip| ip.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

fn normalise(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl DnsProxy {
    /// A proxy for a Pod in `namespace`, forwarding to `upstreams`.
    /// `ready` is held until the first name table arrives.
    pub fn new(
        namespace: &str,
        upstreams: Vec<SocketAddr>,
        ready: Option<crate::lifecycle::ReadinessGuard>,
    ) -> Self {
        Self {
            names: Arc::new(RwLock::new(Arc::new(HashMap::new()))),
            upstreams: Arc::new(upstreams),
            namespace: namespace.to_string(),
            ready: Arc::new(std::sync::Mutex::new(ready)),
        }
    }

    /// Takes a name table from istiod (the xDS proxy's NDS handler).
    pub fn update(&self, any: &Any) -> Result<(), NameTableError> {
        let table = NameTable::decode(any.value.as_slice())?;
        let mut names: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (host, info) in &table.table {
            let ips: Vec<IpAddr> = info.ips.iter().filter_map(|ip| ip.parse().ok()).collect();
            let mut hosts = vec![host.clone()];
            hosts.extend(info.alt_hosts.iter().cloned());
            if info.registry == "Kubernetes" && !info.shortname.is_empty() {
                hosts.push(format!("{}.{}", info.shortname, info.namespace));
                hosts.push(format!("{}.{}.svc", info.shortname, info.namespace));
                if info.namespace == self.namespace {
                    hosts.push(info.shortname.clone());
                }
            }
            for h in hosts {
                names.insert(normalise(&h), ips.clone());
            }
        }
        tracing::debug!(target: "dns", "name table updated: {} names", names.len());
        if let Ok(mut n) = self.names.write() {
            *n = Arc::new(names);
        }
        if let Ok(mut r) = self.ready.lock() {
            r.take();
        }
        Ok(())
    }

    fn lookup(&self, name: &str) -> Option<Vec<IpAddr>> {
        self.names.read().ok()?.get(&normalise(name)).cloned()
    }

    /// Answers one query message; `None` means "forward it".
    fn answer(&self, query: &[u8]) -> Result<Option<Vec<u8>>, ResponseCode> {
        let msg = Message::from_vec(query).map_err(|_| ResponseCode::FormErr)?;
        let Some(q) = msg.queries.first() else {
            return Err(ResponseCode::FormErr);
        };
        let Some(ips) = self.lookup(&q.name().to_ascii()) else {
            return Ok(None);
        };
        let mut resp = Message::new(msg.metadata.id, MessageType::Response, OpCode::Query);
        resp.metadata.authoritative = true;
        resp.metadata.recursion_desired = msg.metadata.recursion_desired;
        resp.metadata.recursion_available = true;
        resp.add_query(q.clone());
        for ip in ips {
            let rdata = match (q.query_type(), ip) {
                (RecordType::A, IpAddr::V4(v4)) => RData::A(A(v4)),
                (RecordType::AAAA, IpAddr::V6(v6)) => RData::AAAA(AAAA(v6)),
                _ => continue,
            };
            resp.add_answer(Record::from_rdata(q.name().clone(), TTL, rdata));
        }
        resp.to_vec().map(Some).map_err(|_| ResponseCode::ServFail)
    }

    fn error(query: &[u8], code: ResponseCode) -> Vec<u8> {
        let id = if query.len() >= 2 {
            u16::from_be_bytes([query[0], query[1]])
        } else {
            0
        };
        Message::error_msg(id, OpCode::Query, code)
            .to_vec()
            .unwrap_or_default()
    }

    async fn forward(&self, query: &[u8]) -> Vec<u8> {
        for upstream in self.upstreams.iter() {
            let bind: SocketAddr = if upstream.is_ipv4() {
                "0.0.0.0:0"
            } else {
                "[::]:0"
            }
            .parse()
            .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
            let Ok(sock) = UdpSocket::bind(bind).await else {
                continue;
            };
            if sock.send_to(query, upstream).await.is_err() {
                continue;
            }
            let mut buf = vec![0u8; 65535];
            if let Ok(Ok((n, _))) =
                tokio::time::timeout(FORWARD_TIMEOUT, sock.recv_from(&mut buf)).await
            {
                buf.truncate(n);
                return buf;
            }
            tracing::debug!(target: "dns", "upstream {upstream} did not answer");
        }
        Self::error(query, ResponseCode::ServFail)
    }

    /// The response for one query when it is answered here (from the name
    /// table, or an error for a malformed one); `None`: for the upstream.
    /// The fuzz entry points drive the parser through it.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn handle_locally(&self, query: &[u8]) -> Option<Vec<u8>> {
        match self.answer(query) {
            Ok(resp) => resp,
            Err(code) => Some(Self::error(query, code)),
        }
    }

    /// The response for one query.
    pub async fn handle(&self, query: &[u8]) -> Vec<u8> {
        match self.answer(query) {
            Ok(Some(resp)) => resp,
            Ok(None) => self.forward(query).await,
            Err(code) => Self::error(query, code),
        }
    }

    /// Serves UDP queries.
    pub async fn serve_udp(self, socket: UdpSocket) {
        let socket = Arc::new(socket);
        let mut buf = vec![0u8; 65535];
        loop {
            let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                continue;
            };
            let query = buf[..n].to_vec();
            let this = self.clone();
            let socket = socket.clone();
            tokio::spawn(async move {
                let resp = this.handle(&query).await;
                let _ = socket.send_to(&resp, peer).await;
            });
        }
    }

    /// Serves TCP queries (two-byte length prefix).
    pub async fn serve_tcp(self, listener: TcpListener) {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                continue;
            };
            let this = self.clone();
            tokio::spawn(async move {
                loop {
                    let mut len = [0u8; 2];
                    if conn.read_exact(&mut len).await.is_err() {
                        return;
                    }
                    let mut query = vec![0u8; u16::from_be_bytes(len) as usize];
                    if conn.read_exact(&mut query).await.is_err() {
                        return;
                    }
                    let resp = this.handle(&query).await;
                    let mut out = (resp.len() as u16).to_be_bytes().to_vec();
                    out.extend_from_slice(&resp);
                    if conn.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;
    use proto::nds::name_table::NameInfo;

    fn table() -> Any {
        let mut t = NameTable::default();
        t.table.insert(
            "httpbin.demo.svc.cluster.local".into(),
            NameInfo {
                ips: vec!["10.96.0.20".into()],
                registry: "Kubernetes".into(),
                shortname: "httpbin".into(),
                namespace: "demo".into(),
                alt_hosts: vec![],
            },
        );
        t.table.insert(
            "api.example.com".into(),
            NameInfo {
                ips: vec!["192.0.2.7".into()],
                ..Default::default()
            },
        );
        Any {
            type_url: String::new(),
            value: t.encode_to_vec(),
        }
    }

    fn query(name: &str, t: RecordType) -> Vec<u8> {
        let mut m = Message::query();
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m.to_vec().unwrap()
    }

    fn answers(resp: &[u8]) -> Vec<String> {
        Message::from_vec(resp)
            .unwrap()
            .answers
            .iter()
            .map(|r| r.data.to_string())
            .collect()
    }

    #[tokio::test]
    async fn answers_mesh_names_and_short_forms_in_the_namespace() {
        let dns = DnsProxy::new("demo", vec![], None);
        dns.update(&table()).unwrap();
        for name in [
            "httpbin.demo.svc.cluster.local.",
            "httpbin.demo.svc.",
            "httpbin.demo.",
            "httpbin.",
            "HTTPBIN.",
        ] {
            assert_eq!(
                answers(&dns.handle(&query(name, RecordType::A)).await),
                ["10.96.0.20"],
                "{name}"
            );
        }
        assert_eq!(
            answers(&dns.handle(&query("api.example.com.", RecordType::A)).await),
            ["192.0.2.7"]
        );
        // An A-only host has no AAAA answer: empty NOERROR.
        let resp =
            Message::from_vec(&dns.handle(&query("httpbin.", RecordType::AAAA)).await).unwrap();
        assert!(resp.answers.is_empty());
        assert_eq!(resp.metadata.response_code, ResponseCode::NoError);
        // Short names only inside the Pod's namespace.
        let other = DnsProxy::new("default", vec![], None);
        other.update(&table()).unwrap();
        let resp =
            Message::from_vec(&other.handle(&query("httpbin.", RecordType::A)).await).unwrap();
        assert_eq!(
            resp.metadata.response_code,
            ResponseCode::ServFail,
            "no upstream to forward to"
        );
    }

    #[test]
    fn reads_resolv_conf() {
        assert_eq!(
            upstreams_from("search x\nnameserver 10.0.0.10\nnameserver fd00::a\noptions ndots:5\n"),
            vec![
                "10.0.0.10:53".parse().unwrap(),
                "[fd00::a]:53".parse().unwrap()
            ]
        );
    }
}
