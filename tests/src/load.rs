//! Load for the benchmarks: keep-alive HTTP/1.1 clients, each with one
//! request in flight, over plain TCP or TLS, run from inside a network
//! namespace; their requests per second and latency percentiles.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::netns::Netns;

/// The most requests one round sends, whatever its length.
pub const MAX_REQUESTS: usize = 2_000_000;

/// The machine's load average (1, 5 and 15 minutes), for the record.
pub fn machine_load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `p` quantile (0..=1) of sorted latencies.
pub fn pct(v: &[Duration], p: f64) -> Duration {
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

/// Milliseconds with three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

/// Reads one HTTP/1.1 response with a `content-length`: its status.
pub fn read_response(s: &mut impl Read, buf: &mut Vec<u8>) -> std::io::Result<u16> {
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    buf.drain(..head_end + length);
    Ok(status)
}

/// How a client reaches the server.
#[derive(Clone)]
pub enum Target {
    /// Plain HTTP to this address.
    Plain(SocketAddr),
    /// HTTPS to this address, with this SNI, trusting this configuration.
    Tls(SocketAddr, String, Arc<rustls::ClientConfig>),
}

/// One client connection, plain or TLS.
pub enum Conn {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

impl Target {
    /// Connects (in the caller's network namespace).
    pub fn connect(&self) -> std::io::Result<Conn> {
        let addr = match self {
            Target::Plain(a) | Target::Tls(a, ..) => *a,
        };
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        match self {
            Target::Plain(_) => Ok(Conn::Plain(s)),
            Target::Tls(_, sni, config) => {
                let name = rustls_pki_types::ServerName::try_from(sni.clone())
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
                let conn = rustls::ClientConnection::new(config.clone(), name)
                    .map_err(std::io::Error::other)?;
                Ok(Conn::Tls(Box::new(rustls::StreamOwned::new(conn, s))))
            }
        }
    }
}

/// What one round measured.
pub struct Round {
    /// Answered requests per second.
    pub rps: f64,
    /// Latencies of the answered requests, sorted.
    pub latencies: Vec<Duration>,
    /// Requests answered with another status than 200.
    pub failed: usize,
}

/// One round: `connections` keep-alive clients in `ns` sending
/// `GET <path>` with `Host: <host>` to `target` for `length`.
pub fn round(
    ns: &Netns,
    target: &Target,
    host: &str,
    path: &str,
    connections: usize,
    length: Duration,
) -> Round {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes();
    let threads: Vec<_> = (0..connections)
        .map(|_| {
            let target = target.clone();
            let request = request.clone();
            ns.spawn(move || {
                let mut latencies = Vec::new();
                let mut failed = 0;
                let mut s = target.connect().expect("connect");
                let mut buf = Vec::new();
                let start = Instant::now();
                while start.elapsed() < length && latencies.len() < MAX_REQUESTS / connections {
                    let t = Instant::now();
                    s.write_all(&request).expect("send a request");
                    match read_response(&mut s, &mut buf) {
                        Ok(200) => latencies.push(t.elapsed()),
                        Ok(_) => failed += 1,
                        Err(e) => panic!("connection failed mid-round: {e}"),
                    }
                }
                (latencies, failed, start.elapsed())
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut failed = 0;
    let mut longest = Duration::ZERO;
    for t in threads {
        let (l, f, e) = t.join().expect("a client thread");
        latencies.extend(l);
        failed += f;
        longest = longest.max(e);
    }
    latencies.sort();
    Round {
        rps: latencies.len() as f64 / longest.as_secs_f64(),
        latencies,
        failed,
    }
}

/// [`round`] for `length` after a one-second warm-up on the same path
/// (connections set up, caches filled), which is not counted.
pub fn warm_round(
    ns: &Netns,
    target: &Target,
    host: &str,
    path: &str,
    connections: usize,
    length: Duration,
) -> Round {
    round(ns, target, host, path, connections, Duration::from_secs(1));
    round(ns, target, host, path, connections, length)
}

/// The benchmarks' Markdown table: one row per named round with its
/// requests, failures, rate, p50 and p99, and the rate and p99 as ratios
/// to the round at `base` (`ratio` names that round in the header, as in
/// "÷ static" or "× off").
pub fn table(first: &str, ratio: &str, rows: &[(String, Round)], base: usize) -> String {
    let base_rps = rows[base].1.rps;
    let base_p99 = pct(&rows[base].1.latencies, 0.99).as_secs_f64();
    let mut out = format!(
        "| {first} | requests | failed | requests/s | p50 ms | p99 ms | requests/s {ratio} | p99 {ratio} |\n|---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for (name, r) in rows {
        let p99 = pct(&r.latencies, 0.99);
        out.push_str(&format!(
            "| {name} | {} | {} | {:.0} | {} | {} | {:.2} | {:.2} |\n",
            r.latencies.len(),
            r.failed,
            r.rps,
            ms(pct(&r.latencies, 0.50)),
            ms(p99),
            r.rps / base_rps,
            p99.as_secs_f64() / base_p99
        ));
    }
    out
}
